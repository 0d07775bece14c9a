"""The built-in tasks by name: `add` (the default), `chain`, the agent tasks `calculator` and `register`, and
`chat-add` and `chat-chain` for a real model, with the model and budget each is sized for.

`--task` on `ts_trl train`, `compare`, `probe-cuts`, `relay` and `positions` looks its name up here, so that every
command builds the same problems, the same warm model (hence the same warm-up cache) and the same budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import yaml

from ts_trl.embedded.agent import AGENT_TASKS, AgentTask, agent_reward, build_agent_tokenizer
from ts_trl.embedded.chain import ChainTask, chain_reward
from ts_trl.embedded.chat_add import ChatAddTask, chat_add_reward
from ts_trl.embedded.chat_chain import ChatChainTask, chat_chain_reward
from ts_trl.embedded.task import EmbeddedTask, embedded_reward
from ts_trl.embedded.warmup import DEFAULT_MODEL_KWARGS, build_warm_model
from ts_trl.resources import packaged_file
from ts_trl.smollm2 import SMOLLM2_NAME
from ts_trl.tiny import build_tokenizer

DEFAULT_TASK = "add"


@dataclass(frozen=True)
class TaskSpec:
    """What a built-in task needs besides its problems: the tiny model's size, the warm-up and the token budget."""

    name: str
    model_kwargs: dict
    warmup_steps: int
    max_completion_length: int
    # Training defaults of `ts_trl train --task NAME` on top of the embedded default's (ts_trl.cli.train).
    train_defaults: dict = field(default_factory=dict)
    reward: Callable = embedded_reward
    tokenizer: Callable = build_tokenizer  # builds the task's tokenizer (the agent tasks' renders tool calls)
    # A real model's name (`ts_trl.smollm2`) where the task is sized for one; then there is no tiny model or warm-up.
    real_model: str | None = None


def recipe_values(name: str) -> dict:
    """The settings of the shipped recipe `name` (recipes/<name>.yaml)."""
    return yaml.safe_load(packaged_file("recipes", f"{name}.yaml").read_text())


def _agent_spec(name: str) -> TaskSpec:
    """An agent task: 400 warm-up steps (held-out pass@1 0.19 calculator, 0.30 register, 4 samples on 64 problems);
    96 tokens hold every 3-operand trace with its tool results. Fewer, smaller steps than `add`: a rollout of 3-5
    turns costs several generate calls. The training defaults are sized for run time, not tuned, and so that the run
    seeds: 64 prompts at 8 a step come back every 8 steps, and a seed shard every 10 steps makes the first seeded step
    11 of 100 (with `add`'s 896 prompts none would come back within 100 steps)."""
    return TaskSpec(
        name,
        DEFAULT_MODEL_KWARGS,
        warmup_steps=400,
        max_completion_length=96,
        train_defaults={
            "output_dir": f"runs/{name}",
            "max_completion_length": 96,
            "embedded_warmup_steps": 400,
            "per_device_train_batch_size": 64,  # 8 prompt groups of 8
            "max_steps": 100,
            "embedded_train_problems": 64,
            "save_steps": 10,
            # Each held-out sample runs the tool loop (several generate calls): 64 problems x 4 samples, as the warm
            # models were measured, keeps an evaluation to seconds rather than most of the run.
            "embedded_eval_problems": 64,
            "embedded_eval_samples": 4,
            "reward_funcs": ["ts_trl.embedded.agent:agent_reward"],
        },
        reward=agent_reward,
        tokenizer=build_agent_tokenizer,
    )


