"""Agent traces (chat `messages` with tool calls) as text seeds of runs with tools and environments."""

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import logged
from tests.method.test_planning import _args
from tests.support import agent_fixtures as af
from tests.trainer.test_agentic import MAX_COMPLETION, agent_config, recorded_run, seeded_rows
from ts_trl import SeedGRPOTrainer
from ts_trl.method.planning import CutOutcomes, GroupPlanner
from ts_trl.method.selection import EXTERNAL_STEP
from ts_trl.method.turns import step_boundaries, turn_ratio_bounds
from ts_trl.store.bank import SeedBank
from ts_trl.store.schema import Rollout, prompt_id_of, tokenizer_fingerprint
from ts_trl.store.traces import read_traces


def call(a, b, arguments=None):
    arguments = json.dumps({"a": a, "b": b}) if arguments is None else arguments
    return {"id": f"call-{a}", "type": "function", "function": {"name": "add", "arguments": arguments}}


def trace(i: int, observation: str | None = None) -> dict:
    """An OpenAI-style trace of the scripted task's prompt `i`: one call of `add`, its result, a final answer (the tool
    message names no tool, as OpenAI's do: the call it answers does)."""
    return {
        "messages": [
            {"role": "user", "content": f"Add {i} and {i + 1}."},
            {"role": "assistant", "content": f"Hm {i}.", "tool_calls": [call(i, i + 1)]},
            {"role": "tool", "tool_call_id": f"call-{i}", "content": observation or str(2 * i + 1)},
            {"role": "assistant", "content": "Sum: 37."},
        ]
    }


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def traces_trainer(output_dir, seed_dataset, factory=None, **overrides):
    tokenizer = af.build_agent_tokenizer()
    tools = {"environment_factory": factory} if factory else {"tools": [af.add]}
    rewards = [] if factory else [af.last_digits_even]
    trainer = SeedGRPOTrainer(
        af.scripted_agent(tokenizer, calls=1),
        rewards or None,
        args=agent_config(output_dir, seed_dataset=seed_dataset, **overrides),
        train_dataset=af.agent_prompts(2),
        processing_class=tokenizer,
        **tools,
    )
    return trainer, tokenizer


def rendered_text(tokenizer, messages) -> tuple[str, str]:
    """(prompt, prompt + trajectory) as the chat template renders the whole conversation, tools passed as TRL does."""
    turns = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {
                    "type": "function",
                    "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])},
                }
                for c in message["tool_calls"]
            ]
        turns.append(message if message["role"] != "tool" else {**message, "name": "add"})
    prompt = tokenizer.apply_chat_template(turns[:1], tools=[af.add], add_generation_prompt=True, tokenize=False)
    return prompt, tokenizer.apply_chat_template(turns, tools=[af.add], tokenize=False)


def external_rows(batches):
    for batch, i, seed, cut in seeded_rows(batches):
        if seed.step == EXTERNAL_STEP:
            yield batch, i, seed, cut


@pytest.fixture(scope="module")
def traces_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces")
    dataset = write_jsonl(folder / "traces.jsonl", [trace(0), trace(1)])
    # seed_min_age: only the traces seed (the run's own rollouts never grow old enough), so every group tests them
    trainer, tokenizer = traces_trainer(folder / "run", dataset, seed_min_age=100)
    return {"trainer": trainer, "tokenizer": tokenizer, "batches": recorded_run(trainer), "dir": folder / "run"}


def test_agent_traces_seed_a_tools_run(traces_run):
    trainer = traces_run["trainer"]
    assert max(logged(trainer, "seeds/seeded_group_share")) > 0
    assert max(logged(trainer, "seeds/external_share")) > 0
    assert list(external_rows(traces_run["batches"]))
    assert trainer.seed_store.external_provenance["turns"] is True


def test_every_seeded_prefix_is_the_rendered_trace_up_to_the_cut(traces_run):
    tokenizer = traces_run["tokenizer"]
    traces = {f"trace-{i}": trace(i)["messages"] for i in range(2)}
    inner = boundary = 0
    for batch, i, seed, cut in external_rows(traces_run["batches"]):
        prompt, whole = rendered_text(tokenizer, traces[seed.rollout_id])
        seed_text = tokenizer.decode(seed.completion_ids, skip_special_tokens=False)
        assert prompt + seed_text + "\n" == whole  # the template's newline after the last turn is not generated
        prefix = batch["ids"][i][: cut.k]
        assert prefix == [int(t) for t in seed.completion_ids[: cut.k]]
        assert whole.startswith(prompt + tokenizer.decode(prefix, skip_special_tokens=False))
        assert not any(batch["loss_mask"][i][: cut.k])
        assert len(batch["ids"][i]) <= MAX_COMPLETION
        mask = [int(x) for x in seed.tool_mask]
        assert mask[cut.k] == 1  # the next token is the model's: never inside a tool result
        if mask[cut.k - 1]:  # inside a model turn: before its tool-call markup
            turn = tokenizer.decode(prefix, skip_special_tokens=False).rsplit("<|im_start|>assistant\n", 1)[-1]
            assert "<" not in turn, turn
            inner += 1
        else:
            boundary += 1
            # the prefix's turns are the trace's, and the continuation starts a new assistant turn
            assert batch["messages"][i][:2] == batch["turns"][i].messages
    assert inner and boundary, (inner, boundary)


