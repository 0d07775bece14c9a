"""Step time of `SeedGRPOTrainer` against TRL's `GRPOTrainer`, with the trainers' steps interleaved in one process.

Every trainer runs its real `train()` in a thread of its own; a conductor lets exactly one thread work at a time and
hands the turn on after each optimizer step, in a freshly shuffled order every round. So each round holds one step
of every trainer, taken within seconds of each other: load drift on a shared machine hits all of them alike, and the
per-round ratio `t(variant) / t(GRPO)` cancels it. Each trainer keeps its own torch/NumPy/`random` RNG state across
the hand-overs, so its run is the one it would have made alone (checked: `seed_fraction=0` generates exactly the
tokens GRPO generates).
"""

from __future__ import annotations

import random
import threading
import time
import traceback

import numpy as np
import torch
from transformers import PrinterCallback, ProgressCallback, TrainerCallback

BASELINE = "grpo"


def parity_reward(completions, **kwargs):
    """A cheap reward with spread on random text (the tests' `count_reward`): the cost of the step stays the model's."""
    return [float(sum(ch.isdigit() for ch in c) % 2 == 0) for c in completions]


class Conductor:
    """Lets one registered thread run at a time; `pass_turn` hands over to the next in a shuffled order per round."""

    def __init__(self, names, seed: int = 0):
        self._cond = threading.Condition()
        self._active = list(names)
        self._order: list[str] = []
        self._current: str | None = None
        self._rng = random.Random(seed)
        self.round = 0

    def start(self) -> None:
        with self._cond:
            self._advance()

    def _advance(self) -> None:  # with the lock held
        if not self._order and self._active:
            self._order = list(self._active)
            self._rng.shuffle(self._order)
            self.round += 1
        self._current = self._order.pop(0) if self._order else None
        self._cond.notify_all()

    def wait_turn(self, name: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._current == name)

    def pass_turn(self, name: str) -> None:
        with self._cond:
            assert self._current == name
            self._advance()

    def leave(self, name: str) -> None:
        with self._cond:
            self._active.remove(name)
            if name in self._order:
                self._order.remove(name)
            if self._current == name:
                self._advance()


class _RngState:
    """The global RNG states a trainer's sampling and shuffling read: saved when it hands over, restored when it resumes."""

    def __init__(self):
        self.state = None

    def save(self) -> None:
        self.state = (torch.get_rng_state(), np.random.get_state(), random.getstate())

    def restore(self) -> None:
        if self.state is not None:
            torch.set_rng_state(self.state[0])
            np.random.set_state(self.state[1])
            random.setstate(self.state[2])


class _Turns(TrainerCallback):
    """Times each turn (log of the previous step + one whole step) and hands the turn over after the optimizer step."""

    def __init__(self, name: str, conductor: Conductor):
        self.name, self.conductor = name, conductor
        self.rng = _RngState()
        self.wall: list[float] = []  # per turn, seconds
        self.cpu: list[float] = []  # process CPU seconds (all threads; only this trainer's thread is working)
        self.logs: list[dict] = []
        self._t0 = self._c0 = None

    def begin_turn(self) -> None:
        self.conductor.wait_turn(self.name)
        self.rng.restore()
        self._t0, self._c0 = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        self.wall.append(time.perf_counter() - self._t0)
        self.cpu.append(time.process_time() - self._c0)
        self.rng.save()
        self.conductor.pass_turn(self.name)
        self.begin_turn()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "step_time" in logs:
            self.logs.append(dict(logs, step=state.global_step))


class _GenerateSpy:
    """Wraps `model.generate` to record the new tokens each call decodes (padding and discarded tokens included)."""

    def __init__(self, model):
        self.calls: list[dict] = []
        self._generate = model.generate
        model.generate = self

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        output = self._generate(*args, **kwargs)
        prompt = kwargs["input_ids"]
        self.calls.append(
            {
                "seconds": time.perf_counter() - start,
                "rows": prompt.size(0),
                "prompt_width": prompt.size(1),
                "new_tokens": output.size(1) - prompt.size(1),
            }
        )
        return output


def even_last_digit_reward(completions, **kwargs):
    """The chat-add task's reward without its answers: 1.0 for a reply with an even last digit (spread on any text)."""
    texts = [c[-1]["content"] for c in completions]
    return [float(bool(d := [ch for ch in t if ch.isdigit()]) and int(d[-1]) % 2 == 0) for t in texts]


