"""Local stand-ins for vLLM, enough for TRL 1.16's real vLLM paths during training: `LocalVLLMServer` for server mode
and `FakeLLM` / `FakeSamplingParams` for colocate mode.

`trl vllm-serve` (TRL 1.16) starts `vllm serve` with TRL's flags (NCCL weight transfer, processed log-probs), and
`trl.generation.vllm_client.VLLMClient` talks to it over HTTP. `LocalVLLMServer` answers the routes that client calls
while a trainer runs: `/health`, `/v1/models`, `/server_info`, `/get_world_size`, the weight-sync handshake
(`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`, `/finish_weight_update`),
`/reset_prefix_cache` and `/v1/completions`. It records every request body as received, bytes and parsed JSON.

Completions come from a deterministic rule (`sample_completion`), not a model: the same prompt and sample index give
the same tokens, and each token's log-prob encodes its position and id (`rule_logprob`), so a test can check where
every returned log-prob ended up. Like vLLM's server, a request whose prompt plus `max_tokens` exceeds `max_model_len`
is refused with status 400.

What these stand-ins cannot check (it needs CUDA and vLLM): the NCCL rendezvous and weight broadcast (the tests swap
the client's NCCL endpoint for `FakeWeightReceiver`, which takes the tensors in-process), vLLM's sampling, and its
real request validation beyond the length check.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import threading
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace
from urllib.parse import urlsplit

from tests.support.loopback import LoopbackServer

EOS_PROBABILITY = 0.1  # per generated token: some completions stop early, so lengths vary within a group


def rule_logprob(position: int, token_id: int) -> float:
    """The log-prob the stand-ins report for `token_id` at `position` of a completion (distinct per pair)."""
    return -0.01 * (position + 1) - 1e-5 * token_id


def sample_completion(
    prompt_ids: list[int], index: int, max_tokens: int, token_ids: range, eos_token_id: int
) -> list[int]:
    """Up to `max_tokens` tokens, a pure function of the prompt and the sample index; EOS, when drawn, ends it."""
    seed = hashlib.sha256(json.dumps([prompt_ids, index]).encode()).digest()
    rng = random.Random(seed)
    tokens = []
    while len(tokens) < max_tokens:
        if rng.random() < EOS_PROBABILITY:
            tokens.append(eos_token_id)
            break
        tokens.append(rng.choice(token_ids))
    return tokens


def context_error(prompt_len: int, max_tokens: int, max_model_len: int) -> str | None:
    """vLLM's refusal of a request that cannot fit its context (None when it fits)."""
    if prompt_len + max_tokens <= max_model_len:
        return None
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, you requested {max_tokens} "
        f"output tokens and your prompt contains {prompt_len} input tokens, for a total of "
        f"{prompt_len + max_tokens} tokens."
    )