def test_an_environment_replays_agent_traces_and_drops_a_trace_it_answers_otherwise(tmp_path):
    # Prompt 1's trace records a result the environment never gives: each group cut after its call runs plain.
    dataset = write_jsonl(tmp_path / "traces.jsonl", [trace(0), trace(1, observation="99")])
    # cut_ratio_min: most cuts fall after the call (the first turn's text before its markup is short)
    trainer, _ = traces_trainer(tmp_path / "run", dataset, af.Counter, cut_ratio_min=0.6)
    batches = recorded_run(trainer)
    assert max(logged(trainer, "seeds/external_share")) > 0
    assert max(logged(trainer, "seeds/replay_mismatch_share")) > 0
    assert max(logged(trainer, "seeds/replayed_tool_calls_mean")) > 0
    replayed = 0
    for batch, i, seed, _ in external_rows(batches):
        calls = batch["turns"][i].tool_calls
        assert seed.rollout_id == "trace-0" or not calls  # no group kept a state the environment does not hold
        if calls:
            assert calls == [{"name": "add", "arguments": {"a": 0, "b": 1}}]
            assert batch["messages"][i][1] == {"role": "tool", "name": "add", "content": "1"}
            replayed += 1
    assert replayed


class Briefed(af.Counter):
    """An environment whose reset adds to the row's prompt (TRL appends what reset returns to the last message)."""

    def reset(self, **row):
        super().reset(**row)
        return " Start from 0."


def test_a_seed_dataset_whose_rows_reset_extends_never_seeds_them_and_says_so_once(tmp_path, caplog):
    """The traces are matched to the dataset's prompts; reset() made longer ones, by which the rows are keyed: the run
    trains, none of the traces seeds, and the log says why once."""
    dataset = write_jsonl(tmp_path / "traces.jsonl", [trace(0), trace(1)])
    trainer, _ = traces_trainer(tmp_path / "run", dataset, Briefed, seed_min_age=100)
    with caplog.at_level(logging.WARNING):
        batches = recorded_run(trainer)
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert not list(external_rows(batches)) and max(logged(trainer, "seeds/external_share"), default=0) == 0
    told = [r.getMessage() for r in caplog.records if "reset(**row) added to the prompt" in r.getMessage()]
    assert len(told) == 1 and "never seed them" in told[0], told


def test_a_runs_own_seed_dataset_seeds_a_new_tools_run_through_its_messages(traces_run, tmp_path):
    shards = sorted((traces_run["dir"] / "seeds").glob("step-*.parquet"))
    table = pa.concat_tables([pq.read_table(s) for s in shards])
    # Its messages alone, as a trace dataset: rendered again, they are the token ids and tool mask TRL's loop wrote.
    pq.write_table(table.select(["rollout_id", "prompt", "messages"]), tmp_path / "messages.parquet")
    trainer, _ = traces_trainer(tmp_path / "from-messages", str(tmp_path / "messages.parquet"), max_steps=1)
    bank = trainer.seed_bank
    recorded = {r["rollout_id"]: r for r in table.to_pylist()}
    assert len(bank) == len(recorded)
    for index in range(len(bank)):
        seed = bank.get(index)
        row = recorded[seed.rollout_id]
        assert seed.completion_ids.tolist() == row["completion_ids"]
        assert seed.tool_mask.tolist() == row["tool_mask"]
    recorded_run(trainer)
    assert max(logged(trainer, "seeds/external_share")) > 0
    # As another tokenizer's seed dataset (its ids are not read): its messages give the same ids again.
    other = table.set_column(table.schema.get_field_index("tokenizer"), "tokenizer", pa.array(["0" * 16] * len(table)))
    pq.write_table(other, tmp_path / "other.parquet")
    trainer, _ = traces_trainer(tmp_path / "from-other", str(tmp_path / "other.parquet"))
    assert trainer.seed_store.external_provenance["completion_column"] == "messages"
    for index in range(len(trainer.seed_bank)):
        seed = trainer.seed_bank.get(index)
        assert seed.completion_ids.tolist() == recorded[seed.rollout_id]["completion_ids"]
    # The run's output_dir as it is (this tokenizer's ids, with their turns) seeds one too.
    trainer, _ = traces_trainer(tmp_path / "from-shards", str(traces_run["dir"]), max_steps=1)
    batches = recorded_run(trainer)
    assert max(logged(trainer, "seeds/external_share")) > 0
    for batch, i, seed, cut in external_rows(batches):
        assert batch["ids"][i][: cut.k] == recorded[seed.rollout_id]["completion_ids"][: cut.k]


