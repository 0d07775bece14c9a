"""Held-out pass@1 and pass@8 of one model: 256 held-out chain prompts x 8 samples at temperature 1, 72 tokens.

    python research/external-seeds/evaluate.py MODEL_DIR heldout.jsonl RNG_SEED OUT.json

Sampling seed 1000 + RNG_SEED, batch 256: at a given RNG seed both arms (and the warm model) see the same sampling
noise (common random numbers), as `ts_trl compare` does. No prefix: every sample starts from the prompt alone.
"""

import json
import sys
import time

from datasets import load_dataset
from transformers import AutoModelForCausalLM

from ts_trl.embedded.evaluate import pass_at_k, sample_rewards
from ts_trl.embedded.tasks import task_spec
from ts_trl.tiny import load_tokenizer

model_dir, heldout_path, rng_seed, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
started = time.time()
model = AutoModelForCausalLM.from_pretrained(model_dir)
tokenizer = load_tokenizer(model_dir)
heldout = load_dataset("json", data_files=heldout_path, split="train")
rewards = sample_rewards(
    model, tokenizer, heldout, task_spec("chain").reward, 72, batch_size=256, num_samples=8, seed=1000 + rng_seed
)
result = {
    "model": model_dir,
    "rng_seed": rng_seed,
    "prompts": len(rewards),
    "samples": 8,
    "pass_at_1": pass_at_k(rewards, 1),
    "pass_at_8": pass_at_k(rewards, 8),
    "passes_per_prompt": [sum(r >= 1.0 for r in s) for s in rewards],
    "eval_wall_s": round(time.time() - started, 1),
}
with open(out, "w") as f:
    json.dump(result, f)
print({k: v for k, v in result.items() if k != "passes_per_prompt"})
