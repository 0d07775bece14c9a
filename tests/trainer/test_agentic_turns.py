"""Cut points and prefix turns of multi-turn seeds (`ts_trl.method.turns`), on hand-written trajectories."""

import numpy as np
import pytest

from ts_trl.method.turns import admissible_cuts, choose_turn_cut, draw_turn_cut, prefix_turns, runs

EOS, M1, M2 = 99, 50, 51
# A calling turn (text, the call markup M1 M2, its arguments, EOS), a tool result, a final turn (text, EOS).
IDS = [10, 11, M1, M2, 12, EOS, 20, 21, 22, 13, 14, EOS]
MASK = [1] * 6 + [0] * 3 + [1] * 3
MESSAGES = [
    {
        "role": "assistant",
        "content": "ab",
        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
    },
    {"role": "tool", "name": "add", "content": "3"},
    {"role": "assistant", "content": "cd"},
]


def test_runs():
    assert runs(MASK) == [(0, 6, True), (6, 9, False), (9, 12, True)]
    assert runs([]) == []


def test_admissible_cuts_stay_out_of_tool_results_and_call_markup():
    assert admissible_cuts(IDS, MASK, {EOS}, [M1, M2], "any").tolist() == [1, 2, 9, 10, 11]
    assert admissible_cuts(IDS, MASK, {EOS}, [M1, M2], "turns").tolist() == [9]
    # markup not found in a calling turn: no cut inside that turn
    assert admissible_cuts(IDS, MASK, {EOS}, [77], "any").tolist() == [9, 10, 11]
    assert admissible_cuts(IDS, MASK, {EOS}, None, "any").tolist() == [9, 10, 11]


def test_admissible_cuts_refuse_bad_input():
    with pytest.raises(ValueError, match="agent_cut_points"):
        admissible_cuts(IDS, MASK, {EOS}, None, "middle")
    with pytest.raises(ValueError, match="tool mask"):
        admissible_cuts(IDS, MASK[:-1], {EOS}, None, "any")


def test_cut_ratio_counts_model_tokens_and_snaps():
    allowed = admissible_cuts(IDS, MASK, {EOS}, [M1, M2], "any")
    # 9 model tokens: r=0.5 asks for 4 of them; admissible points hold 1, 2, 6, 7, 8; 2 is nearest (ties go early)
    assert choose_turn_cut(MASK, 0.5, allowed, budget=100).k == 2
    assert choose_turn_cut(MASK, 0.7, allowed, budget=100).k == 9  # 6 model tokens: right after the tool result
    assert choose_turn_cut(MASK, 0.7, allowed, budget=3).k == 2  # the budget leaves room only for early cuts
    assert choose_turn_cut(MASK, 0.7, allowed, budget=1) is None


def test_draw_turn_cut_draws_nothing_when_nothing_fits():
    rng = np.random.default_rng(0)
    allowed = admissible_cuts(IDS, MASK, {EOS}, None, "turns")
    state = rng.bit_generator.state
    assert draw_turn_cut(MASK, rng, 0.1, 0.9, allowed, budget=5) is None
    assert rng.bit_generator.state == state
    assert draw_turn_cut(MASK, rng, 0.1, 0.9, allowed, budget=50).k == 9


def test_prefix_turns_split_the_recorded_messages():
    after = prefix_turns(MASK, 10, MESSAGES)
    assert after.messages == MESSAGES[:2]
    assert after.tool_calls == [{"name": "add", "arguments": {"a": 1, "b": 2}}]
    assert after.observations == ["3"]
    assert after.partial_start == 9
    assert prefix_turns(MASK, 9, MESSAGES).partial_start == 9
    before = prefix_turns(MASK, 2, MESSAGES)
    assert before.messages == [] and before.tool_calls == [] and before.partial_start == 0
    with pytest.raises(ValueError, match="no tool calls"):
        prefix_turns(MASK, 10, MESSAGES[2:])
    with pytest.raises(ValueError, match="tool-calling turns"):
        prefix_turns(MASK, 10, [])


def test_tool_call_markup_is_found_from_the_chat_template():
    from tests.support.agent_fixtures import build_agent_tokenizer
    from ts_trl.trainer.agentic import tool_call_markup_ids

    tokenizer = build_agent_tokenizer()
    assert tokenizer.decode(tool_call_markup_ids(tokenizer)) == "<tool_call>"
    # The embedded agent tasks' template: the call follows the turn's header on its line ("A: [add a=1 b=2]").
    from ts_trl.embedded.agent import build_agent_tokenizer as embedded_agent_tokenizer

    assert embedded_agent_tokenizer().decode(tool_call_markup_ids(embedded_agent_tokenizer())) == "["