BAD_ROWS = {
    "malformed tool_calls": (
        {"role": "assistant", "content": "Hm.", "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]},
        "message 1: tool_calls\\[0\\] has no function name",
    ),
    "arguments that are not JSON": (
        {"role": "assistant", "content": "Hm.", "tool_calls": [call(0, 1, arguments="{a: 0")]},
        "message 1: the arguments of tool_calls\\[0\\] \\('add'\\) are not a JSON object",
    ),
    "a tool message without a call": (
        {"role": "assistant", "content": "Hm."},
        "message 2 is a tool result with no tool call left to answer",
    ),
}


@pytest.mark.parametrize("problem", sorted(BAD_ROWS))
def test_a_bad_trace_row_is_refused_in_one_line_naming_it(problem):
    turn, message = BAD_ROWS[problem]
    rows = [trace(0), trace(1)]
    rows[1]["messages"][1] = turn
    table = pa.Table.from_pylist([{"messages": json.dumps(r["messages"])} for r in rows])
    table = table.set_column(0, "messages", pa.array([json.loads(m) for m in table.column(0).to_pylist()]))
    with pytest.raises(ValueError, match=f"row 1 of column 'messages': {message}") as error:
        read_traces(table, None, None, "seed_dataset='t'", multi_turn=True)
    assert "\n" not in str(error.value) and ("drop" in str(error.value) or "Write each call" in str(error.value))


def test_a_tool_message_with_no_turn_before_it_and_calls_left_unanswered_are_refused():
    messages = trace(0)["messages"]
    cases = {
        "message 1 is a tool result with no tool call before it": [messages[0], messages[2], messages[3]],
        "made 1 tool call\\(s\\) but 0 result\\(s\\) follow": [messages[0], messages[1], messages[3]],
        "an assistant turn without tool calls ends a rollout": [messages[0], messages[3], messages[3]],
    }
    for message, rows in cases.items():
        with pytest.raises(ValueError, match=f"row 0 of column 'messages': .*{message}"):
            read_traces(pa.Table.from_pylist([{"messages": rows}]), None, None, "s", multi_turn=True)
    # A trace may end on a turn whose calls were not run (TRL drops results that would overflow the budget).
    traces, _ = read_traces(pa.Table.from_pylist([{"messages": messages[:2]}]), None, None, "s", multi_turn=True)
    assert traces[0].turns[0]["tool_calls"][0]["function"]["arguments"] == {"a": 0, "b": 1}


def test_a_trace_of_another_prompt_is_left_out_and_counted(tmp_path, caplog):
    other = trace(0)
    other["messages"][0]["content"] = "Add 7 and 8."
    dataset = write_jsonl(tmp_path / "traces.jsonl", [trace(0), other])
    with caplog.at_level(logging.WARNING, logger="ts_trl.store.text_seeds"):
        trainer, _ = traces_trainer(tmp_path / "run", dataset)
    provenance = trainer.seed_store.external_provenance
    assert (provenance["rows"], provenance["matched"], provenance["kept"]) == (2, 1, 1)
    assert any("1 of 2 traces match a training prompt" in r.getMessage() for r in caplog.records)


def test_a_same_tokenizer_seed_of_another_conversational_prompt_is_refused(tmp_path):
    """The round trip above reads conversational prompts (JSON text) as the prompts they are; one that names a
    training prompt's id but holds another prompt is still refused."""
    tokenizer = af.build_agent_tokenizer()
    prompt = af.agent_prompts(2)[0]["prompt"]
    other = json.dumps([{"role": "user", "content": "Add 5 and 6."}])
    row = {"rollout_id": "r", "prompt_id": prompt_id_of(prompt), "prompt": other, "completion_ids": [5, 6, 7]}
    row.update(logprobs=[0.0] * 3, reward=1.0, step=0, tokenizer=tokenizer_fingerprint(tokenizer))
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "seeds.parquet")
    with pytest.raises(ValueError, match="so its seeds would continue another prompt"):
        traces_trainer(tmp_path / "run", str(tmp_path / "seeds.parquet"))


