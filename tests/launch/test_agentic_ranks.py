"""Multi-turn Thinking Seeds on two processes (`accelerate launch`, gloo on CPU) through `trainer.train()`.

Tools and environments, both prefix modes, HF `generate` (DDP, and ZeRO-3 on CPU) and the faked vLLM backends
(colocate, also tensor-parallel over both ranks, and server), chosen so that every pair of (agent kind, prefix mode,
backend) runs once. The vLLM backends are fakes: the default suite has no vLLM, and TRL's weight transfer to a server
is NCCL only (tests/trainer/test_vllm_real.py runs a real engine, colocated on one rank). The environment answers
from a total that starts at the rank (`agent_launch.RankDrifting`): a seed replays on the rank it was recorded on and
mismatches on the other one.
"""

import json
from pathlib import Path

import pytest
import yaml

from tests.cli.test_cli import ZERO3_CPU
from tests.conftest import RANKS
from tests.support import agent_fixtures as af
from tests.support.agent_launch import RANK_ROWS
from tests.support.ranks import DDP, run_on_two_ranks
from tests.trainer.test_agentic import MAX_COMPLETION

pytestmark = RANKS  # tests/conftest.py: one launch at a time


CASES = [
    pytest.param("tools", "state", "hf", id="tools-state-hf"),
    # ZeRO-3: every generation call gathers the parameters, so every rank takes part in every tool-loop turn
    pytest.param("environment", "action", "hf-zero3", id="environment-action-hf-zero3"),
    pytest.param("tools", "action", "colocate", id="tools-action-colocate"),
    # one tensor-parallel engine over both ranks: each turn gathers their prompts
    pytest.param("environment", "state", "colocate-tp2", id="environment-state-colocate-tp2"),
    pytest.param("tools", "state", "server", id="tools-state-server"),
    pytest.param("environment", "action", "server", id="environment-action-server"),
]


def launch(output_dir: Path, *options: str, zero3: bool = False) -> list[dict]:
    """Runs tests/support/agent_launch.py on two processes (DDP, or DeepSpeed ZeRO-3 on CPU); returns each rank's report."""
    config, env = DDP, {}
    if zero3:
        config = output_dir.parent / "zero3_cpu.yaml"
        config.write_text(yaml.safe_dump({**ZERO3_CPU, "num_processes": 2}))
        env = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(output_dir.parent / "torch_extensions")}
    run_on_two_ranks("agent_launch.py", "--output_dir", str(output_dir), *options, config=config, env=env)
    return [json.loads((output_dir / f"rank-{rank}.json").read_text()) for rank in range(2)]


def rank_of(rollout_id: str) -> int:
    return int(rollout_id.rsplit("-", 1)[1]) // RANK_ROWS


