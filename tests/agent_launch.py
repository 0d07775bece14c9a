"""A multi-turn seeded run under `accelerate launch --num_processes 2` (tests/test_agentic.py runs it)."""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from tests import agent_fixtures as af  # noqa: E402
from tests.test_agentic import agent_config  # noqa: E402
from ts_trl import SeedGRPOTrainer  # noqa: E402


class RankDrifting(af.Counter):
    """Answers as recorded on rank 0 and differently on rank 1 (its totals start at 1): only rank 1's replays fail."""

    def reset(self, **row):
        self.total = int(os.environ.get("RANK", "0"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--environment", choices=["counter", "drifting"], default="counter")
    cli = parser.parse_args()
    tokenizer = af.build_agent_tokenizer()
    factory = af.Counter if cli.environment == "counter" else RankDrifting
    trainer = SeedGRPOTrainer(
        af.scripted_agent(tokenizer, calls=1),
        args=agent_config(cli.output_dir, per_device_train_batch_size=4),
        train_dataset=af.agent_prompts(2),
        processing_class=tokenizer,
        environment_factory=factory,
    )
    trainer.train()


if __name__ == "__main__":
    main()
