"""The `chat-chain` task: its problems, its final-line reward, its registration, and (marker real_model) a short run
of it on SmolLM2-135M-Instruct through `trainer.train()` that seeds from a passing earlier reply; and the splits of
`chat-add`, whose dataset builder both chat tasks share."""

from __future__ import annotations

import re

import pytest

from ts_trl.embedded.chat_add import INSTRUCTION, ChatAddTask
from ts_trl.embedded.chat_chain import WORDINGS, ChatChainTask, chat_chain_reward
from ts_trl.embedded.tasks import is_real_model_task, make_task, task_reward, task_spec
from ts_trl.rewards import REWARD_NAMES


def test_splits_are_disjoint_by_operands_and_answers_are_sums():
    task = ChatChainTask()
    train, held_out = task.make_splits(64, 32)
    operands = {}
    for split, data in (("train", train), ("eval", held_out)):
        for row in data:
            messages = row["prompt"]
            assert [m["role"] for m in messages] == ["user", "assistant", "user"]  # the worked example, then the ask
            terms = messages[-1]["content"].split(".")[0].removeprefix("Add ").split(" + ")
            numbers = tuple(int(t) for t in terms)
            assert len(numbers) in task.sizes and all(1 <= n <= 9 for n in numbers)
            assert int(row["answer"]) == sum(numbers)
            operands.setdefault(split, set()).add(tuple(sorted(numbers)))
    assert not operands["train"] & operands["eval"]
    with pytest.raises(ValueError, match="pool holds"):
        task.make_splits(10_000, 1)
    with pytest.raises(ValueError, match="wording must be one of"):
        ChatChainTask(wording=len(WORDINGS))


def test_chat_add_splits_are_one_question_each_with_its_sum():
    train, held_out = ChatAddTask().make_splits(24, 8)
    for split, data in (("train", train), ("eval", held_out)):
        assert data["prompt_id"] == [f"{split}-{i:05d}" for i in range(len(data))]
        for row in data:
            (message,) = row["prompt"]
            assert message["role"] == "user" and message["content"].endswith(INSTRUCTION)
            a, b = map(int, re.findall(r"\d+", message["content"]))
            assert int(row["answer"]) == a + b
    with pytest.raises(ValueError, match="problems of the chat-add task, whose pool holds 268"):
        ChatAddTask().make_splits(1_000, 1)


def test_reward_reads_the_final_line_only():
    replies = [
        "4 + 1 = 5\n5 + 1 = 6\nTotal: 6",  # right
        "4 + 1 = 7\n? 4 + 1 = 5\n5 + 1 = 6\nTotal: 6\n",  # a wrong partial sum, repaired: the final line counts
        "4 + 1 = 5\n5 + 1 = 6\nTotal: 7",  # right sums, wrong total
        "4 + 1 = 5\n5 + 1 = 6",  # no total line: its last line still ends in the sum
        "Total: 6\nbut I am not sure",  # the sum is not on the final line
        "",
    ]
    assert chat_chain_reward(replies, ["6"] * len(replies)) == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    conversational = [[{"role": "assistant", "content": "2 + 2 = 4\n4 + 3 = 7\nTotal: 7"}]]
    assert chat_chain_reward(conversational, ["7"]) == [1.0]


def test_registered_as_a_real_model_task_with_its_recipe():
    spec = task_spec("chat-chain")
    assert spec.real_model == "smollm2-135m-instruct" and spec.reward is chat_chain_reward
    assert spec.train_defaults["task"] == "chat-chain" and spec.train_defaults["reward_funcs"] == ["chat_chain"]
    assert spec.max_completion_length == spec.train_defaults["max_completion_length"]
    task = make_task("chat-chain", seed=3)
    assert isinstance(task, ChatChainTask) and task.seed == 3
    assert is_real_model_task(task) and task_reward(task) is chat_chain_reward
    assert "chat_chain" in REWARD_NAMES


@pytest.mark.real_model
def test_short_run_seeds_from_a_passing_earlier_reply(tmp_path):
    """`seed_selection="success"` on the real model: every seeded row continues a reply of an earlier step that
    passed (reward 1 under `chat_chain_reward`), and its prefix is that reply's first k token ids, out of the loss."""
    from peft import LoraConfig

    from tests.trainer.test_agentic import recorded_run, seeded_rows
    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer, smollm2_135m_instruct

    # The first two training prompts, which passed 3 of 4 samples each in the calibration (wording 4,
    # research/smollm2-chain/calibration/replies-3numbers-w45.csv): each comes back every step.
    train = ChatChainTask().make_splits(2, 1)[0]
    answers = {row["prompt_id"]: row["answer"] for row in train}
    args = SeedGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        seed=0,
        per_device_train_batch_size=8,  # 2 prompts x 4 samples
        num_generations=4,
        max_completion_length=48,
        learning_rate=1e-4,
        max_steps=4,
        save_steps=100,
        logging_steps=1,
        seed_fraction=1.0,
        seed_selection="success",
        seed_snapshot_steps=1,
        cut_at_newline=True,
        activation_checkpointing=False,
        report_to=[],
        disable_tqdm=True,
    )
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = SeedGRPOTrainer(
        model=smollm2_135m_instruct(), reward_funcs=chat_chain_reward, args=args, train_dataset=train, peft_config=lora
    )
    batches = recorded_run(trainer)
    tokenizer = trainer.processing_class
    seeded = list(seeded_rows(batches))
    assert seeded, "no group was seeded from a passing reply"
    for batch, i, seed, cut in seeded:
        assert seed.reward >= 1.0 and seed.step < batch["plan"].step  # an earlier reply that passed
        origin = [int(t) for t in seed.completion_ids]
        # The reply did pass: its text, scored again against its own prompt's sum, gets 1.
        assert chat_chain_reward([tokenizer.decode(origin, skip_special_tokens=True)], [answers[seed.prompt_id]]) == [
            1.0
        ]
        assert batch["ids"][i][: cut.k] == origin[: cut.k]  # the prefix is the origin's ids
        assert not any(batch["loss_mask"][i][: cut.k]) and any(batch["loss_mask"][i][cut.k :])  # state mode