@pytest.mark.parametrize(("kind", "prefix_mode", "backend"), CASES)
def test_two_ranks_seed_multi_turn_runs(tmp_path, monkeypatch, kind, prefix_mode, backend):
    zero3 = backend == "hf-zero3"
    options = ["--kind", kind, "--prefix_mode", prefix_mode, "--backend", backend.removesuffix("-zero3")]
    if kind == "tools" and backend == "hf":
        options.append("--resume")
    server = None
    if backend == "server":
        import tests.support.vllm_server as stand_in

        tokenizer = af.build_agent_tokenizer()
        monkeypatch.setattr(stand_in, "sample_completion", af.scripted_sampler(tokenizer))
        server = stand_in.LocalVLLMServer(range(len(tokenizer)), tokenizer.eos_token_id, 4096).start()
        options += ["--endpoint", server.endpoint]
    try:
        reports = launch(tmp_path / "run", *options, zero3=zero3)
    finally:
        if server is not None:
            server.stop()
    history = reports[0]["history"]
    seeding = [[{k: v for k, v in h.items() if k.startswith("seeds/")} for h in r["history"]] for r in reports]
    assert seeding[0] == seeding[1]  # the seeding metrics are gathered: every rank logs the same
    assert max(h.get("seeds/seeded_group_share", 0) for h in history) > 0

    seeded = [row for report in reports for row in report["seeded"]]
    assert seeded
    for row in seeded:  # every rank's seeded prefixes are their origin's tokens
        assert row["prefix"] == row["origin"] and row["prefix_text"] == row["origin_text"]
        expected = row["origin_tool_mask"] if prefix_mode == "action" else [0] * len(row["prefix"])
        assert row["loss_mask"] == expected  # state: no prefix token trained; action: model tokens, no tool result
        assert row["continuation_trained"]
    assert any(0 in row["origin_tool_mask"] for row in seeded), "no seed was cut after a tool result"

    if kind == "tools":
        assert all(report["seeded"] for report in reports), "a rank seeded no group"
    else:
        check_replays(reports, history)
    if backend in ("hf-zero3", "colocate-tp2", "server"):  # each turn is a collective call: a rank whose tool loop
        assert sum(report["served_turns"] for report in reports) > 0  # was over took part in the other's turns
    if server is not None:  # the main process asked, for each rank's seeded rows, the budget their prefix leaves
        assert server.refused == []
        asked = {}
        for completion in server.completions:
            for prompt in completion["prompt"]:
                asked.setdefault(tuple(prompt), set()).add(completion["max_tokens"])
        for row in seeded:
            k = len(row["prefix"])
            sent = [p for p in asked if list(p[-k:]) == row["prefix"]]
            assert sent and any(MAX_COMPLETION - k in asked[p] for p in sent), row["row"]
        check_tool_turns(server, tmp_path / "run")
    if "--resume" in options:
        for report in reports:
            rebuilt = report["resumed"]
            assert rebuilt and all(r["same"] for r in rebuilt)
            assert {rank_of(r["rollout_id"]) for r in rebuilt} == {0, 1}  # both ranks' rollouts, on every rank
            assert any(r["tool_results"] for r in rebuilt)


def check_replays(reports: list[dict], history: list[dict]) -> None:
    """A seed replays on its own rank and mismatches on the other; a mismatched group is dropped on every rank and
    counted in `seeds/replay_mismatch_share`."""
    plans = [report["plans"] for report in reports]
    assert plans[0] == plans[1]  # every rank plans, and drops, the same groups
    shares = [h["seeds/replay_mismatch_share"] for h in history if "seeds/replay_mismatch_share" in h]
    expected = []
    for plan in plans[0]:
        before, after = plan["before"][::RANK_ROWS], plan["after"][::RANK_ROWS]
        if any(before):
            expected.append(sum(b and not a for b, a in zip(before, after)) / sum(before))
    assert shares == pytest.approx(expected) and max(shares) > 0
    replayed = [row for report in reports for row in report["seeded"] if row["replayed_calls"]]
    assert replayed, "no seed was replayed"
    assert all(rank_of(row["origin_id"]) == row["row"] // RANK_ROWS for row in replayed)


def check_tool_turns(server, output_dir: Path) -> None:
    """Every rank got the server's answers to its own tool-loop turns, though the ranks took different numbers of
    turns: the ranks whose loop was over sent one-token fillers (`SeedGRPOTrainer._even_tool_turn`)."""
    from tests.conftest import seed_rows

    fillers = [c for c in server.completions if c["max_tokens"] == 1]
    assert fillers and all(len(p) == 1 for c in fillers for p in c["prompt"])
    checked = 0
    for row in seed_rows(output_dir):
        ids, mask = row["completion_ids"], row["tool_mask"]
        for j in range(max(row["prefix_len"], 1), len(ids)):
            if mask[j] and not mask[j - 1]:  # a model turn after a tool result: asked by the tool loop
                end = next((e for e in range(j, len(ids)) if not mask[e]), len(ids))
                sent = [p for p in server.answers if list(p[-j:]) == ids[:j]]
                assert sent and any(ids[j:end] in server.answers[p] for p in sent), row["rollout_id"]
                checked += 1
    assert checked
