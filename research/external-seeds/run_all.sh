#!/usr/bin/env bash
# The whole exploratory run, two processes at a time (research/explore-external-seeds.md).
#   slot A: the stronger run (360 steps, seed 100) -> its traces -> seeded arms, seeds 0 and 1
#   slot B: warm-model scores (seeds 0-2) -> on-policy arms, seeds 0-2 -> seeded arm, seed 2 (after the traces)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
export OMP_NUM_THREADS=1
STRONG_STEPS=${STRONG_STEPS:-360} STEPS=${STEPS:-120}
SEEDED=(--seed_method seeds --prefix_mode state --seed_dataset "$here/traces.jsonl" --seed_filter success
        --seed_fraction 0.5 --cut_ratio_min 0.1 --cut_ratio_max 0.3)
mkdir -p results logs
stamp() { echo "$(date -u +%H:%M:%S) $*" | tee -a logs/schedule.log; }

slot_a() {
  stamp "A: stronger run"
  ./train_one.sh stronger-seed100 100 "$STRONG_STEPS" --seed_method none
  stamp "A: traces"
  python traces.py runs/stronger-seed100 train.jsonl traces.jsonl 8 7 > logs/traces.log 2>&1
  touch logs/traces.ready
  for s in 0 1; do stamp "A: seeded seed $s"; ./train_one.sh seeded-seed$s $s "$STEPS" "${SEEDED[@]}"; done
  stamp "A: done"
}

slot_b() {
  for s in 0 1 2; do
    stamp "B: warm model, seed $s"
    python evaluate.py warm heldout.jsonl $s results/warm-seed$s.json > logs/warm-seed$s.eval.log 2>&1
  done
  for s in 0 1 2; do stamp "B: on-policy seed $s"; ./train_one.sh onpolicy-seed$s $s "$STEPS" --seed_method none; done
  while [ ! -f logs/traces.ready ]; do sleep 10; done
  stamp "B: seeded seed 2"; ./train_one.sh seeded-seed2 2 "$STEPS" "${SEEDED[@]}"
  stamp "B: done"
}

rm -f logs/traces.ready
stamp "start (stronger $STRONG_STEPS steps, arms $STEPS steps)"
slot_a & a=$!
slot_b & b=$!
wait $a; wait $b
stamp "all done"