class LocalVLLMServer(LoopbackServer):
    """A `trl vllm-serve` stand-in on a local port; thread-safe. Point `vllm_server_base_url` at `endpoint`."""

    def __init__(self, token_ids: range, eos_token_id: int, max_model_len: int, model: str = "tiny-local"):
        self.token_ids, self.eos_token_id, self.max_model_len, self.model = (
            token_ids,
            eos_token_id,
            max_model_len,
            model,
        )
        self.requests: list[tuple[str, str, bytes]] = []  # (method, path, raw body) of every request, in order
        self.completions: list[dict] = []  # parsed bodies of the /v1/completions requests
        self.weight_updates: list[dict] = []  # `update_info` of each /update_weights: what the client announced
        self.received_weights: list[list[str]] = []  # names streamed by `FakeWeightReceiver`, one list per update
        self.answers: dict[tuple, list[list[int]]] = {}  # prompt ids -> every completion sent back for it
        self.refused: list[str] = []  # error messages of refused requests
        self.unknown: list[tuple[str, str]] = []  # requests no route matched: the client needs an endpoint we lack
        self._lock = threading.RLock()
        super().__init__(_make_handler(self), name="local-vllm")

    def paths(self) -> list[str]:
        with self._lock:
            return [path for _, path, _ in self.requests]

    # -- routing ---------------------------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, body: bytes) -> tuple[int, dict]:
        path = urlsplit(raw_path).path
        with self._lock:
            self.requests.append((method, path, body))
        payload = json.loads(body) if body else {}
        routes = {
            ("GET", "/health"): lambda _: {},
            ("GET", "/v1/models"): self._models,
            ("GET", "/server_info"): self._server_info,
            ("GET", "/get_world_size"): lambda _: {"world_size": 1},
            ("POST", "/init_weight_transfer_engine"): lambda _: {},
            ("POST", "/start_weight_update"): lambda _: {},
            ("POST", "/update_weights"): self._update_weights,
            ("POST", "/finish_weight_update"): lambda _: {},
            ("POST", "/reset_prefix_cache"): lambda _: {"success": True},
            ("POST", "/v1/completions"): self._completions,
        }
        route = routes.get((method, path))
        if route is None:
            with self._lock:
                self.unknown.append((method, raw_path))
            return 404, {"error": f"The local vLLM server does not implement {method} {path}"}
        try:
            return 200, route(payload)
        except ValueError as error:
            with self._lock:
                self.refused.append(str(error))
            return 400, {"object": "error", "message": str(error), "type": "BadRequestError", "code": 400}

    def _models(self, _):
        return {"object": "list", "data": [{"id": self.model, "object": "model", "max_model_len": self.max_model_len}]}

    def _server_info(self, _):
        return {
            "vllm_config": {
                "model_config": {
                    "model": self.model,
                    "max_model_len": self.max_model_len,
                    "logprobs_mode": "processed_logprobs",
                },
                "weight_transfer_config": {"backend": "nccl"},
            }
        }

    def _update_weights(self, payload):
        with self._lock:
            self.weight_updates.append(payload["update_info"])
        return {}

    def _completions(self, payload):
        if payload.get("model") != self.model:
            raise ValueError(f"The model `{payload.get('model')}` does not exist.")
        with self._lock:
            self.completions.append(payload)
        n, max_tokens, prompts = payload["n"], payload["max_tokens"], payload["prompt"]
        for prompt in prompts:
            if not all(isinstance(t, int) for t in prompt):
                raise ValueError("prompt token ids must be integers")
            error = context_error(len(prompt), max_tokens, self.max_model_len)
            if error:
                raise ValueError(error)
        choices = []
        for prompt in prompts:
            for index in range(n):
                tokens = sample_completion(prompt, index, max_tokens, self.token_ids, self.eos_token_id)
                with self._lock:
                    self.answers.setdefault(tuple(prompt), []).append(tokens)
                logprobs = [rule_logprob(p, t) for p, t in enumerate(tokens)]
                names = [f"token_id:{t}" for t in tokens]
                choices.append(
                    {
                        "index": len(choices),
                        "text": "",
                        "prompt_token_ids": prompt,
                        "token_ids": tokens,
                        "finish_reason": "stop" if tokens and tokens[-1] == self.eos_token_id else "length",
                        "logprobs": {
                            "tokens": names,
                            "token_logprobs": logprobs,
                            "top_logprobs": [{name: lp} for name, lp in zip(names, logprobs)],
                            "text_offset": [0] * len(tokens),
                        },
                    }
                )
        return {"id": "cmpl-local", "object": "text_completion", "model": self.model, "choices": choices}


class FakeWeightReceiver:
    """Takes the place of vLLM's NCCL trainer endpoint and packed broadcast: it consumes the streamed tensors, as
    the broadcast would, and records their names in `sink` (the server's `received_weights` when in-process)."""

    def __init__(self, sink: list):
        self.sink = sink
        self.group = SimpleNamespace(store=None, socket=None)  # what `VLLMClient.close_communicator` clears

    def open_endpoint(self, init_info: dict) -> FakeWeightReceiver:
        return self

    def broadcast(self, iterator, group, src, post_iter_func):
        self.sink.append([name for name, _ in iterator])


