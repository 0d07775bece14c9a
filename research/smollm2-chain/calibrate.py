"""Calibration of the chat-chain task on the untrained SmolLM2-135M-Instruct: pass@1 at temperature 1, lines per reply
and replies that run past the budget, per wording.

    python research/smollm2-chain/calibrate.py [--prompts 24] [--samples 4] [--budget 96] [--wordings 0 1 2]

Samples each wording's first `--prompts` training prompts `--samples` times each, at temperature 1 without top-k or
top-p (as GRPO samples them), with `--budget` new tokens, and prints per wording: pass@1 (the task's reward), the share
of replies with 3 or more non-empty lines, the share that ended without EOS within the budget (overrun), and the
95th percentile of reply length in tokens (so a budget can be set that seeded rows, prefix plus continuation, do not
overrun). Writes the per-reply rows to `calibration_replies.csv` beside this script, and the table to stdout.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
import torch

from ts_trl.analysis.common import load_checkpoint, prompt_token_ids, quiet_libraries, sample_continuations
from ts_trl.embedded.chat_chain import WORDINGS, ChatChainTask, chat_chain_reward

HERE = Path(__file__).resolve().parent
GATE = (0.15, 0.6)  # the window for untrained pass@1 at temperature 1


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--budget", type=int, default=96)
    parser.add_argument("--wordings", type=int, nargs="+", default=list(range(len(WORDINGS))))
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 4], help="How many numbers a problem adds.")
    parser.add_argument("--max-operand", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=HERE / "calibration_replies.csv")
    args = parser.parse_args(argv)
    quiet_libraries()
    torch.set_num_threads(1)
    model, tokenizer = load_checkpoint("smollm2-135m-instruct", "model")
    eos = tokenizer.eos_token_id
    rows, table = [], []
    for wording in args.wordings:
        data = (
            ChatChainTask(wording=wording, sizes=tuple(args.sizes), max_operand=args.max_operand)
            .make_splits(args.prompts, 1)[0]
            .to_list()
        )
        owners = [i for i in range(len(data)) for _ in range(args.samples)]
        prompts = [prompt_token_ids(tokenizer, data[i]["prompt"]) for i in owners]
        samples = sample_continuations(
            model, tokenizer, prompts, [args.budget] * len(owners), args.seed, desc=f"wording {wording}"
        )
        texts = tokenizer.batch_decode(samples, skip_special_tokens=True)
        rewards = chat_chain_reward(texts, [data[i]["answer"] for i in owners])
        for i, ids, text, reward in zip(owners, samples, texts, rewards):
            rows.append(
                {
                    "wording": wording,
                    "prompt_index": i,
                    "answer": data[i]["answer"],
                    "reward": reward,
                    "tokens": len(ids),
                    "ended": int(eos in ids),
                    "lines": sum(1 for line in text.splitlines() if line.strip()),
                    "reply": text,
                }
            )
        mine = [r for r in rows if r["wording"] == wording]
        table.append(
            {
                "wording": wording,
                "pass@1": float(np.mean([r["reward"] for r in mine])),
                "3+ lines": float(np.mean([r["lines"] >= 3 for r in mine])),
                "overrun": float(np.mean([not r["ended"] for r in mine])),
                "tokens p50": float(np.percentile([r["tokens"] for r in mine], 50)),
                "tokens p95": float(np.percentile([r["tokens"] for r in mine], 95)),
            }
        )
    with open(args.output, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(
        f"chat-chain calibration, untrained SmolLM2-135M-Instruct: {args.prompts} training prompts x {args.samples} "
        f"samples, temperature 1, budget {args.budget} tokens, sampling seed {args.seed}, {args.sizes} numbers "
        f"from 1-{args.max_operand}\n"
    )
    print("| wording | question | pass@1 | 3+ lines | overrun | tokens p50 | tokens p95 | in the window |")
    print("|---|---|---|---|---|---|---|---|")
    for row in table:
        inside = GATE[0] <= row["pass@1"] <= GATE[1] and row["3+ lines"] > 0.5
        print(
            f"| {row['wording']} | {WORDINGS[row['wording']][2]!r} | {row['pass@1']:.3f} | {row['3+ lines']:.2f} | "
            f"{row['overrun']:.2f} | {row['tokens p50']:.0f} | {row['tokens p95']:.0f} | {'yes' if inside else 'no'} |"
        )
    print(f"\nwrote {args.output}", file=sys.stderr)
    return table


if __name__ == "__main__":
    main()