TASKS = {
    "add": TaskSpec("add", DEFAULT_MODEL_KWARGS, warmup_steps=600, max_completion_length=32),
    # Longer solutions with an error-and-repair structure need a third layer: with 2 layers the warm model rarely
    # used the recomputation line correctly. ~0.46M parameters.
    "chain": TaskSpec(
        "chain",
        {**DEFAULT_MODEL_KWARGS, "num_layers": 3},
        warmup_steps=700,
        max_completion_length=72,
        train_defaults={"output_dir": "runs/chain", "max_completion_length": 72, "embedded_warmup_steps": 700},
    ),
    # The same problems, traces and warm model, scored by the whole chain (`chain_reward`): under the answer-only
    # reward, on-policy RL dropped the chain and guessed totals, so errors and repairs stopped mattering.
    "chain-strict": TaskSpec(
        "chain-strict",
        {**DEFAULT_MODEL_KWARGS, "num_layers": 3},
        warmup_steps=700,
        max_completion_length=72,
        train_defaults={
            "output_dir": "runs/chain-strict",
            "max_completion_length": 72,
            "embedded_warmup_steps": 700,
            "reward_funcs": ["ts_trl.embedded.chain:chain_reward"],
        },
        reward=chain_reward,
    ),
    **{name: _agent_spec(name) for name in AGENT_TASKS},
    # Chat prompts for a real instruct model (recipes/smollm2-135m_chat-add_lora.yaml): 32 tokens hold a reply.
    "chat-add": TaskSpec(
        "chat-add",
        {},
        warmup_steps=0,
        max_completion_length=32,
        # `ts_trl train --task chat-add` runs the shipped recipe's settings, model included.
        train_defaults=recipe_values("smollm2-135m_chat-add_lora"),
        reward=chat_add_reward,
        tokenizer=None,
        real_model=SMOLLM2_NAME,
    ),
    # Several lines of partial sums for the same model (recipes/smollm2-135m_chat-chain_lora.yaml): a prefix is a state.
    "chat-chain": TaskSpec(
        "chat-chain",
        {},
        warmup_steps=0,
        max_completion_length=recipe_values("smollm2-135m_chat-chain_lora")["max_completion_length"],
        train_defaults=recipe_values("smollm2-135m_chat-chain_lora"),
        reward=chat_chain_reward,
        tokenizer=None,
        real_model=SMOLLM2_NAME,
    ),
}
CHAIN_TASKS = ("chain", "chain-strict")


def task_spec(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"--task {name}: unknown built-in task; choose one of {', '.join(TASKS)}.")
    return TASKS[name]


def single_turn_only(name: str, command: str) -> None:
    """Refuses an agent task in a command that samples single-turn completions (it cannot run the tool loop)."""
    if name in AGENT_TASKS:
        raise ValueError(
            f"--task {name}: {command} samples single-turn completions, and the agent tasks need TRL's tool loop; "
            "use ts_trl train or compare with them, or another --task."
        )


def make_task(name: str = DEFAULT_TASK, seed: int = 0, difficulty: int = 2, min_difficulty: int | None = 1):
    """The task `name`; `difficulty` and `min_difficulty` shape the addition and agent tasks (the chain has 4-6
    digits)."""
    task_spec(name)
    if name == "chat-add":
        return ChatAddTask(seed=seed)
    if name == "chat-chain":
        return ChatChainTask(seed=seed)
    if name in CHAIN_TASKS:
        return ChainTask(seed=seed)
    if name in AGENT_TASKS:
        return AgentTask(tool=name, difficulty=difficulty, min_difficulty=min_difficulty, seed=seed)
    return EmbeddedTask(difficulty=difficulty, min_difficulty=min_difficulty, seed=seed)


def build_task_model(name: str, task=None, warmup_steps: int | None = None, **warm_up_kwargs):
    """The warm model and tokenizer of task `name` (warm-up cached), as `build_warm_model` builds the addition's."""

    spec = task_spec(name)
    if spec.real_model is not None:
        raise ValueError(
            f"--task {name} trains a real model, not the package's tiny one: pass --model_name_or_path "
            f"{spec.real_model} (or use its recipe)."
        )
    steps = spec.warmup_steps if warmup_steps is None else warmup_steps
    task = task or make_task(name)
    return build_warm_model(task, spec.model_kwargs, spec.tokenizer(), steps=steps, **warm_up_kwargs)


def task_reward(task) -> Callable:
    """The reward that scores `task`'s held-out set (the learning curve, the report)."""
    if isinstance(task, ChatChainTask):
        return chat_chain_reward
    return chat_add_reward if isinstance(task, ChatAddTask) else embedded_reward


def is_real_model_task(task) -> bool:
    """Whether `task` is sized for a real model (the package's tiny one does not know it)."""
    return isinstance(task, (ChatAddTask, ChatChainTask))
