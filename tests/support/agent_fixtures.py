"""Offline agent fixtures: a character tokenizer with Qwen2.5's tool-calling template and a scripted tiny policy."""

from __future__ import annotations

import functools

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from trl.chat_template_utils import qwen2_5_chat_template

from ts_trl.tiny import build_tiny_model, build_tokenizer

SCRIPT_BIAS = 30.0  # added to the scripted token's logit: sampling follows the script, the loss sees the real model
DIGIT = "D"  # a slot of a scripted turn where any digit may be sampled
CALL_TURN = 'Hm D.\n<tool_call>\n{"name": "add", "arguments": {"a": D, "b": D}}\n</tool_call><|im_end|>'
FINAL_TURN = "Sum: DD.<|im_end|>"
TAIL = 400  # tokens of context the script reads


def build_agent_tokenizer():
    """The tiny character tokenizer with `<|im_start|>`/`<|im_end|>` as special tokens and Qwen2.5's chat template."""
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


class ScriptedTurns(LogitsProcessor):
    """Biases each row toward `CALL_TURN` until it holds `calls` tool results, then toward `FINAL_TURN`."""

    def __init__(self, tokenizer, calls: int = 2):
        self.tokenizer, self.calls = tokenizer, calls
        self.digits = [tokenizer.convert_tokens_to_ids(c) for c in "0123456789"]

    def allowed(self, text: str) -> list[int]:
        turn = text.rsplit("<|im_start|>assistant\n", 1)[-1]
        script = CALL_TURN if text.count("<tool_response>") < self.calls else FINAL_TURN
        pieces = script.replace("<|im_end|>", "\0")
        position = len(turn.replace("<|im_end|>", "\0"))
        if position >= len(pieces):
            return [self.tokenizer.eos_token_id]
        expected = pieces[position]
        if expected == DIGIT:
            return self.digits
        if expected == "\0":
            return [self.tokenizer.eos_token_id]
        return [self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(expected))[0]]

    def __call__(self, input_ids, scores):
        # The tail is enough: a turn and the tool results before it (the system prompt lists the tools at length).
        texts = self.tokenizer.batch_decode(input_ids[:, -TAIL:], skip_special_tokens=False)
        bias = torch.zeros_like(scores)
        for row, text in enumerate(texts):
            bias[row, self.allowed(text.replace("<pad>", ""))] = SCRIPT_BIAS
        return scores + bias


def scripted_agent(tokenizer, calls: int = 2, **kwargs):
    """The tiny model whose `generate` follows the script (its own logits decide only the digits)."""
    model = build_tiny_model(tokenizer, max_positions=4096, **kwargs)
    script = ScriptedTurns(tokenizer, calls)
    generate = model.generate

    @functools.wraps(generate)
    def scripted_generate(*args, logits_processor=None, **kw):
        return generate(*args, logits_processor=LogitsProcessorList([*(logits_processor or []), script]), **kw)

    model.generate = scripted_generate
    return model


CALLS = []  # every call of `add`, to count what the tool loop ran


def add(a: int, b: int) -> int:
    """Adds two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    CALLS.append((a, b))
    return a + b


def last_digits_even(completions, **kwargs):
    """1.0 when the final turn's digits sum to an even number: spread on scripted digits."""
    return [float(sum(int(c) for c in m[-1]["content"] if c.isdigit()) % 2 == 0) for m in completions]


def agent_prompts(n: int):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Add {i} and {i + 1}."}]} for i in range(n)])


NO_TURNS = type("NoTurns", (), {"observations": ()})()  # a plain row: no prefix observations


class Counter:
    """A stateful environment: `add` adds to a running total and answers it; the reward is the total's parity."""

    def __init__(self):
        self.total = 0

    def reset(self, **row):
        self.total = 0

    def add(self, a: int, b: int) -> int:
        """Adds two numbers to the running total.

        Args:
            a: The first number.
            b: The second number.
        """
        self.total += a + b
        return self.total

    def get_reward(self) -> float:
        return float(self.total % 2 == 0)


class Drifting(Counter):
    """Answers differently each episode (the total starts at the number of resets so far): no replay matches."""

    resets = 0

    def reset(self, **row):
        Drifting.resets += 1
        self.total = Drifting.resets


