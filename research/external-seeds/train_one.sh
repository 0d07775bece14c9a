#!/usr/bin/env bash
# One training run through the CLI, then its held-out evaluation.
#   train_one.sh NAME RNG_SEED STEPS [extra ts_trl train flags...]
# Every run starts from the same warm model (warm/) on the same 192 training prompts (train.jsonl); only the RNG seed
# and the arm's flags differ. Writes runs/NAME/ (model, logs; ignored by git) and results/NAME.json (held-out scores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=$1 seed=$2 steps=$3
shift 3
mkdir -p "$here/runs" "$here/results" "$here/logs"
start=$(date +%s)
python -m ts_trl train --task chain \
  --model_name_or_path "$here/warm" --dataset_path "$here/train.jsonl" --reward_funcs embedded \
  --use_cpu true --bf16 false --activation_checkpointing false \
  --learning_rate 1e-4 --lr_scheduler_type constant --per_device_train_batch_size 128 --num_generations 8 \
  --max_completion_length 72 --temperature 1.0 --beta 0.0 --max_steps "$steps" \
  --save_strategy no --logging_steps 1 --report_to none --disable_tqdm true \
  --seed "$seed" --output_dir "$here/runs/$name" "$@" > "$here/logs/$name.train.log" 2>&1
end=$(date +%s)
python "$here/evaluate.py" "$here/runs/$name" "$here/heldout.jsonl" "$seed" "$here/results/$name.json" \
  > "$here/logs/$name.eval.log" 2>&1
python - "$here/results/$name.json" "$((end - start))" "$steps" <<'PY'
import json, sys
path, wall, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
d = json.load(open(path)); d["train_wall_s"] = wall; d["steps"] = steps
json.dump(d, open(path, "w"))
PY
echo "$name done: train $((end - start)) s"
