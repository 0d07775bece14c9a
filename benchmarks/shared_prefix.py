"""The training pass with and without the shared-prefix forward, on SmolLM2-135M-Instruct with the recipe's LoRA.

One micro-batch laid out as the real-model recipe's (`recipes/smollm2-135m_chat-add_lora.yaml`: chat-add prompts,
groups of 4, 32-token completions; `--long`: a 200-token prompt, groups of 8, 128-token completions) is scored with
gradient (TRL's loss forward and backward, through `SeedGRPOTrainer._get_per_token_logps_and_entropies`) with
`shared_prefix` on and off, the two interleaved in alternating order each round, at `seed_fraction` 0, 0.5 and 1
(seeded groups share a prefix of half the completion). Reports the CPU seconds of each, their per-round ratio, the
share of tokens the packed forward computes, the peak RSS growth of each, and the largest log-prob difference.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import torch


def _trainer(tmp: str):
    from datasets import Dataset
    from peft import LoraConfig

    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer, smollm2_135m_instruct

    args = SeedGRPOConfig(
        output_dir=tmp, per_device_train_batch_size=4, num_generations=4, max_completion_length=32, report_to=[],
        use_cpu=True, max_steps=1, seed_fraction=0.0, save_strategy="no",
    )  # fmt: skip
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    return SeedGRPOTrainer(
        model=smollm2_135m_instruct(),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["hi"] * 8}),
        peft_config=lora,
    )


def _batch(trainer, groups: int, group_size: int, prompt_tokens: int, completion: int, seeded: int, seed: int):
    """`groups` prompts of about `prompt_tokens` tokens (chat-add's, or longer), each repeated `group_size` times,
    left-padded; the first `seeded` groups' rows share a prefix of `completion // 2` tokens."""
    from ts_trl.embedded.chat_add import ChatAddTask

    g = torch.Generator().manual_seed(seed)
    tokenizer = trainer.processing_class
    prompts = ChatAddTask().make_splits(groups, 1)[0]["prompt"]
    rows = []
    for prompt in prompts:
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        while prompt_tokens and len(ids) < prompt_tokens:  # the long setting: the question repeated as context
            ids = ids[:-5] + ids
        rows.append(ids[-prompt_tokens:] if prompt_tokens else ids)
    width = max(len(r) for r in rows)
    vocab = trainer.model.config.vocab_size
    ids, mask = [], []
    for index, prompt in enumerate(rows):
        prefix = torch.randint(100, vocab, (completion // 2,), generator=g)
        for _ in range(group_size):
            tokens = torch.randint(100, vocab, (completion,), generator=g)
            if index < seeded:
                tokens[: completion // 2] = prefix
            ids.append(
                torch.cat([torch.full((width - len(prompt),), tokenizer.pad_token_id), torch.tensor(prompt), tokens])
            )
            mask.append(torch.cat([torch.zeros(width - len(prompt)), torch.ones(len(prompt) + completion)]))
    return torch.stack(ids), torch.stack(mask).long(), completion


def _pass(trainer, ids, mask, completion, shared: bool):
    trainer.args.shared_prefix = shared
    model = trainer.model
    model.zero_grad()
    start = time.process_time()
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
        model, ids, mask, completion, compute_entropy=True
    )
    logps.sum().backward()
    return time.process_time() - start, logps.detach()


def run(long: bool, rounds: int) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        trainer = _trainer(tmp)
        trainer.model.train()
        shape = (
            dict(groups=2, group_size=8, prompt_tokens=200, completion=128)
            if long
            else dict(groups=4, group_size=4, prompt_tokens=0, completion=32)
        )
        results = {}
        for fraction in (0.0, 0.5, 1.0):
            seeded = round(fraction * shape["groups"])
            ids, mask, completion = _batch(trainer, seeded=seeded, seed=1, **shape)
            times, diffs = {True: [], False: []}, []
            for r in range(rounds + 1):  # the first round warms up
                order = (True, False) if r % 2 else (False, True)
                out = {}
                for shared in order:
                    seconds, out[shared] = _pass(trainer, ids, mask, completion, shared)
                    if r:
                        times[shared].append(seconds)
                diffs.append((out[True] - out[False]).abs().max().item())
            ratios = [a / b for a, b in zip(times[True], times[False])]
            share = trainer._metrics["train"]["shared_prefix/token_share"][-1]
            results[f"seed_fraction={fraction}"] = {
                "rows": ids.shape[0],
                "width": ids.shape[1],
                "real_prompt_tokens": int(mask[:, :-completion].sum() / ids.shape[0]),
                "cpu_s_shared": sorted(times[True])[len(ratios) // 2],
                "cpu_s_unshared": sorted(times[False])[len(ratios) // 2],
                "cpu_ratio_median": sorted(ratios)[len(ratios) // 2],
                "cpu_ratios": ratios,
                "token_share": share,
                "max_logp_diff": max(diffs),
            }
        results["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return results


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    rounds = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--rounds=")), 4))
    print(json.dumps(run(long="--long" in sys.argv, rounds=rounds), indent=1))
