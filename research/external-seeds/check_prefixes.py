"""Also: how much of a trace the prefixes hold, and how many kept traces are faithful chains (chain-strict).

Checks every seeded row of the seeded runs: its first prefix_len tokens decode to the start of the trace it names
(seed_origin trace-<row>) and end at a text boundary (whitespace). Prints counts per run."""

import json
from pathlib import Path

import pyarrow.parquet as pq

from ts_trl.embedded.chain import chain_reward
from ts_trl.embedded.tasks import task_spec
from ts_trl.tiny import load_tokenizer

here = Path(__file__).resolve().parent
traces = [json.loads(line) for line in (here / "traces.jsonl").read_text().splitlines()]
tokenizer = load_tokenizer(here / "warm")
out = {}
for run in sorted((here / "runs").glob("seeded-seed*")):
    rows = [r for shard in sorted((run / "seeds").glob("step-*.parquet")) for r in pq.read_table(shard).to_pylist()]
    seeded = [r for r in rows if r["prefix_len"] > 0]
    ok = boundary = external = 0
    for r in seeded:
        origin = r["seed_origin"] or ""
        if not origin.startswith("trace-"):
            continue
        external += 1
        trace = traces[int(origin.split("-")[1])]
        prefix = tokenizer.decode(r["completion_ids"][: r["prefix_len"]])
        ok += trace["completion"].startswith(prefix) and trace["prompt"] == r["prompt"]
        nxt = trace["completion"][len(prefix) : len(prefix) + 1]
        boundary += prefix[-1:].isspace() or nxt.isspace() or nxt == ""
    out[run.name] = {
        "rows": len(rows),
        "seeded_rows": len(seeded),
        "from_traces": external,
        "prefix_is_trace_text": ok,
        "prefix_ends_at_boundary": boundary,
        "mean_prefix_tokens": sum(r["prefix_len"] for r in seeded) / max(len(seeded), 1),
    }
prefixes = []
for run in sorted((here / "runs").glob("seeded-seed*")):
    for shard in sorted((run / "seeds").glob("step-*.parquet")):
        for r in pq.read_table(shard, columns=["completion_ids", "prefix_len"]).to_pylist():
            if r["prefix_len"] > 0:
                prefixes.append(tokenizer.decode(r["completion_ids"][: r["prefix_len"]]))
n = max(len(prefixes), 1)
out["prefixes_all_runs"] = {
    "count": len(prefixes),
    "share_leading_space_only": sum(p == " " for p in prefixes) / n,
    "share_within_first_line": sum(p.rstrip("\n").count("\n") == 0 for p in prefixes) / n,
}

answers = {
    json.loads(line)["prompt"]: json.loads(line)["answer"] for line in (here / "train.jsonl").read_text().splitlines()
}
kept = [
    t
    for t in traces
    if task_spec("chain").reward(completions=[t["completion"]], answer=[answers[t["prompt"]]])[0] >= 1
]
strict = chain_reward(
    prompts=[t["prompt"] for t in kept],
    completions=[t["completion"] for t in kept],
    answer=[answers[t["prompt"]] for t in kept],
)
out["kept_traces"] = {"right_total": len(kept), "whole_chain_right": sum(s >= 1 for s in strict)}
print(json.dumps(out, indent=1))
(here / "prefix_check.json").write_text(json.dumps(out, indent=1))
