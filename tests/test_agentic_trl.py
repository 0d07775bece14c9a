"""Equivalents of TRL 1.16's GRPO tests with `tools` and `environment_factory`, with SeedGRPOTrainer swapped in and
seeding on (TRL's own tests download a Hub model; these use the offline scripted agent of `agent_fixtures`)."""

import pytest
import torch
from datasets import Dataset

from tests import agent_fixtures as af
from tests.test_agentic import agent_config
from ts_trl import SeedGRPOTrainer


class Renamed:
    """A second environment (TRL's multi-environment routing by the dataset's `environment` column)."""

    def reset(self, **row):
        self.total = 0

    def add(self, a: int, b: int) -> int:
        """Adds two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        self.total = a + b
        return self.total


def routed_prompts(n: int) -> Dataset:
    rows = [
        {"prompt": [{"role": "user", "content": f"Add {i}."}], "environment": ("counter", "renamed")[i % 2]}
        for i in range(n)
    ]
    return Dataset.from_list(rows)


CASES = {
    "async_tool": dict(reward_funcs=af.last_digits_even, tools=[af.async_add], tool_name="async_add"),
    "failing_tool": dict(reward_funcs=af.last_digits_even, tools=[af.failing_add], tool_name="failing_add"),
    "environment_dict": dict(
        reward_funcs=af.last_digits_even, environment_factory={"counter": af.Counter, "renamed": Renamed}
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_trl_multi_turn_training_with_seeding(case, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    options = dict(CASES[case])
    tool_name = options.pop("tool_name", "add")
    monkeypatch.setattr(af, "CALL_TURN", af.CALL_TURN.replace('"add"', f'"{tool_name}"'))
    tokenizer = af.build_agent_tokenizer()
    model = af.scripted_agent(tokenizer, calls=1)
    dataset = routed_prompts(2) if "environment_factory" in options else af.agent_prompts(2)
    trainer = SeedGRPOTrainer(
        model,
        args=agent_config(tmp_path, learning_rate=0.1),
        train_dataset=dataset,
        processing_class=tokenizer,
        **options,
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    history = trainer.state.log_history
    assert history[-1]["train_loss"] is not None
    assert max(h.get("seeds/seeded_group_share", 0) for h in history) > 0
    assert max(h.get("tools/call_frequency", 0) for h in history) > 0
    if case == "failing_tool":
        assert max(h.get("tools/failure_frequency", 0) for h in history) == 1.0
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "no parameter was updated"