def test_a_resumed_run_reads_the_rendered_traces_back_from_its_cache(tmp_path, caplog):
    dataset = write_jsonl(tmp_path / "traces.jsonl", [trace(0), trace(1)])
    first, _ = traces_trainer(tmp_path / "run", dataset)
    with caplog.at_level(logging.INFO, logger="ts_trl.store.external_seeds"):
        again, _ = traces_trainer(tmp_path / "run", dataset)
    assert any("read back from" in r.getMessage() for r in caplog.records)
    for index in range(len(first.seed_bank)):
        before, after = first.seed_bank.get(index), again.seed_bank.get(index)
        assert after.completion_ids.tolist() == before.completion_ids.tolist()
        assert after.tool_mask.tolist() == before.tool_mask.tolist()
        assert json.loads(after.messages) == json.loads(before.messages)
    assert {k: v.tolist() for k, v in again.seed_store.text_cuts.items()} == {
        k: v.tolist() for k, v in first.seed_store.text_cuts.items()
    }


def test_the_success_filter_scores_a_trace_by_its_whole_trajectory(tmp_path):
    odd = trace(1)
    odd["messages"][-1]["content"] = "Sum: 36."  # last_digits_even: 3 + 6 is odd
    dataset = write_jsonl(tmp_path / "traces.jsonl", [trace(0), odd])
    trainer, _ = traces_trainer(tmp_path / "run", dataset, seed_filter="success", success_reward="last_digits_even")
    assert trainer.seed_store.external_provenance["successful"] == 1
    assert [trainer.seed_bank.get(i).rollout_id for i in range(len(trainer.seed_bank))] == ["trace-0"]


def test_a_single_turn_seed_dataset_is_refused_in_a_tools_run(tmp_path):
    """Seeds with token ids but no recorded turns (a single-turn run's) could never be cut here: refused."""
    rows = [{"rollout_id": "a", "prompt_id": "p", "completion_ids": [5, 6, 7], "logprobs": [0.0] * 3}]
    pq.write_table(pa.Table.from_pylist([{**r, "reward": 1.0, "step": 0} for r in rows]), tmp_path / "ids.parquet")
    with pytest.raises(ValueError, match="none of its 1 seeds can be cut in this run with tools"):
        traces_trainer(tmp_path / "run", str(tmp_path / "ids.parquet"), seed_dataset_same_tokenizer=True)


def test_a_multi_turn_seed_dataset_is_refused_in_a_run_without_tools(tmp_path):
    """Its prefixes would carry tool results that no tool produced in this run."""
    tokenizer = af.build_agent_tokenizer()
    prompt = af.agent_prompts(2)[0]["prompt"]
    row = {"rollout_id": "r", "prompt_id": prompt_id_of(prompt), "prompt": json.dumps(prompt)}
    row.update(completion_ids=[5, 6, 7], tool_mask=[1, 0, 1], logprobs=[0.0] * 3, reward=1.0, step=0)
    pq.write_table(
        pa.Table.from_pylist([{**row, "tokenizer": tokenizer_fingerprint(tokenizer)}]), tmp_path / "s.parquet"
    )
    with pytest.raises(ValueError, match="holds multi-turn rollouts .* and this run has no tools") as error:
        SeedGRPOTrainer(
            af.scripted_agent(tokenizer, calls=0),
            af.last_digits_even,
            args=agent_config(tmp_path / "run", seed_dataset=str(tmp_path / "s.parquet")),
            train_dataset=af.agent_prompts(2),
            processing_class=tokenizer,
        )
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------------------------------------------------
# cut_at_newline and cut_selection="target" with multi-turn seeds


def test_step_boundaries_keep_turn_boundaries_and_cuts_after_newlines():
    newline = 9
    ids = [1, newline, 2, 3, 4, 5, 6, 7]
    mask = [1, 1, 1, 1, 0, 0, 1, 1]
    admissible = np.array([1, 2, 3, 6, 7])
    assert step_boundaries(ids, mask, admissible, {newline}, budget=100).tolist() == [2, 6]
    assert step_boundaries(ids, mask, admissible, {newline}, budget=3).tolist() == [2]
    # none of them within the budget: every admissible cut, as a single-turn cut keeps its ratio without a newline
    assert step_boundaries(ids, mask, admissible, {newline}, budget=2).tolist() == [1, 2, 3, 6, 7]


