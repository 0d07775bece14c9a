"""A multi-turn seeded run under `accelerate launch --num_processes 2` (tests/launch/test_agentic_ranks.py runs
it): every rank writes what it saw to `<output_dir>/rank-<r>.json` for the test to check."""

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from tests.support import agent_fixtures as af  # noqa: E402
from tests.trainer.test_agentic import agent_config, recorded_run  # noqa: E402
from ts_trl import SeedGRPOTrainer  # noqa: E402
from ts_trl.cli.environment import skip_deepspeed_shm_build  # noqa: E402

RANK_ROWS = 4  # per_device_train_batch_size: one prompt group per rank


class RankDrifting(af.Counter):
    """Answers from a total that starts at the rank: a replay matches only on the rank its seed was recorded on."""

    def reset(self, **row):
        self.total = int(os.environ.get("RANK", "0"))


def _setattr(owner, name, value, raising=True):
    setattr(owner, name, value)


def make_trainer(cli, tokenizer, output_dir):
    backend: dict = {}
    if cli.backend.startswith("colocate"):
        import trl.generation.vllm_generation as generation

        from tests.support.vllm_server import pretend_vllm_is_installed

        pretend_vllm_is_installed(_setattr)
        generation.LLM = af.scripted_fake_llm(tokenizer)
        backend = dict(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=4096)
        if cli.backend == "colocate-tp2":  # one engine over both ranks: each turn gathers their prompts
            backend["vllm_tensor_parallel_size"] = 2
    elif cli.backend == "server":
        from tests.support.vllm_server import pretend_vllm_is_installed

        pretend_vllm_is_installed(_setattr)
        backend = dict(use_vllm=True, vllm_mode="server", vllm_server_base_url=cli.endpoint)
    if cli.kind == "environment":  # cuts after the tool call (r >= 0.6 of the model tokens): every seed replays
        backend["cut_ratio_min"] = 0.6
    args = agent_config(output_dir, per_device_train_batch_size=RANK_ROWS, prefix_mode=cli.prefix_mode, **backend)
    agent = dict(tools=[af.add]) if cli.kind == "tools" else dict(environment_factory=RankDrifting)
    rewards = af.last_digits_even if cli.kind == "tools" else None
    model = af.scripted_agent(tokenizer, calls=1)
    return SeedGRPOTrainer(
        model, rewards, args=args, train_dataset=af.agent_prompts(2), processing_class=tokenizer, **agent
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--kind", choices=["tools", "environment"], default="environment")
    parser.add_argument("--prefix_mode", choices=["state", "action"], default="state")
    parser.add_argument("--backend", choices=["hf", "colocate", "colocate-tp2", "server"], default="hf")
    parser.add_argument("--endpoint")
    parser.add_argument("--resume", action="store_true", help="rebuild the bank from checkpoint-2 and compare")
    cli = parser.parse_args()
    skip_deepspeed_shm_build()  # ZeRO-3 on CPU: as `ts_trl train` does, no minutes of compiling an op never used
    tokenizer = af.build_agent_tokenizer()
    trainer = make_trainer(cli, tokenizer, cli.output_dir)
    rank = trainer.accelerator.process_index

    plans = []  # per batch: the global seeded rows before and after the environments replayed the prefixes
    restore = trainer._restore_states

    def watched(batch):
        before = batch.plan.global_seeded.tolist()
        restore(batch)
        plans.append({"before": before, "after": batch.plan.global_seeded.tolist()})

    trainer._restore_states = watched
    served = []  # tool-loop turns this rank took part in with no row of its own
    even_turn = trainer._even_tool_turn

    def counted(prompt_ids, *args):
        answer = even_turn(prompt_ids, *args)
        served.extend([1] if answer is not None and not prompt_ids else [])
        return answer

    trainer._even_tool_turn = counted
    batches = recorded_run(trainer)
    seeded = []
    for step, batch in enumerate(batches):
        for i, (seed, cut) in enumerate(zip(batch["plan"].seeds, batch["plan"].cuts)):
            if cut is None:
                continue
            ids, origin = batch["ids"][i][: cut.k], [int(t) for t in seed.completion_ids[: cut.k]]
            seeded.append(
                {
                    "batch": step,
                    "row": rank * RANK_ROWS + i,
                    "origin_id": seed.rollout_id,
                    "prefix": ids,
                    "origin": origin,
                    "prefix_text": tokenizer.decode(ids, skip_special_tokens=False),
                    "origin_text": tokenizer.decode(origin, skip_special_tokens=False),
                    "loss_mask": batch["loss_mask"][i][: cut.k],
                    "continuation_trained": any(batch["loss_mask"][i][cut.k : len(batch["ids"][i])]),
                    "origin_tool_mask": [int(x) for x in seed.tool_mask[: cut.k]],
                    "replayed_calls": len(batch["turns"][i].tool_calls),
                }
            )
    report = {"rank": rank, "seeded": seeded, "plans": plans, "history": trainer.state.log_history}
    report["served_turns"] = len(served)
    if cli.resume:  # the bank a resume from checkpoint-2 rebuilds, against the one this run held
        original = trainer.seed_bank
        before = {original.get(i).rollout_id: original.get(i) for i in range(len(original))}
        resumed = make_trainer(cli, tokenizer, cli.output_dir)
        resumed.seed_store.start(str(Path(cli.output_dir) / "checkpoint-2"))
        bank, rebuilt = resumed.seed_bank, []
        for index in range(len(bank)):
            seed = bank.get(index)
            kept = before[seed.rollout_id]
            same = (
                seed.completion_ids.tolist() == kept.completion_ids.tolist()
                and seed.tool_mask is not None
                and seed.tool_mask.tolist() == kept.tool_mask.tolist()
                and json.loads(seed.messages) == json.loads(kept.messages)
            )
            rebuilt.append({"rollout_id": seed.rollout_id, "same": same, "tool_results": 0 in seed.tool_mask})
        resumed.seed_store.release()
        report["resumed"] = rebuilt
    (Path(cli.output_dir) / f"rank-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
