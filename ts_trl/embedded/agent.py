"""The built-in agent tasks: the addition task solved through tool calls, to a calculator or to a register machine.

Two multi-turn tasks for TRL's tool loop, offline on CPU like the others. The problems, held-out split and answer
format are the addition task's (`EmbeddedTask`); the model does not add in its head but calls tools:

    Q: 7+15+9                          Q: 7+15+9
    A: [add a=7 b=15]<eos>             A: [add n=15]<eos>
    R: 22                              R: 15
    A: [add a=22 b=9]<eos>             A: [add n=7]<eos>
    R: 31                              R: 22
    A: #### 31<eos>                    A: [add n=9]<eos>
                                       R: 31
                                       A: #### 31<eos>

`calculator` passes the plain function `add(a, b)` as `tools=[add]` (stateless: the transcript is the whole state);
`register` passes `environment_factory=RegisterMachine`, whose `add(n)` and `read()` change and show a register that
`reset(**row)` zeroes; its `get_reward` is 1 when every operand was added exactly once. Its observations depend only on
the calls made since `reset`, so replaying a prefix's calls reproduces them. A model turn either calls tools or
answers; `R:` lines are tool results, which the warm-up does not train on and TRL's loss masks.

The tiny tokenizer gets a chat template that renders tool calls and results in this markup, and the response template
that TRL's `parse_response` reads it back with (`build_agent_tokenizer`); `tiny.py`'s own template is unchanged.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from datasets import Dataset
from tqdm.auto import tqdm
from transformers.utils.chat_parsing import parse_response as parse_with_template

from ts_trl.embedded.cpu import torch_threads
from ts_trl.embedded.evaluate import pass_at_k
from ts_trl.embedded.task import EmbeddedTask, Problem, parse_answer
from ts_trl.tiny import build_tokenizer

AGENT_TASKS = ("calculator", "register")

# Q:/A: as in the tiny template; an assistant turn holds text or tool calls "[name key=value ...]", then <eos>; a tool
# result is an "R:" line. Arguments that arrive as a JSON string (some datasets) are rendered as they are.
AGENT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}Q: {{ message['content'] }}\n"
    "{% elif message['role'] == 'tool' %}R: {{ message['content'] }}\n"
    "{% else %}A:{% if message['content'] %} {{ message['content'] }}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}"
    " [{{ call['function']['name'] }}"
    "{% if call['function']['arguments'] is mapping %}"
    "{% for key, value in call['function']['arguments'].items() %} {{ key }}={{ value }}{% endfor %}"
    "{% else %} {{ call['function']['arguments'] }}{% endif %}]"
    "{% endfor %}<eos>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)

# transformers' response template for that markup: text up to <eos> is the content, each "[name k=v ...]" a tool call
# whose values the tools' JSON schemas type (transformers >= 5.15 casts "7" to 7 for an int parameter).
AGENT_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "A:",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\[(?P<name>[a-z_]+)",
            "close": "]",
            "repeats": True,
            "content": "kv-lines",
            "content_args": {"line_sep": " ", "kv_sep": "="},
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {"close_pattern": r"<eos>\s*", "content": "text"},
    },
}
CALL_PATTERN = re.compile(r"\[([a-z_]+)((?: [a-z_]+=-?\d+)*)\]")


def build_agent_tokenizer():
    """The tiny character tokenizer with the agent chat template and its response template (for `parse_response`)."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = AGENT_CHAT_TEMPLATE
    tokenizer.response_template = copy.deepcopy(AGENT_RESPONSE_TEMPLATE)
    return tokenizer


def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class RegisterMachine:
    """A register that `reset` zeroes and `add` increases; rewarded when every operand of the problem was added once.

    Its observations (the register after each call) depend only on the calls since `reset`, so a replay of recorded
    calls from a fresh `reset(**row)` reproduces them exactly.
    """

    def __init__(self):
        self.value, self.added, self.operands = 0, [], ()

    def reset(self, prompt=None, **row) -> None:
        """Zeroes the register for the problem in `prompt` (a chat prompt or "Q: ...\\nA:" text); adds nothing to it."""
        text = prompt[-1]["content"] if isinstance(prompt, list) else prompt
        self.operands = problem_of(text).operands if text else ()
        self.value, self.added = 0, []
        return None

    def add(self, n: int) -> int:
        """Adds a number to the register and returns the register's new value.

        Args:
            n: The number to add.
        """
        self.value += n
        self.added.append(n)
        return self.value

    def read(self) -> int:
        """Returns the register's value."""
        return self.value

    def get_reward(self) -> float:
        return 1.0 if sorted(self.added) == sorted(self.operands) else 0.0


