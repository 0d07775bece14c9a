"""Run by tests/trainer/test_vllm.py under `accelerate launch`: every rank trains the tiny model in vLLM server mode against
the `LocalVLLMServer` of the test process, with TRL's vLLM modules patched as in the in-process tests."""

import argparse

from tests.conftest import TINY_SETTINGS, count_reward, tiny_prompts
from tests.support.vllm_server import pretend_vllm_is_installed
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.tiny import build_tiny_model, build_tokenizer


def _setattr(owner, name, value, raising=True):
    setattr(owner, name, value)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed_fraction", type=float, default=0.5)
    parser.add_argument("--prefix_mode", default="state")
    args = parser.parse_args()
    pretend_vllm_is_installed(_setattr)
    settings = {
        **TINY_SETTINGS,
        "per_device_train_batch_size": 4,  # one prompt group per rank: the ranks seed or not independently
        "output_dir": args.output_dir,
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": args.endpoint,
        "seed_fraction": args.seed_fraction,
        "prefix_mode": args.prefix_mode,
    }
    tokenizer = build_tokenizer()
    trainer = SeedGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=count_reward,
        args=SeedGRPOConfig(**settings),
        train_dataset=tiny_prompts(),
        processing_class=tokenizer,
    )
    trainer.train()


if __name__ == "__main__":
    main()
