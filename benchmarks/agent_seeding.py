"""Seeded against plain groups on the embedded agent tasks: generated tokens, rollout and step time, replay cost.

    python benchmarks/agent_seeding.py            # both tasks, full size; writes benchmarks/results/agent_seeding.*
    python benchmarks/agent_seeding.py --quick    # CI size; writes to a temporary folder unless --out
    python benchmarks/agent_seeding.py --report PATH.json   # the tables of a saved report, recomputed from it

Per task (`calculator`: a function tool; `register`: a replayable environment), three `SeedGRPOTrainer`s start from
the task's warm model and train in one process, their steps interleaved in shuffled rounds (`step_time.Conductor`):
`seed_fraction` 0 (every group plain), 0.5 (seeded and plain groups in the same steps) and 1 (every group that has a
seed is seeded). They seed from the previous step on (`seed_snapshot_only=False`, few prompts), so seeded groups exist
from the third step; the first `--warm-steps` steps of each are not measured.

Generated tokens are counted per row: the model tokens a rollout generated in its step (its tool mask after the
prefix), never the prefix or tool results. Times of seeded and plain groups cannot be told apart inside one step (the
rows of a step share each `generate` call), so they are compared per step: the fully seeded trainer's steps against
the plain trainer's of the same round. The replay cost of a seeded group is the time the trainer spent finding its
rows' prefix turns, replaying their calls in the environment and re-parsing the cut turn, divided by the seeded groups
of the step; it is timed by wrapping those functions from here, so the trainer carries no timer.

The no-regeneration check instruments the tools (the calculator's `add`, every `RegisterMachine` call) and each row's
tool table, and asserts per row: the calls executed by the tool loop are exactly the calls of the turns after the
prefix (a prefix call run again breaks the equality); with the environment, the calls replayed before generation are
exactly the prefix's; the first `generate` call is given prompt + prefix ids, with a budget of `max_completion_length`
minus the shortest prefix of the batch (static HF `generate` takes one budget per call), and the kept rollout holds
the seed's prefix and fits `max_completion_length`.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
from step_time import Conductor, _summary, _Turns, train_interleaved  # noqa: E402
from transformers import PrinterCallback, ProgressCallback  # noqa: E402

from ts_trl.embedded import agent  # noqa: E402

VARIANTS = {"plain": 0.0, "mixed": 0.5, "seeded": 1.0}  # name: seed_fraction
TASKS = ("calculator", "register")
FULL = dict(num_prompts=8, batch_size=32, num_generations=8, warm_steps=3, measured_steps=30, warmup_steps=None)
QUICK = dict(num_prompts=4, batch_size=16, num_generations=4, warm_steps=3, measured_steps=3, warmup_steps=None)

_state = threading.local()  # `phase`: "restore" while the trainer restores seeded states, else "loop"
TIMED = {"prefix_turns": 0.0, "replay_calls": 0.0, "parse_response": 0.0}  # seconds, reset per generation batch
TOOL_LOG: list[tuple[str, str, str]] = []  # every call the instrumented tools ran: (phase, name, arguments)


def _phase() -> str:
    return getattr(_state, "phase", "loop")


def _args_key(arguments) -> str:
    """Call arguments as comparable text (a recorded call may hold them as JSON text)."""
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments else {}
    return json.dumps(arguments, sort_keys=True)


@functools.wraps(agent.add)
def counted_add(a: int, b: int) -> int:
    TOOL_LOG.append((_phase(), "add", _args_key({"a": a, "b": b})))
    return agent.add(a, b)


class CountedRegister(agent.RegisterMachine):
    """`RegisterMachine` that logs every call since its last reset, with the phase it ran in."""

    def reset(self, prompt=None, **row) -> None:
        self.log = []
        return super().reset(prompt=prompt, **row)

    def add(self, n: int) -> int:
        self.log.append((_phase(), "add", _args_key({"n": n})))
        TOOL_LOG.append(self.log[-1])
        return super().add(n)

    def read(self) -> int:
        self.log.append((_phase(), "read", _args_key({})))
        TOOL_LOG.append(self.log[-1])
        return super().read()


CountedRegister.add.__doc__ = agent.RegisterMachine.add.__doc__  # TRL reads the tools' schemas from the docstrings
CountedRegister.read.__doc__ = agent.RegisterMachine.read.__doc__


def _timed(name: str, function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            TIMED[name] += time.perf_counter() - start

    wrapper.benchmark_timer = True
    return wrapper


def _install_timers() -> None:
    """Times the tool-loop seam's state-restore functions by wrapping its names for them (none carries a timer)."""
    from ts_trl.trainer import agentic as module

    for name in TIMED:
        function = getattr(module, name)
        if not getattr(function, "benchmark_timer", False):
            setattr(module, name, _timed(name, function))


