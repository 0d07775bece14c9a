"""Samples the stronger run's final model on the training prompts and writes every sample as a plain-text trace.

    python research/external-seeds/traces.py MODEL_DIR train.jsonl traces.jsonl [samples_per_prompt] [seed]

Each line is {"prompt": ..., "completion": ...}: text only (no token ids, no prompt_id, no reward), so a run that
seeds from it reads it as a trace dataset: matched by prompt text, scored by its own reward (seed_filter="success"),
re-tokenised and cut at text boundaries. Failed samples are written too; the filter is what removes them.
"""

import json
import sys
from pathlib import Path

from datasets import load_dataset
from transformers import AutoModelForCausalLM

from ts_trl.embedded.evaluate import sample_rewards
from ts_trl.embedded.tasks import task_spec
from ts_trl.tiny import load_tokenizer

model_dir, train_path, out_path = sys.argv[1:4]
samples = int(sys.argv[4]) if len(sys.argv) > 4 else 4
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 7
model = AutoModelForCausalLM.from_pretrained(model_dir)
tokenizer = load_tokenizer(model_dir)
train = load_dataset("json", data_files=train_path, split="train")
reward_fn = task_spec("chain").reward
rows = []


def capture(prompts, completions, **columns):
    scores = reward_fn(prompts=prompts, completions=completions, **columns)
    rows.extend(zip(prompts, completions, scores))
    return scores


sample_rewards(model, tokenizer, train, capture, 72, batch_size=256, num_samples=samples, seed=seed)
with open(out_path, "w") as f:
    for prompt, completion, _ in rows:
        f.write(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
passed = sum(score is not None and score >= 1.0 for *_, score in rows)
summary = {
    "traces": len(rows),
    "successful_by_task_reward": passed,
    "samples_per_prompt": samples,
    "seed": seed,
    "model": model_dir,
}
Path(out_path).with_suffix(".summary.json").write_text(json.dumps(summary, indent=1))
print(summary)