def test_turn_ratio_bounds_span_the_admissible_cuts_over_model_tokens():
    mask = [1, 1, 1, 1, 0, 0, 1, 1, 1, 1]  # 8 model tokens
    assert turn_ratio_bounds(mask, np.array([2, 6, 8]), 100, 0.1, 0.9) == (0.25, 0.75)
    assert turn_ratio_bounds(mask, np.array([6]), 100, 0.1, 0.9) == (0.1, 0.9)  # one cut: any bin snaps to it
    assert turn_ratio_bounds(mask, np.array([6]), 5, 0.1, 0.9) is None


NL, MARK, EOS = 7, 99, 1
# A calling turn (text with a newline at 4, the call markup from 7, EOS at 9), a tool result, a final turn (EOS last).
TURN_IDS = [10, 11, 12, 13, NL, 14, 15, MARK, 16, EOS, 20, 21, 22, 23] + list(range(30, 39)) + [EOS]
TURN_MASK = [1] * 10 + [0] * 4 + [1] * 10  # 20 model tokens; the turn boundary is k = 14 (10 model tokens before)


def turn_planner(**overrides):
    bank = SeedBank()
    ids = np.asarray(TURN_IDS, np.int32)
    bank.add_rollouts([Rollout("r", "a", "", "[]", ids, np.zeros(len(ids), np.float32), 1.0, 0, tool_mask=TURN_MASK)])
    bank.mark_snapshotted()
    newline = overrides.pop("boundary_token_ids", None)
    args = _args(cut_ratio_min=0.1, cut_ratio_max=0.9, **overrides)
    planner = GroupPlanner(args, 4, 64, {EOS}, newline, agent_cuts=([MARK], "any"))
    planner.reset({"pass_rates": {"a": 0.0}})
    return planner, bank


def planned_cuts(planner, bank, steps=60) -> set[int]:
    return {planner.plan(bank, ["a"] * 4, step, 0, 4).cuts[0].k for step in range(1, steps)}


def test_multi_turn_cut_at_newline_keeps_turn_boundaries_and_cuts_after_newlines():
    assert planned_cuts(*turn_planner(boundary_token_ids={NL})) == {5, 14}
    assert planned_cuts(*turn_planner()) > {5, 14}  # without it: anywhere admissible (before the markup at 7)


def test_multi_turn_target_cuts_draw_from_the_bin_nearest_the_target():
    # The prompt's pass rate is 0 and the seed passed: the prior runs from 0 at r = 0 to 1 at r = 1, so the bins
    # nearest 0.5 are [0.3, 0.5] and [0.5, 0.7] (ties: the earlier). Ratios in [0.3, 0.5] aim at 6 to 10 of the 20
    # model tokens, snapped to the admissible 6, 7 (before the markup) or 14 (the turn boundary: 10 model tokens).
    assert planned_cuts(*turn_planner(cut_selection="target")) == {6, 7, 14}
    assert len(planned_cuts(*turn_planner())) > 3


def test_cut_at_newline_and_target_cuts_in_a_tools_run(tmp_path, monkeypatch):
    chosen = []  # each group's bin from cut_selection="target" (None: nothing known yet, drawn uniformly)
    choose = CutOutcomes.choose

    def recording_choose(self, *args):
        chosen.append(choose(self, *args))
        return chosen[-1]

    monkeypatch.setattr(CutOutcomes, "choose", recording_choose)
    dataset = write_jsonl(tmp_path / "traces.jsonl", [trace(0), trace(1)])
    trainer, tokenizer = traces_trainer(
        tmp_path / "run", dataset, cut_at_newline=True, cut_selection="target", max_steps=2
    )
    batches = recorded_run(trainer)
    rows = list(seeded_rows(batches))
    inner = own = 0
    for _, _, seed, cut in rows:
        before = int(seed.completion_ids[cut.k - 1])
        # a turn boundary, or right after a newline in the model's text (the run's own rollouts have no text cuts)
        assert not seed.tool_mask[cut.k - 1] or "\n" in tokenizer.decode([before]), cut
        inner += bool(seed.tool_mask[cut.k - 1])
        own += seed.step != EXTERNAL_STEP
    assert inner and own, (inner, own)
    ratios = [r for batch in batches for r in batch["plan"].group_cut_ratios]
    assert len(chosen) == len(ratios)  # every multi-turn group asked the estimator (none knew anything yet here)
    for bin_range, ratio in zip(chosen, ratios):  # the ratio is drawn in the chosen bin, then snapped
        assert bin_range is None or bin_range[0] <= ratio <= bin_range[1]
    assert logged(trainer, "seeds/target_pass_rate")
