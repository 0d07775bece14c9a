"""`trainer.train()` with `use_vllm=True` on CPU: server mode through TRL's real `VLLMClient` against a local HTTP
stand-in for `trl vllm-serve`, colocate mode against a fake vLLM `LLM` (both in `tests/support/vllm_server.py`).

vLLM is not installed here and is never imported. TRL is told it is available by patching its `is_vllm_available`
where TRL's vLLM modules look it up; in server mode the client's NCCL pieces (`get_ip`, the trainer endpoint and the
packed broadcast, all vLLM imports) are replaced by `FakeWeightReceiver`, and `init_communicator` is handed the device
`"cuda"` so that its CUDA check passes on a CPU run. Everything else the client does (health check, model lookup,
server info, world size, the weight-sync handshake, prefix-cache resets, the completions request and the parsing of
its answer) runs as in training on a GPU.

A real vLLM engine on CPU runs in tests/trainer/test_vllm_real.py (marker `vllm`, in the virtualenv of .ci/vllm-cpu-env):
vLLM's own sampling, log-probs, request validation, prefix cache and weight loading. These fakes stay for what that
engine cannot show or the default suite cannot afford: the NCCL weight transfer of server mode (TRL's client refuses a
non-CUDA device, so only a fake receiver lets the handshake and streamed names be checked), several ranks sharing one
server, and a deterministic engine whose every log-prob is known (`rule_logprob`), so that budgets and log-probs are
checked exactly in the default suite, without vLLM's 4 GB install. Still untested anywhere here: the NCCL rendezvous
and broadcast themselves, sleep mode and tensor-parallel colocate.
"""

import json
import os

import numpy as np
import pytest

from tests.conftest import RANKS, TARGET_CUTS, TINY_SETTINGS, assert_target_cuts, seed_rows
from tests.support.ranks import run_on_two_ranks
from tests.support.vllm_server import (
    FakeLLM,
    FakeWeightReceiver,
    LocalVLLMServer,
    pretend_vllm_is_installed,
    rule_logprob,
)

MAX_COMPLETION_LENGTH = TINY_SETTINGS["max_completion_length"]
# The engine's context: the longest tiny prompt ("Q: 7+8=", 7 tokens) plus the budget, and nothing more. A seeded
# request that still asked for the whole budget after its prefix would not fit.
MAX_MODEL_LEN = 7 + MAX_COMPLETION_LENGTH


@pytest.fixture
def vllm_server(monkeypatch, tokenizer):
    """A local `trl vllm-serve` stand-in, with TRL's client convinced that vLLM is installed (see module docstring)."""
    server = LocalVLLMServer(range(4, len(tokenizer)), tokenizer.eos_token_id, MAX_MODEL_LEN).start()
    pretend_vllm_is_installed(monkeypatch.setattr, FakeWeightReceiver(server.received_weights))
    yield server
    server.stop()


@pytest.fixture
def fake_llm(monkeypatch):
    """vLLM's `LLM` and `SamplingParams` replaced by recording fakes in TRL's colocate backend."""
    pretend_vllm_is_installed(monkeypatch.setattr)
    # TRL's colocate set-up writes the rendezvous variables into os.environ; restore them after the test.
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:  # recorded as absent, so that teardown removes what TRL sets
            monkeypatch.setenv(name, "")
            monkeypatch.delenv(name)
    FakeLLM.instances.clear()
    yield FakeLLM
    FakeLLM.instances.clear()


def _check_rollouts(tokenizer, output_dir, requests, answers, settings) -> list[dict]:
    """Checks every banked rollout against the engine requests: its spliced prompt was sent with the budget its
    prefix leaves, its continuation is what the engine answered, and each log-prob sits on the token it belongs to.

    `requests` maps a prompt (tuple of ids) to the set of `max_tokens` it was sent with, `answers` to the
    completions the engine returned for it.
    """
    rows = seed_rows(output_dir)
    by_id = {row["rollout_id"]: row for row in rows}
    seeded = 0
    for row in rows:
        k = row["prefix_len"]
        ids, logprobs = row["completion_ids"], row["logprobs"]
        prompt = tuple(tokenizer(text=[row["prompt"]])["input_ids"][0]) + tuple(ids[:k])
        assert requests.get(prompt) == {MAX_COMPLETION_LENGTH - k}, (prompt, k, requests.get(prompt))
        assert len(prompt) + MAX_COMPLETION_LENGTH - k <= MAX_MODEL_LEN
        continuation = ids[k:]
        assert continuation in answers[prompt]  # whole: the budget was asked for, not cut afterwards
        expected = [rule_logprob(p, t) for p, t in enumerate(continuation)]
        np.testing.assert_allclose(logprobs[k:], expected, rtol=1e-6)
        if k:
            seeded += 1
            origin = by_id.get(row["seed_origin"])
            if origin is not None:  # a seed from this run: the prefix keeps its stored behaviour log-probs
                assert origin["completion_ids"][:k] == ids[:k]
                np.testing.assert_allclose(logprobs[:k], origin["logprobs"][:k], rtol=1e-6)
    if settings["seed_fraction"] > 0:
        assert seeded > 0, "no group was seeded: the test would not see a per-request budget"
        assert len({b for budgets in requests.values() for b in budgets}) > 1
    else:
        assert seeded == 0
    return rows