def problem_of(text: str) -> Problem:
    """The problem of a prompt, "7+15+9" (the user message) or "Q: 7+15+9\\nA:" (the rendered prompt)."""
    if not text.startswith("Q: "):
        text = f"Q: {text}\nA:"
    return Problem.from_prompt(text)


@dataclass
class AgentTask(EmbeddedTask):
    """The addition task answered through tool calls: `tool` is `"calculator"` (`tools=[add]`) or `"register"`
    (`environment_factory=RegisterMachine`).

    Prompts are chat messages (TRL's tool loop needs them), rendered by `AGENT_CHAT_TEMPLATE` to the addition task's
    "Q: ...\\nA:" text. Warm-up traces add the operands in a random order; with `register` a trace reads the register
    before answering with probability `read_rate`.

    Args:
        tool (`str`, *optional*, defaults to `"calculator"`):
            Which tools the task is solved with.
        read_rate (`float`, *optional*, defaults to `0.3`):
            Share of `register` warm-up traces that call `read()` before the answer.
    """

    tool: str = "calculator"
    read_rate: float = 0.3
    min_difficulty: int | None = 1

    def __post_init__(self):
        super().__post_init__()
        if self.tool not in AGENT_TASKS:
            raise ValueError(f"tool must be one of {', '.join(AGENT_TASKS)}, got {self.tool!r}")

    @property
    def tools(self) -> list[Callable]:
        """The `tools` to pass to the trainer (none for `register`: its tools are the environment's methods)."""
        return [add] if self.tool == "calculator" else []

    @property
    def environment_factory(self) -> type | None:
        """The `environment_factory` to pass to the trainer (None for `calculator`)."""
        return RegisterMachine if self.tool == "register" else None

    @property
    def max_completion_tokens(self) -> int:
        """A budget that holds every 3-operand warm-up trace, tool results and EOS tokens included."""
        return 96

    def _dataset(self, split: str, size: int, held_out: bool) -> Dataset:
        rows = super()._dataset(split, size, held_out).to_dict()
        rows["prompt"] = [
            [{"role": "user", "content": "+".join(map(str, problem_of(text).operands))}] for text in rows["prompt"]
        ]
        return Dataset.from_dict(rows)

    def turns(self, problem: Problem, rng: random.Random) -> list[tuple[str, str]]:
        """One warm-up trace as (model text, tool result) pairs; the last pair is the answer, with no result."""
        order = rng.sample(problem.operands, len(problem.operands))
        pairs = []
        if self.tool == "calculator":
            total = order[0]
            for operand in order[1:]:
                pairs.append((f" [add a={total} b={operand}]", str(total + operand)))
                total += operand
        else:
            total = 0
            for operand in order:
                total += operand
                pairs.append((f" [add n={operand}]", str(total)))
            if rng.random() < self.read_rate:
                pairs.append((" [read]", str(total)))
        return pairs + [(f" #### {total}", "")]

    def sample_solution(self, problem: Problem, rng: random.Random) -> str:
        """The warm-up trace as the text after "A:" (the `<eos>` of each model turn written out)."""
        return "".join(
            text + "<eos>" + (f"\nR: {result}\nA:" if result else "") for text, result in self.turns(problem, rng)
        )

    def warm_up_example(self, tokenizer, problem: Problem, rng: random.Random):
        """Prompt ids, trace ids and labels: model turns and their EOS are trained, tool results are not."""
        ids, labels = [], []
        for text, result in self.turns(problem, rng):
            turn = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            ids += turn
            labels += turn
            if result:
                shown = tokenizer(f"\nR: {result}\nA:", add_special_tokens=False)["input_ids"]
                ids += shown
                labels += [-100] * len(shown)
        return tokenizer(problem.prompt, add_special_tokens=False)["input_ids"], ids, labels


def final_text(completion) -> str:
    """The model's text of a completion: a string, or the contents of its assistant messages (TRL's tool loop)."""
    if isinstance(completion, str):
        return completion
    return "\n".join(m.get("content") or "" for m in completion if m.get("role", "assistant") == "assistant")


