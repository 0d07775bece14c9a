#!/bin/bash
# The six runs of research/prereg-smollm2.md: for each RNG seed, the on-policy and the seeded arm side by side, one
# torch thread each, so that both see the same load. `bash research/smollm2/run.sh [SEED ...]` (default 0 1 2), from
# the repository root; each run writes research/smollm2/runs/{none,seeds}-seedN and its log beside it.
set -u
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
runs=research/smollm2/runs
mkdir -p "$runs"
for seed in ${@:-0 1 2}; do
  for arm in none seeds; do
    ts_trl train --config smollm2-135m_chat-add_lora --seed_method "$arm" --seed "$seed" \
      --max_steps 40 --embedded_eval_problems 56 --embedded_eval_samples 4 --embedded_eval_every 10 \
      --output_dir "$runs/$arm-seed$seed" > "$runs/$arm-seed$seed.log" 2>&1 &
  done
  wait
done