CASES = [
    pytest.param({"seed_fraction": 0.5, "prefix_mode": "state"}, id="seeded-state"),
    pytest.param({"seed_fraction": 1.0, "prefix_mode": "action"}, id="seeded-action"),
    # With the switches of research/target-cuts.md on (in server and colocate mode alike), in both prefix modes.
    pytest.param({"seed_fraction": 1.0, "prefix_mode": "action", **TARGET_CUTS}, id="seeded-action-target-cuts"),
    pytest.param({"seed_fraction": 1.0, "prefix_mode": "state", **TARGET_CUTS}, id="seeded-state-target-cuts"),
    pytest.param({"seed_fraction": 0.0, "prefix_mode": "state"}, id="unseeded"),
]


# A fake server: TRL's weight transfer to a server is NCCL only, so no CPU server could take the weight sync.
@pytest.mark.parametrize("settings", CASES)
def test_server_mode_sends_spliced_prompts_with_their_budgets(settings, vllm_server, make_trainer):
    trainer = make_trainer(use_vllm=True, vllm_mode="server", vllm_server_base_url=vllm_server.endpoint, **settings)
    trainer.train()

    assert any("loss" in h for h in trainer.state.log_history)
    _check_server(vllm_server, trainer.processing_class, trainer.args.output_dir, trainer.state.global_step, settings)
    if "cut_selection" in settings:
        assert_target_cuts(trainer)


def _check_server(server, tokenizer, output_dir, steps, settings) -> list[dict]:
    """What the server received over a run of `steps` steps, checked against the banked rollouts; returns them."""
    assert server.unknown == [] and server.refused == []
    # Every body arrived as the JSON the client meant: plain ints, nothing lost or coerced on the way.
    bodies = [body for _, path, body in server.requests if path == "/v1/completions"]
    assert bodies and len(bodies) >= steps
    for body in bodies:
        assert json.dumps(json.loads(body), allow_nan=False).encode() == body
    requests = {}
    for completion in server.completions:
        assert completion["n"] == TINY_SETTINGS["num_generations"]
        for prompt in completion["prompt"]:
            requests.setdefault(tuple(prompt), set()).add(completion["max_tokens"])
    rows = _check_rollouts(tokenizer, output_dir, requests, server.answers, settings)
    # The weight sync ran its handshake once per step, announcing exactly the tensors the broadcast then streamed.
    assert server.paths().count("/init_weight_transfer_engine") == 1
    assert len(server.weight_updates) == steps
    if server.received_weights:  # in-process only: under `accelerate launch` the broadcast ends in the rank
        assert len(server.received_weights) == steps
        for announced, streamed in zip(server.weight_updates, server.received_weights):
            assert announced["names"] == streamed and streamed
    assert server.paths().count("/reset_prefix_cache") == steps
    return rows


# A fake server: two ranks on CPU, with the NCCL weight transfer replaced as above.
@RANKS
def test_server_mode_on_two_ranks_budgets_every_ranks_rows(vllm_server, tokenizer, tmp_path):
    """The main process sends the prompts of both ranks; each must carry the budget of its own rank's cut, also at
    steps where the main process itself has nothing seeded."""
    output_dir = tmp_path / "run"
    settings = {"seed_fraction": 0.5, "prefix_mode": "state"}
    options = [f"--{key}={value}" for key, value in settings.items()]
    run_on_two_ranks("vllm_launch.py", "--endpoint", vllm_server.endpoint, "--output_dir", str(output_dir), *options)
    rows = _check_server(vllm_server, tokenizer, output_dir, TINY_SETTINGS["max_steps"], settings)
    # Some step seeded rank 1's group but not rank 0's (rows 0-3 are rank 0's, 4-7 rank 1's).
    by_step = {}
    for row in rows:
        step, _, index = row["rollout_id"].rsplit("-", 3)[1:]
        by_step.setdefault(step, {})[int(index) // 4] = row["prefix_len"] > 0
    assert any(not ranks.get(0) and ranks.get(1) for ranks in by_step.values()), by_step


# A fake engine: exact log-probs and the target-cut switches in the default suite (the real engine's run is in
# tests/trainer/test_vllm_real.py). Unseeded colocate is TRL's own path: the server case covers it.
@pytest.mark.parametrize("settings", [case for case in CASES if case.id != "unseeded"])
def test_colocate_mode_sends_spliced_prompts_with_their_budgets(settings, fake_llm, make_trainer):
    trainer = make_trainer(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=MAX_MODEL_LEN, **settings)
    trainer.train()

    (llm,) = fake_llm.instances
    assert any("loss" in h for h in trainer.state.log_history)
    requests = {}
    for request in llm.requests:
        assert all(type(t) is int for t in request["prompt_token_ids"]), request["prompt_token_ids"]
        assert request["n"] == 1
        requests.setdefault(tuple(request["prompt_token_ids"]), set()).add(request["max_tokens"])
    _check_rollouts(trainer.processing_class, trainer.args.output_dir, requests, llm.answers, settings)
    assert llm.loaded_weights and llm.prefix_cache_resets == trainer.state.global_step
    if "cut_selection" in settings:
        assert_target_cuts(trainer)


# A fake engine: the refusal comes before training, from the engine's max_model_len alone.
def test_colocate_mode_refuses_prompts_the_engine_cannot_hold_before_training(fake_llm, make_trainer):
    with pytest.raises(
        ValueError, match=r"exceeds the vLLM engine's max_model_len=18\. .*raise vllm_max_model_length"
    ):
        make_trainer(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=MAX_MODEL_LEN - 1)