def _variants(quick: bool) -> dict[str, dict]:
    variants = {
        BASELINE: {"trainer": "grpo"},
        "seeds_f0": {"trainer": "seeds", "seed_fraction": 0.0},
        "seeds_f0.5": {"trainer": "seeds", "seed_fraction": 0.5},
        "seeds_f1": {"trainer": "seeds", "seed_fraction": 1.0},
    }
    return variants


def _build(name: str, spec: dict, settings: dict, output_dir: str):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
    from ts_trl.tiny import build_tiny_model, build_tokenizer

    real = settings.get("model") == "smollm2"
    tokenizer = None if real else build_tokenizer()
    common = dict(
        output_dir=f"{output_dir}/{name}",
        per_device_train_batch_size=settings["batch_size"],
        num_generations=settings["num_generations"],
        max_completion_length=settings["max_completion_length"],
        max_steps=settings["warmup_steps"] + settings["measured_steps"],
        save_strategy="no",  # checkpoint I/O is measured by the bank benchmark, not mixed into step times
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        bf16=False,  # fp32: seed_fraction=0 reproduces GRPO up to rounding (bf16 autocast rounds the packed and
        # the padded forward of the shared-prefix pass differently, enough to flip a sampled token)
        seed=0,
        disable_tqdm=True,
    )
    if spec["trainer"] == "grpo":
        trainer_cls, args = GRPOTrainer, GRPOConfig(**common)
    else:
        trainer_cls = SeedGRPOTrainer
        # Seeds from the previous step on, without waiting for a snapshot (no checkpoints are written here).
        args = SeedGRPOConfig(**common, seed_fraction=spec["seed_fraction"], seed_snapshot_only=False)
    if real:  # SmolLM2-135M-Instruct with the recipe's LoRA adapter, on chat-add's prompts
        from peft import LoraConfig

        from ts_trl import smollm2_135m_instruct
        from ts_trl.embedded.chat_add import ChatAddTask

        prompts = ChatAddTask().make_splits(settings["num_prompts"], 1)[0]["prompt"]
        model, reward = smollm2_135m_instruct(), even_last_digit_reward
        extra = {"peft_config": LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")}
    else:
        prompts = [f"Q: {i}+{i + 1}=" for i in range(settings["num_prompts"])]
        model, reward, extra = build_tiny_model(tokenizer), parity_reward, {}
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        **extra,
    )
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    return trainer


def _summary(values) -> dict:
    values = [float(v) for v in values]
    q = np.quantile(values, [0.25, 0.5, 0.75]) if values else [float("nan")] * 3
    return {"median": float(q[1]), "q25": float(q[0]), "q75": float(q[2]), "n": len(values)}


def train_interleaved(conductor: Conductor, trainers: dict, turns: dict, label: str) -> float:
    """Trains every trainer on its own thread, their steps taken in the conductor's rounds; returns the wall seconds.
    A trainer that fails is reported with the others' tracebacks once all have ended (none waits on it forever)."""
    errors = {}

    def work(name):
        try:
            turns[name].begin_turn()
            trainers[name].train()
        except BaseException as error:  # noqa: B036 - reported, and the other trainers must not wait forever
            errors[name] = "".join(traceback.format_exception(error))
        finally:
            conductor.leave(name)

    threads = [threading.Thread(target=work, args=(name,), name=f"bench-{name}") for name in trainers]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    conductor.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"A benchmarked trainer failed{label}:\n" + "\n".join(errors.values()))
    return time.perf_counter() - started


