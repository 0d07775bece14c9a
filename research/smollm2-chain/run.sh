#!/bin/bash
# The runs of research/prereg-smollm2-chain.md: for each RNG seed, the on-policy arm, the probe-picked seeded arm and
# the paper's arm side by side, one torch thread each, so that all three see the same load. From the repository root of
# a checkout of the runs' commit (3d0eb34, the protocol's addendum), with this script copied there:
#   bash research/smollm2-chain/run.sh [SEED ...]      (default: 0 1 2 3 4 5 6 7)
# Each run writes research/smollm2-chain/runs/{none,seeds,paper}-seedN and its log beside it; its raw data (.gitignore)
# is then committed on main. A run cut off by a session's end is started again by the same command: it resumes from
# its last checkpoint (save_steps 20).
set -u
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
STEPS=80  # fixed by the pilot (the protocol's section "Steps"; research/smollm2-chain/pilot_steps.py)
runs=research/smollm2-chain/runs
mkdir -p "$runs"
for seed in ${@:-0 1 2 3 4 5 6 7}; do
  for arm in none seeds paper; do
    out="$runs/$arm-seed$seed"
    method=seeds && [ "$arm" = none ] && method=none
    args=(--config smollm2-135m_chat-chain_lora --seed_method "$method" --seed "$seed" --max_steps "$STEPS"
          --embedded_eval_problems 56 --embedded_eval_samples 4 --embedded_eval_every 20 --save_steps 20
          --output_dir "$out")
    [ "$arm" = seeds ] && args+=(--seed_selection success --cut_ratio_max 0.5)  # the probe's pick
    # paper: the recipe as shipped (uniform seed selection, r ~ U[0.1, 0.9])
    last="$(ls -d "$out"/checkpoint-* 2>/dev/null | sort -t- -k2 -n | tail -n 1)"
    [ -n "$last" ] && args+=(--resume_from_checkpoint "$last")
    ts_trl train "${args[@]}" >> "$out.log" 2>&1 &
  done
  wait
done