def agent_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 where the first "#### n" the model wrote, over all its turns, is the right total, else 0.0."""
    rewards = []
    for completion, expected in zip(completions, answer):
        parsed = parse_answer(final_text(completion))
        rewards.append(1.0 if parsed is not None and int(parsed) == int(expected) else 0.0)
    return rewards


def tool_calls_made(completions: list) -> int:
    """How many tool calls a batch of TRL completions (message lists) made."""
    return sum(len(m.get("tool_calls") or []) for c in completions if not isinstance(c, str) for m in c)


@torch.no_grad()
def sample_agent_rewards(
    model,
    tokenizer,
    dataset: Dataset,
    task: AgentTask,
    max_new_tokens: int,
    temperature: float = 1.0,
    num_samples: int = 1,
    seed: int = 0,
    num_threads: int | None = 1,
    progress: bool = False,
) -> list[list[float]]:
    """Runs the tool loop with Hugging Face `generate` as TRL's does (ids concatenated, never re-tokenised;
    `max_new_tokens` bounds model and tool tokens together; a tool result that would not fit ends the rollout) and
    scores each rollout 1.0 when its answer is right (`agent_reward`) and, for `register`, every operand was added
    once (`get_reward`), else 0.0. One list of rewards per prompt.

    Long: one batched multi-turn loop (generate, parse, call, append) that reads best whole.
    """
    rows = [row for row in dataset for _ in range(num_samples)]
    environments = [task.environment_factory() for _ in rows] if task.environment_factory else None
    tool_sets = []
    for index, row in enumerate(rows):
        tools = {tool.__name__: tool for tool in task.tools}
        if environments:
            environments[index].reset(**row)
            tools |= {name: getattr(environments[index], name) for name in ("add", "read")}
        tool_sets.append(tools)
    prompts = [
        tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) for row in rows
    ]
    prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in prompts]
    completion_ids = [[] for _ in rows]
    texts = [[] for _ in rows]
    active = list(range(len(rows)))
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {}
    was_training = model.training
    model.eval()
    bar = tqdm(total=len(rows), desc="held-out rollouts", unit="rollout", disable=not progress, leave=False)
    try:
        with torch.random.fork_rng(), torch_threads(num_threads):
            torch.manual_seed(seed)
            while active:
                inputs = [prompt_ids[i] + completion_ids[i] for i in active]
                budget = max_new_tokens - min(len(completion_ids[i]) for i in active)
                width = max(map(len, inputs))
                input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(x)) + x for x in inputs])
                attention_mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in inputs])
                output = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    max_new_tokens=budget,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                    **(sampling or {"do_sample": False}),
                )[:, width:].tolist()
                still = []
                for i, new in zip(active, output):
                    room = max_new_tokens - len(completion_ids[i])
                    new = new[: new.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in new else new
                    new = new[:room]
                    message = parse_with_template(
                        new, AGENT_RESPONSE_TEMPLATE, prefix="", tools=list(tool_sets[i].values()), tokenizer=tokenizer
                    )
                    completion_ids[i] += new
                    texts[i].append(message.get("content") or "")
                    calls = message.get("tool_calls") or []
                    if not calls:
                        continue
                    results = [_call(tool_sets[i], call["function"]) for call in calls]
                    shown = "".join(f"\nR: {result}" for result in results) + "\nA:"
                    shown_ids = tokenizer(shown, add_special_tokens=False)["input_ids"]
                    if len(completion_ids[i]) + len(shown_ids) < max_new_tokens:  # TRL rolls an overlong result back
                        completion_ids[i] += shown_ids
                        still.append(i)
                bar.update(len(active) - len(still))  # the rollouts that ended this round
                active = still
    finally:
        bar.close()
        model.train(was_training)
    rewards = agent_reward(
        [[{"role": "assistant", "content": "\n".join(t)}] for t in texts], [r["answer"] for r in rows]
    )
    if environments:
        rewards = [text * env.get_reward() for text, env in zip(rewards, environments)]
    return [rewards[index : index + num_samples] for index in range(0, len(rewards), num_samples)]


def agent_pass_at_1(model, tokenizer, dataset: Dataset, task: AgentTask, max_new_tokens: int, **sampling) -> float:
    """Sampled pass@1 of an agent task (`sample_agent_rewards`; `sampling`: temperature, num_samples, seed)."""
    return pass_at_k(sample_agent_rewards(model, tokenizer, dataset, task, max_new_tokens, **sampling), 1)


def _call(tools: dict, function: dict):
    """A tool's result as TRL shows it: the value, or `{"error": ...}` for an unknown tool or bad arguments."""
    try:
        return tools[function["name"]](**function["arguments"])
    except Exception as error:  # noqa: BLE001 - TRL's loop shows any tool failure to the model the same way
        return {"error": str(error) if function["name"] in tools else f"Tool {function['name']} not found."}