def run(quick: bool, output_dir: str, model: str = "tiny") -> dict:
    """Interleaved step times; `model="smollm2"`: SmolLM2-135M-Instruct with LoRA on chat-add's prompts, the recipe's
    batch and budget, fewer steps (a step takes seconds, not tenths)."""
    settings = dict(
        batch_size=16,  # four prompt groups per step: seeded and plain groups mix at seed_fraction=0.5
        num_generations=4,
        max_completion_length=48 if quick else 64,
        num_prompts=8,  # every prompt is banked after two steps, so from then on every group has a seed
        warmup_steps=3,
        measured_steps=12 if quick else 30,
    )
    if model == "smollm2":
        settings.update(max_completion_length=32, warmup_steps=2, measured_steps=4 if quick else 10, model=model)
    variants = _variants(quick)
    conductor = Conductor(variants, seed=0)
    trainers, turns, spies = {}, {}, {}
    for name, spec in variants.items():
        trainers[name] = _build(name, spec, settings, output_dir)
        turns[name] = _Turns(name, conductor)
        trainers[name].add_callback(turns[name])  # last: the seed snapshot callback's work stays inside the turn
        turns[name].rng.save()  # the state `train()` would start from had this trainer been built and run alone
        spies[name] = _GenerateSpy(trainers[name].model)

    seconds = train_interleaved(conductor, trainers, turns, "")

    warm = settings["warmup_steps"]
    base_wall = np.array(turns[BASELINE].wall[warm:])
    base_cpu = np.array(turns[BASELINE].cpu[warm:])
    results = {}
    tokens = {}
    for name, spec in variants.items():
        logs = turns[name].logs[warm:]
        if spec["trainer"] == "grpo":
            tokens[name] = np.array([log["completions/mean_length"] * settings["batch_size"] for log in logs])
        else:
            tokens[name] = np.array([log["seeds/generated_tokens"] for log in logs])
    base_calls = spies[BASELINE].calls[warm:]
    base_generate_share = np.array([c["seconds"] for c in base_calls]) / base_wall  # one generate call a step
    base_decode_steps = np.array([c["new_tokens"] for c in base_calls])
    for name, spec in variants.items():
        logs = turns[name].logs[warm:]
        calls = spies[name].calls[warm:]
        decode_steps = np.array([c["new_tokens"] for c in calls])
        wall, cpu = np.array(turns[name].wall[warm:]), np.array(turns[name].cpu[warm:])
        kept_tokens = tokens[name]
        prefix_tokens = [log.get("seeds/prefix_tokens", 0.0) for log in logs]
        results[name] = {
            "spec": spec,
            "wall_s": _summary(wall),
            "cpu_s": _summary(cpu),
            "trl_step_time_s": _summary([log["step_time"] for log in logs]),
            "generate_s": _summary([c["seconds"] for c in calls]),
            "wall_ratio": _summary(wall / base_wall),  # per round: the same round's GRPO step
            "cpu_ratio": _summary(cpu / base_cpu),
            "generated_tokens": _summary(kept_tokens),  # kept in the responses (the trainer's own count)
            # The physical bound: the step time ratio if a step cost exactly in proportion to its generated tokens.
            "token_bound_ratio": _summary(kept_tokens / tokens[BASELINE]),
            # The static-batching bound: GRPO's step with its `generate` time scaled by this variant's decode steps
            # (the least a static batch can decode) and the rest unchanged; per round, against that round's GRPO step.
            "decode_bound_ratio": _summary(1 - base_generate_share * (1 - decode_steps / base_decode_steps)),
            "prefix_tokens": _summary(prefix_tokens),
            "decoded_tokens": _summary([c["rows"] * c["new_tokens"] for c in calls]),  # what generate() computed
            "decode_steps": _summary(decode_steps),
            "prompt_width": _summary([c["prompt_width"] for c in calls]),
            # tokens the shared-prefix loss forward computed, over TRL's padded rows (GRPO: all of them)
            "token_share": _summary([log.get("shared_prefix/token_share", 1.0) for log in logs]),
            "seeded_group_share": _summary([log.get("seeds/seeded_group_share", 0.0) for log in logs]),
            "loss": [log.get("loss") for log in logs],
        }
    same_tokens = [c["new_tokens"] for c in spies["seeds_f0"].calls] == [
        c["new_tokens"] for c in spies[BASELINE].calls
    ]
    # Up to float rounding: the shared-prefix forward sums over other numbers of masked zeros than TRL's
    same_loss = np.allclose(results["seeds_f0"]["loss"], results[BASELINE]["loss"], rtol=1e-4, atol=1e-6)
    return {
        "settings": settings | {"torch_threads": torch.get_num_threads(), "rounds": conductor.round},
        "seconds": seconds,
        "seed_fraction_0_matches_grpo": bool(same_tokens and same_loss),
        "variants": results,
    }


if __name__ == "__main__":
    import json
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    with tempfile.TemporaryDirectory() as tmp:
        out = run(quick="--quick" in sys.argv, output_dir=tmp, model="smollm2" if "--smollm2" in sys.argv else "tiny")
    for r in out["variants"].values():
        r.pop("loss")
    print(json.dumps(out, indent=1))