class Recorder:
    """Wraps one trainer's rollout hooks (on the instance) and keeps, per generation batch, what the checks need."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.batches: list[dict] = []
        self._batch: dict | None = None
        model = trainer.model
        self._model_generate = model.generate
        model.generate = self._generate_call
        self._plan_s, self._plans = 0.0, 0
        for name in ("_plan_groups", "_generate", "_restore_states", "_record_rollouts"):
            setattr(trainer, name, getattr(self, f"_wrap{name}")(name))

    def _wrap_plan_groups(self, name):
        original = getattr(self.trainer, name)

        def wrapped(*args):  # drawing each group's seed and cut, before generation
            start = time.perf_counter()
            try:
                return original(*args)
            finally:
                self._plan_s, self._plans = time.perf_counter() - start, self._plans + 1

        return wrapped

    def _wrap_generate(self, name):
        original = getattr(self.trainer, name)

        def wrapped(prompts):
            for key in TIMED:
                TIMED[key] = 0.0
            batch = self._batch = {"calls": [], "restore_s": 0.0, "tool_log_start": len(TOOL_LOG), "tagged": []}
            batch["dropped"] = []
            batch["tool_names"] = []
            for row, tools in enumerate(getattr(self.trainer, "_sync_tool_dicts", None) or []):
                batch["tagged"].append([])
                batch["tool_names"].append(set(tools))
                for tool_name, function in list(tools.items()):
                    tools[tool_name] = self._tagged(function, tool_name, batch["tagged"][row])
            start, plans = time.perf_counter(), self._plans
            result = original(prompts)
            batch["rollout_s"] = time.perf_counter() - start
            if self._plans != plans:  # an environment run plans in `_generate`, once TRL's reset made the prompts
                batch["rollout_s"] -= self._plan_s
            batch["plan_s"] = self._plan_s
            batch["prompt_ids"] = [list(map(int, ids)) for ids in result[0]]
            batch["timed"] = dict(TIMED)
            return result

        return wrapped

    @staticmethod
    def _tagged(function, name, log):
        signature = inspect.signature(function)

        @functools.wraps(function)
        def wrapper(**arguments):
            try:  # arguments the tool does not take fail before its body runs: an attempt, not an execution
                signature.bind(**arguments)
                runs = True
            except TypeError:
                runs = False
            log.append((_phase(), name, _args_key(arguments), runs))
            return function(**arguments)

        return wrapper

    def _wrap_restore_states(self, name):
        original = getattr(self.trainer, name)

        def wrapped(batch):
            _state.phase = "restore"
            before = [cut is not None for cut in batch.plan.cuts]
            start = time.perf_counter()
            try:
                return original(batch)
            finally:
                self._batch["restore_s"] = time.perf_counter() - start
                _state.phase = "loop"
                # rows whose group the trainer dropped because the environment answered otherwise than recorded
                after = [cut is not None for cut in batch.plan.cuts]
                self._batch["dropped"] = [i for i, (b, a) in enumerate(zip(before, after)) if b and not a]

        return wrapped

    def _wrap_record_rollouts(self, name):
        original = getattr(self.trainer, name)

        def wrapped(inputs, output, batch):
            start = time.perf_counter()
            record = self._finish(batch)
            record["finish_s"] = time.perf_counter() - start  # this benchmark's own work inside the step
            return original(inputs, output, batch)

        return wrapped

    def _generate_call(self, *args, **kwargs):
        start = time.perf_counter()
        output = self._model_generate(*args, **kwargs)
        seconds = time.perf_counter() - start
        input_ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        config = kwargs.get("generation_config")
        if self._batch is not None:
            self._batch["calls"].append(
                {
                    "seconds": seconds,
                    "inputs": [ids[m.bool()].tolist() for ids, m in zip(input_ids, mask)],
                    "max_new_tokens": getattr(config, "max_new_tokens", kwargs.get("max_new_tokens")),
                    "new_tokens": output.size(1) - input_ids.size(1),
                }
            )
        return output

    def _finish(self, batch) -> dict:
        """Turns the batch the trainer just generated into plain data (`rows`) for `check_rows` and the report."""
        record, trainer = self._batch, self.trainer
        plan, generation, turns = batch.plan, batch.generation, batch.turns or {}
        environments = trainer.environments or []
        rows = []
        for i, ids in enumerate(generation.completion_ids):
            seed, cut = plan.seeds[i], plan.cuts[i]
            k = cut.k if cut is not None else 0
            prefix = turns.get(i)
            kept = len(prefix.messages) if prefix is not None else 0
            messages = generation.completions[i]
            rows.append(
                {
                    "group": i // trainer.num_generations,
                    "dropped": i in record["dropped"],
                    "seeded": cut is not None,
                    "k": k,
                    "completion_ids": [int(t) for t in ids],
                    "tool_mask": [int(x) for x in generation.tool_masks[i]],
                    "seed_prefix": [int(t) for t in seed.completion_ids[:k]] if cut is not None else [],
                    "prompt_ids": record["prompt_ids"][i],
                    "prefix_calls": [  # a call naming none of the row's tools is answered with an error, never run
                        (c["name"], _args_key(c["arguments"]))
                        for c in (prefix.tool_calls if prefix is not None else [])
                        if c["name"] in record["tool_names"][i]
                    ],
                    "new_calls": [  # the same for the calls after the prefix
                        (c["function"]["name"], _args_key(c["function"]["arguments"]))
                        for m in messages[kept:]
                        if m.get("role") == "assistant"
                        for c in m.get("tool_calls") or []
                        if c["function"]["name"] in record["tool_names"][i]
                    ],
                    "executed": record["tagged"][i] if record["tagged"] else [],
                    "environment_log": list(environments[i].log) if environments else None,
                }
            )
        record["rows"] = rows
        record["step"] = trainer.state.global_step
        record["tool_log"] = TOOL_LOG[record["tool_log_start"] :]
        record["max_completion_length"] = trainer.max_completion_length
        record["environment"] = bool(environments)
        self.batches.append(record)
        self._batch = None
        return record


def check_rows(batch: dict) -> list[str]:
    """The violations of "a seeded group never generates its prefix turns again" in one generation batch (plain
    data from `Recorder`); empty when every check holds. Checked for every row, seeded or plain."""
    problems = []
    rows, budget_limit = batch["rows"], batch["max_completion_length"]
    first = batch["calls"][0] if batch["calls"] else None
    if first is None or len(first["inputs"]) != len(rows):
        return [
            f"step {batch['step']}: the first generate call did not get every row ({first and len(first['inputs'])})"
        ]
    need = max(budget_limit - row["k"] for row in rows)
    if first["max_new_tokens"] != need:
        problems.append(f"first generate call: budget {first['max_new_tokens']}, the rows need at most {need}")
    executed_total = 0
    for i, row in enumerate(rows):
        where = f"step {batch['step']} row {i}"
        loop = [tuple(call[1:3]) for call in row["executed"] if call[0] == "loop"]
        restore = [tuple(call[1:3]) for call in row["executed"] if call[0] == "restore"]
        executed_total += sum(call[3] for call in row["executed"])
        if loop != row["new_calls"]:
            problems.append(f"{where}: the tool loop ran {loop}, the turns after the prefix call {row['new_calls']}")
        if row["dropped"]:  # replayed, answered otherwise, reset: the environment holds the loop's calls only
            ran = [tuple(call[1:3]) for call in row["executed"] if call[3] and call[0] == "loop"]
        else:
            if restore != (row["prefix_calls"] if batch["environment"] else []):
                problems.append(f"{where}: ran {restore} before generation, its prefix holds {row['prefix_calls']}")
            ran = [tuple(call[1:3]) for call in row["executed"] if call[3]]
        if row["environment_log"] is not None and [tuple(c[1:]) for c in row["environment_log"]] != ran:
            problems.append(f"{where}: the environment saw {row['environment_log']}, the row's tools ran {ran}")
        if len(row["completion_ids"]) > budget_limit or len(row["tool_mask"]) != len(row["completion_ids"]):
            problems.append(f"{where}: {len(row['completion_ids'])} ids past max_completion_length {budget_limit}")
        if row["seeded"]:
            if first["inputs"][i] != row["prompt_ids"] + row["seed_prefix"]:
                problems.append(f"{where}: the first generate call was not given prompt + prefix")
            if row["completion_ids"][: row["k"]] != row["seed_prefix"]:
                problems.append(f"{where}: the rollout does not start with its seed's prefix")
    if executed_total != len(batch["tool_log"]):
        problems.append(
            f"step {batch['step']}: the tools ran {len(batch['tool_log'])} calls, the rows' tables {executed_total}"
        )
    return problems


def _build(task_name: str, fraction: float, settings: dict, output_dir: str, warm_model, tokenizer, task):
    import copy

    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
    from ts_trl.embedded.tasks import task_spec

    args = SeedGRPOConfig(
        output_dir=f"{output_dir}/{task_name}-{fraction}",
        per_device_train_batch_size=settings["batch_size"],
        num_generations=settings["num_generations"],
        max_completion_length=task_spec(task_name).max_completion_length,
        max_steps=settings["warm_steps"] + settings["measured_steps"],
        learning_rate=1e-4,  # the agent tasks' training default (the addition task's)
        lr_scheduler_type="constant",
        activation_checkpointing=False,
        save_strategy="no",  # no checkpoint I/O in the step times; seeds are drawn from the bank in memory
        seed_snapshot_only=False,
        seed_fraction=fraction,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,  # float32 on CPU, as `ts_trl train` runs the agent tasks
        seed=0,
        disable_tqdm=True,
    )
    train, _ = task.make_splits(settings["num_prompts"], 1)
    tools = {"tools": [counted_add]} if task_name == "calculator" else {"environment_factory": CountedRegister}
    trainer = SeedGRPOTrainer(
        model=copy.deepcopy(warm_model),
        reward_funcs=agent.agent_reward,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        **tools,
    )
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    return trainer


def _run_task(task_name: str, settings: dict, output_dir: str) -> dict:
    from ts_trl.embedded.tasks import build_task_model, make_task

    task = make_task(task_name)
    warm_model, tokenizer = build_task_model(task_name, task, warmup_steps=settings["warmup_steps"], progress=False)
    conductor = Conductor(VARIANTS, seed=0)
    trainers, turns, recorders = {}, {}, {}
    for name, fraction in VARIANTS.items():
        trainers[name] = _build(task_name, fraction, settings, output_dir, warm_model, tokenizer, task)
        turns[name] = _Turns(name, conductor)
        trainers[name].add_callback(turns[name])
        turns[name].rng.save()
        recorders[name] = Recorder(trainers[name])

    seconds = train_interleaved(conductor, trainers, turns, f" on {task_name}")
    return _summarise(task_name, settings, turns, recorders, seconds)


def _row_tokens(row: dict) -> dict:
    mask, k = row["tool_mask"], row["k"]
    return {"generated": sum(mask[k:]), "prefix_model": sum(mask[:k]), "prefix_tool": k - sum(mask[:k])}


def _summarise(task_name: str, settings: dict, turns: dict, recorders: dict, seconds: float) -> dict:
    warm, G = settings["warm_steps"], settings["num_generations"]
    variants, violations, checked = {}, [], {"rows": 0, "seeded_rows": 0, "seeded_rows_with_prefix_calls": 0}
    for name in VARIANTS:
        batches = recorders[name].batches
        for batch in batches:  # every step, warm or measured: the check holds or it does not
            violations += [f"{name}: {p}" for p in check_rows(batch)]
            checked["rows"] += len(batch["rows"])
            checked["seeded_rows"] += sum(r["seeded"] for r in batch["rows"])
            checked["seeded_rows_with_prefix_calls"] += sum(bool(r["prefix_calls"]) for r in batch["rows"])
        measured = batches[warm:]
        logs = turns[name].logs[warm:]
        tokens = {"seeded": [], "plain": []}
        prefix_model, prefix_tool, prefix_calls, new_calls = [], [], [], []
        metric_mismatch = 0
        per_step = {key: [] for key in ("seeded_groups", "generate_s", "rollout_s", "restore_s", "decode_steps")}
        replay = {key: [] for key in ("total", "plan", "prefix_turns", "replay_calls", "parse_response")}
        for batch, log in zip(measured, logs):
            rows = batch["rows"]
            counts = [_row_tokens(r) for r in rows]
            for row, count in zip(rows, counts):
                tokens["seeded" if row["seeded"] else "plain"].append(count["generated"])
                if row["seeded"]:
                    prefix_model.append(count["prefix_model"])
                    prefix_tool.append(count["prefix_tool"])
                    prefix_calls.append(len(row["prefix_calls"]))
                    new_calls.append(len(row["new_calls"]))
            # The trainer's own count of generated tokens must be the per-row sum (same definition, measured apart).
            metric_mismatch += abs(log.get("seeds/generated_tokens", -1) - sum(c["generated"] for c in counts)) > 0.5
            groups = sum(r["seeded"] for r in rows[::G])
            per_step["seeded_groups"].append(groups)
            per_step["generate_s"].append(sum(c["seconds"] for c in batch["calls"]))
            per_step["rollout_s"].append(batch["rollout_s"])
            per_step["restore_s"].append(batch["restore_s"])
            per_step["decode_steps"].append(sum(c["new_tokens"] for c in batch["calls"]))
            if groups:
                timed = batch["timed"]
                replay["total"].append((batch["restore_s"] + timed["parse_response"]) / groups)
                for key in ("prefix_turns", "replay_calls", "parse_response"):
                    replay[key].append(timed[key] / groups)
                replay["plan"].append(batch["plan_s"] / groups)
        wall, cpu = turns[name].wall[warm:], turns[name].cpu[warm:]
        variants[name] = {
            "seed_fraction": VARIANTS[name],
            "steps": len(measured),
            "seeded_group_share": _summary(np.array(per_step["seeded_groups"]) / (settings["batch_size"] // G)),
            "generated_tokens_per_row": {
                kind: {"mean": float(np.mean(v)) if v else None, "rows": len(v)} for kind, v in tokens.items()
            },
            "seeded_prefix_model_tokens_mean": float(np.mean(prefix_model)) if prefix_model else None,
            "seeded_prefix_tool_tokens_mean": float(np.mean(prefix_tool)) if prefix_tool else None,
            "seeded_prefix_calls_mean": float(np.mean(prefix_calls)) if prefix_calls else None,
            "seeded_new_calls_mean": float(np.mean(new_calls)) if new_calls else None,
            "generated_tokens_metric_mismatches": int(metric_mismatch),
            "step_wall_s": _summary(wall) | {"min": float(min(wall)), "max": float(max(wall))},
            "step_cpu_s": _summary(cpu),
            "trl_step_time_s": _summary([log["step_time"] for log in logs]),
            "rollout_s": _summary(per_step["rollout_s"]),
            "generate_s": _summary(per_step["generate_s"]),
            "decode_steps": _summary(per_step["decode_steps"]),
            "restore_s": _summary(per_step["restore_s"]),
            "plan_s": _summary([batch["plan_s"] for batch in measured]),
            "instrumentation_s": _summary([batch["finish_s"] for batch in measured]),
            "replay_cost_per_seeded_group_ms": {key: _summary(np.array(v) * 1e3) for key, v in replay.items()},
            "replay_mismatch_share": _summary(
                [log["seeds/replay_mismatch_share"] for log in logs if "seeds/replay_mismatch_share" in log]
            ),
            "tool_calls_per_rollout": _summary([log.get("tools/call_frequency", 0.0) for log in logs]),
            "reward": _summary([log.get("reward", float("nan")) for log in logs]),
            "_wall": wall,
            "_cpu": cpu,
            "_generate": per_step["generate_s"],
            "_rollout": per_step["rollout_s"],
            "seeded_groups_per_step": per_step["seeded_groups"],
        }
    base = variants["plain"]
    for name in ("mixed", "seeded"):
        v = variants[name]  # per round: this trainer's step against the plain trainer's step of the same round
        for key, series in (("wall", "_wall"), ("cpu", "_cpu"), ("generate", "_generate"), ("rollout", "_rollout")):
            v[f"{key}_ratio"] = _summary(np.array(v[series]) / np.array(base[series]))
    for v in variants.values():  # the raw series stay in the JSON: the spread over steps is part of the result
        v["per_step"] = {
            key: [round(float(x), 4) for x in v.pop(f"_{key}")] for key in ("wall", "cpu", "generate", "rollout")
        }
    return {
        "task": task_name,
        "seconds": seconds,
        "variants": variants,
        "no_regeneration": {"violations": violations[:20], "violation_count": len(violations), **checked},
    }


def run(settings: dict, tasks, output_dir: str) -> dict:
    _install_timers()
    return {task: _run_task(task, settings, output_dir) for task in tasks}


def _q(summary: dict, digits: int = 3) -> str:
    if not summary or not summary.get("n"):
        return "–"
    return f"{summary['median']:.{digits}g} [{summary['q25']:.{digits}g}, {summary['q75']:.{digits}g}]"


def _ms(summary: dict | None) -> dict | None:
    """A summary in seconds, in milliseconds (None: not measured, as in reports written before it was)."""
    return None if summary is None else {k: x * 1e3 if k != "n" else x for k, x in summary.items()}


def _num(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def markdown(report: dict) -> str:
    m, s, load = report["machine"], report["settings"], report["load"]
    lines = [
        f"# Seeded against plain groups on the agent tasks ({'quick' if report['quick'] else 'full'})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']} ({s['threads']} threads), TRL {m['trl']}; "
        f"commit {m['commit']}{' (with uncommitted changes)' if m.get('commit_dirty') else ''}, {m['date']}. "
        f"Load average (1 min) while it ran: mean {load['load1_mean']}, max {load['load1_max']}; cores kept busy "
        f"by other processes: {load['other_busy_cores_mean']}. Total {report['seconds']:.0f} s. "
        f"Command: `{report['command']}`.",
        "",
        f"Per task, three trainers from the task's warm model ({s['warmup_steps'] or 'the task default of'} warm-up "
        f"steps), {s['num_prompts']} prompts, {s['batch_size']} rollouts a step ({s['batch_size'] // s['num_generations']}"
        f" groups of {s['num_generations']}), HF generate, {s['warm_steps']} unmeasured + {s['measured_steps']} "
        "measured steps each, interleaved in shuffled rounds. Tokens: model tokens a row generated in its step "
        "(prefix and tool results excluded). Times: per step, median [25%, 75%]; ratios: per round, against the "
        "plain trainer's step of the same round. Rollout: TRL's `_generate` (tool loop, replay, every `generate` "
        "call). Replay cost per seeded group: the step's time in finding prefix turns and replaying their calls "
        "(`_restore_states`) and re-parsing cut turns, over its seeded groups; planning (drawing seeds and cuts) is "
        "the whole step's, over its seeded groups.",
    ]
    for task, result in report["results"].items():
        check, variants = result["no_regeneration"], result["variants"]
        lines += [
            "",
            f"## {task}",
            "",
            "| trainer | seeded groups | tokens/row, seeded rows | tokens/row, plain rows "
            "| seeded prefix: model + tool tokens | tool calls per seeded row: prefix, after it |",
            "|---|---|---|---|---|---|",
        ]
        for name, v in variants.items():
            tok = v["generated_tokens_per_row"]
            lines.append(
                f"| {name} (f={v['seed_fraction']}) | {_q(v['seeded_group_share'], 2)} "
                f"| {_num(tok['seeded']['mean'])} ({tok['seeded']['rows']} rows) "
                f"| {_num(tok['plain']['mean'])} ({tok['plain']['rows']} rows) "
                f"| {_num(v['seeded_prefix_model_tokens_mean'])} + {_num(v['seeded_prefix_tool_tokens_mean'])} "
                f"| {_num(v['seeded_prefix_calls_mean'])}, {_num(v['seeded_new_calls_mean'])} |"
            )
        lines += [
            "",
            "| trainer | step wall s | min–max | step CPU s | rollout s | generate s | decode steps "
            "| wall ratio | CPU ratio | rollout ratio | generate ratio | benchmark's own ms in the step |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, v in variants.items():
            lines.append(
                f"| {name} | {_q(v['step_wall_s'])} | {v['step_wall_s']['min']:.3g}–{v['step_wall_s']['max']:.3g} "
                f"| {_q(v['step_cpu_s'])} | {_q(v['rollout_s'])} | {_q(v['generate_s'])} | {_q(v['decode_steps'])} "
                f"| {_q(v.get('wall_ratio'))} | {_q(v.get('cpu_ratio'))} | {_q(v.get('rollout_ratio'))} "
                f"| {_q(v.get('generate_ratio'))} | {_q(_ms(v.get('instrumentation_s')))} |"
            )
        lines += [
            "",
            "| trainer | replay ms/seeded group | of which: prefix turns | replayed calls | cut-turn parse "
            "| planning ms/seeded group | replay mismatch share |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, v in variants.items():
            cost = v["replay_cost_per_seeded_group_ms"]
            lines.append(
                f"| {name} | {_q(cost['total'])} | {_q(cost['prefix_turns'])} | {_q(cost['replay_calls'])} "
                f"| {_q(cost['parse_response'])} | {_q(cost['plan'])} | {_q(v['replay_mismatch_share'], 2)} |"
            )
        verdict = "holds" if not check["violation_count"] else f"**fails** ({check['violation_count']} violations)"
        lines += [
            "",
            f"No regeneration: {verdict}, over {check['rows']} rollouts of every step, {check['seeded_rows']} "
            f"seeded, {check['seeded_rows_with_prefix_calls']} of them with tool calls in their prefix.",
        ]
        lines += [f"- {p}" for p in check["violations"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import subprocess

    import run as bench

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="CI size: 4 prompts, 16 rollouts a step, 3 measured steps"
    )
    parser.add_argument(
        "--out", type=Path, help="report folder (default: benchmarks/results, or a temp dir in --quick)"
    )
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    for key in FULL:
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, help=f"default: {FULL[key]} ({QUICK[key]} quick)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the box is shared)")
    parser.add_argument("--report", type=Path, help="print the tables of a saved agent_seeding.json; run nothing")
    args = parser.parse_args(argv)
    if args.report:
        print(markdown(json.loads(args.report.read_text())), end="")
        return 0
    settings = dict(QUICK if args.quick else FULL)
    settings.update({key: getattr(args, key) for key in FULL if getattr(args, key) is not None})
    settings["threads"] = args.threads
    torch.set_num_threads(args.threads)
    out = args.out or (Path(tempfile.mkdtemp(prefix="ts_trl-bench-")) if args.quick else REPO / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    machine = bench.machine()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
    )
    machine["commit_dirty"] = bool(dirty.stdout.strip())
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ts_trl-bench-") as scratch, bench.LoadMonitor() as monitor:
        results = run(settings, args.tasks, scratch)
    report = {
        "quick": args.quick,
        "command": " ".join(["python benchmarks/agent_seeding.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine,
        "settings": settings,
        "load": monitor.summary(),
        "seconds": time.perf_counter() - started,
        "results": results,
    }
    (out / "agent_seeding.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "agent_seeding.md").write_text(text)
    print(text)
    print(f"[bench] wrote {out / 'agent_seeding.json'} and agent_seeding.md")
    return 1 if any(r["no_regeneration"]["violation_count"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