def pretend_vllm_is_installed(setattr_, receiver: FakeWeightReceiver | None = None) -> None:
    """Makes TRL 1.16's vLLM backend run without vLLM: `setattr_(obj, name, value, raising=...)` is pytest's
    `monkeypatch.setattr` in tests, a plain setter under `accelerate launch`.

    TRL reads `is_vllm_available` where its vLLM modules look it up; in server mode the client's vLLM imports are
    its NCCL pieces (`get_ip`, the trainer endpoint, the packed broadcast), replaced by `receiver`, and
    `init_communicator` is handed the device "cuda" so that its CUDA check passes on a CPU run. Colocate mode's `LLM`
    and `SamplingParams` become `FakeLLM` and `FakeSamplingParams`.
    """
    import trl.generation.vllm_client as client
    import trl.generation.vllm_generation as generation

    setattr_(generation, "is_vllm_available", _available)
    setattr_(generation, "LLM", FakeLLM, raising=False)
    setattr_(generation, "SamplingParams", FakeSamplingParams, raising=False)
    setattr_(client, "is_vllm_available", _available)
    receiver = receiver or FakeWeightReceiver([])
    setattr_(client, "get_ip", lambda: "127.0.0.1", raising=False)
    setattr_(client, "_HAS_STATEFUL_TRAINER_ENGINE", True)
    setattr_(client, "_HAS_RESET_PREFIX_CACHE_SUCCESS", True)
    setattr_(client, "open_trainer_endpoint", receiver.open_endpoint, raising=False)
    setattr_(client, "packed_nccl_broadcast_producer", receiver.broadcast, raising=False)
    init_communicator = client.VLLMClient.init_communicator
    setattr_(client.VLLMClient, "init_communicator", lambda self, device=0: init_communicator(self, "cuda"))


def _available(*args, **kwargs) -> bool:
    return True


def _make_handler(server: LocalVLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, payload = server.handle(self.command, self.path, body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve

        def log_message(self, format, *args):  # noqa: A002 - the base class's signature
            pass

    return Handler


# -- colocate mode -----------------------------------------------------------------------------------------------


class FakeSamplingParams:
    """vLLM's `SamplingParams` as far as TRL and the trainer use it: keyword fields, copyable."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def clone(self) -> FakeSamplingParams:
        return copy.copy(self)


class FakeLLM:
    """vLLM's offline `LLM` as TRL's colocate mode drives it; records every request (prompt ids, max_tokens, n).

    Like vLLM, it takes one `SamplingParams` for all prompts or a list with one per prompt, and refuses a prompt whose
    length plus `max_tokens` exceeds `max_model_len`.
    """

    default_max_model_len = 512
    token_ids = range(4, 100)  # the tiny tokenizer's characters (ids 0-3 are special)
    eos_token_id = 1
    instances: list[FakeLLM] = []  # every engine built, newest last

    def __init__(self, model=None, max_model_len=None, **kwargs):
        self.init_kwargs = {"model": model, "max_model_len": max_model_len, **kwargs}
        self.max_model_len = max_model_len or self.default_max_model_len
        self.requests: list[dict] = []  # one per prompt: {"prompt_token_ids", "max_tokens", "n"}
        self.answers: dict[tuple, list[list[int]]] = {}  # prompt ids -> every completion sent back for it
        self.loaded_weights: list[str] = []
        self.prefix_cache_resets = 0
        runner = SimpleNamespace(model=SimpleNamespace(load_weights=self._load_weights))
        executor = SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner))
        self.llm_engine = SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=self.max_model_len), model_executor=executor
        )
        FakeLLM.instances.append(self)

    def _load_weights(self, weights):
        self.loaded_weights.extend(name for name, _ in weights)

    def reset_prefix_cache(self):
        self.prefix_cache_resets += 1

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        outputs = []
        for prompt, param in zip(prompts, params):
            ids = prompt["prompt_token_ids"]
            self.requests.append({"prompt_token_ids": list(ids), "max_tokens": param.max_tokens, "n": param.n})
            error = context_error(len(ids), param.max_tokens, self.max_model_len)
            if error:
                raise ValueError(error)
            samples = []
            for index in range(param.n):
                # Each request draws afresh (vLLM samples every request independently), yet reproducibly.
                draw = len(self.requests) * param.n + index
                plain_ids = [int(t) for t in ids]
                tokens = sample_completion(plain_ids, draw, param.max_tokens, self.token_ids, self.eos_token_id)
                self.answers.setdefault(tuple(plain_ids), []).append(tokens)
                logprobs = [{t: SimpleNamespace(logprob=rule_logprob(p, t), rank=1)} for p, t in enumerate(tokens)]
                samples.append(SimpleNamespace(token_ids=tokens, logprobs=logprobs))
            outputs.append(SimpleNamespace(prompt_token_ids=list(ids), outputs=samples))
        return outputs