class Opaque(Counter):
    """Declares it cannot be restored by replaying its calls."""

    replayable = False


async def async_add(a: int, b: int) -> int:
    """Adds two numbers, asynchronously.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def failing_add(a: int, b: int) -> int:
    """Adds two numbers, or rather fails to.

    Args:
        a: The first number.
        b: The second number.
    """
    raise RuntimeError("no adding today")


def scripted_fake_llm(tokenizer, calls: int = 1):
    """`tests.support.vllm_server.FakeLLM` answering with the script (digits drawn reproducibly per request), for TRL's
    colocate mode; it keeps the fake's records and its context check."""
    import random
    from types import SimpleNamespace

    from tests.support.vllm_server import FakeLLM, context_error

    script = ScriptedTurns(tokenizer, calls)

    class ScriptedFakeLLM(FakeLLM):
        def generate(self, prompts, sampling_params=None, use_tqdm=True):
            params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
            outputs = []
            for prompt, param in zip(prompts, params):
                ids = [int(t) for t in prompt["prompt_token_ids"]]
                self.requests.append({"prompt_token_ids": ids, "max_tokens": param.max_tokens, "n": param.n})
                error = context_error(len(ids), param.max_tokens, self.max_model_len)
                if error:
                    raise ValueError(error)
                samples = []
                for index in range(param.n):
                    rng = random.Random(len(self.requests) * 1000 + index)
                    tokens: list[int] = []
                    while len(tokens) < param.max_tokens:
                        allowed = script.allowed(tokenizer.decode(ids[-TAIL:] + tokens, skip_special_tokens=False))
                        tokens.append(rng.choice(allowed))
                        if tokens[-1] == tokenizer.eos_token_id:
                            break
                    logprobs = [{t: SimpleNamespace(logprob=-0.5, rank=1)} for t in tokens]
                    samples.append(SimpleNamespace(token_ids=tokens, logprobs=logprobs))
                outputs.append(SimpleNamespace(prompt_token_ids=ids, outputs=samples))
            return outputs

    return ScriptedFakeLLM


def scripted_sampler(tokenizer, calls: int = 1):
    """A stand-in for `tests.support.vllm_server.sample_completion` that follows the script (digits drawn per request)."""
    import random

    script = ScriptedTurns(tokenizer, calls)

    def sample(prompt_ids, index, max_tokens, token_ids=None, eos_token_id=None):
        rng = random.Random(hash((tuple(prompt_ids[-TAIL:]), index)))
        tokens: list[int] = []
        while len(tokens) < max_tokens:
            allowed = script.allowed(tokenizer.decode(list(prompt_ids[-TAIL:]) + tokens, skip_special_tokens=False))
            tokens.append(rng.choice(allowed))
            if tokens[-1] == tokenizer.eos_token_id:
                break
        return tokens

    return sample


def scripted_generate_batch(model, tokenizer):
    """Gives the scripted agent a stand-in for transformers' `generate_batch` (continuous batching), whose engine
    applies no custom logits processor: the prompts are decoded together by the scripted `generate` (left-padded),
    within the generation config's `max_new_tokens`, each up to its first EOS. Returns the list every request
    (prompt ids, max_new_tokens) goes to."""
    from types import SimpleNamespace

    requests = []

    def generate_batch(inputs, generation_config=None, continuous_batching_config=None, **kwargs):
        rows = [[int(t) for t in ids] for ids in inputs]
        requests.extend({"prompt_ids": ids, "max_new_tokens": generation_config.max_new_tokens} for ids in rows)
        width = max(map(len, rows))
        padded = torch.tensor([[tokenizer.pad_token_id] * (width - len(ids)) + ids for ids in rows])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in rows])
        out = model.generate(input_ids=padded, attention_mask=mask, generation_config=generation_config)
        outputs = {}
        for index, tokens in enumerate(out[:, width:].tolist()):
            end = next((j + 1 for j, t in enumerate(tokens) if t == tokenizer.eos_token_id), len(tokens))
            outputs[f"req_{index}"] = SimpleNamespace(generated_tokens=tokens[:end])
        return outputs

    model.generate_batch = generate_batch
    return requests
