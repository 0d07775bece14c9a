"""Writes the shared starting point of every run: the chain task's warm model (task seed 0, warm-up seed 0, 700 steps,
as `ts_trl compare --task chain` builds it) and its training (192) and held-out (256) prompts as .jsonl."""

import sys
from pathlib import Path

from ts_trl.embedded.tasks import build_task_model, make_task

out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
task = make_task("chain", seed=0)
model, tokenizer = build_task_model("chain", task, warmup_steps=700, progress=False)
model.save_pretrained(out / "warm")
tokenizer.save_pretrained(out / "warm")
train, held_out = task.make_splits(192, 256)
train.to_json(out / "train.jsonl")
held_out.to_json(out / "heldout.jsonl")
print("done", len(train), len(held_out))
