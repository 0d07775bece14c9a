"""When a run can first seed: the step at which a prompt comes back with an eligible seed, from the run's shape alone.

Seeds are drawn per prompt, and a rollout is eligible only once it is `seed_min_age` steps old and (with
`seed_snapshot_only`) part of a written snapshot. A prompt therefore seeds no earlier than its second visit, after one
pass over the training prompts, and after a snapshot that covers its first visit. `seeding_schedule` follows TRL's
sampler and transformers' step count generation by generation: pure arithmetic, no torch, no trainer.

Steps are counted as `trainer.state.global_step` counts them: a generation made after `t` optimizer steps trains
step `t + 1`, and that is the step this module reports.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import math
from dataclasses import dataclass

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

LATE_SHARE = 0.25  # seeding that starts after this share of the run is worth a warning
# The runtime check waits until a working run would have shown an eligible group with probability 1 - 1e-6 (the
# expected eligible groups, summed, reach -ln(1e-6)): a zero share there means something other than the schedule.
EXPECTED_ELIGIBLE_GROUPS = -math.log(1e-6)
ELIGIBLE_SHARE_KEY = "seeds/eligible_group_share"
# What makes a run's prompts fewer, as its user sets it: a library user passes a smaller train_dataset; a command
# names its own flag for the kind of data it trains on (`fewer_prompts_by`).
_FEWER_PROMPTS = contextvars.ContextVar("fewer_prompts", default="a smaller train_dataset")


@contextlib.contextmanager
def fewer_prompts_by(setting: str):
    """Inside the block, the schedule's advice names `setting` as the way to train on fewer prompts."""
    token = _FEWER_PROMPTS.set(setting)
    try:
        yield
    finally:
        _FEWER_PROMPTS.reset(token)


@dataclass(frozen=True)
class SeedingSchedule:
    """The shape of a run and the steps at which seeding can start (`None`: never within the run)."""

    num_prompts: int
    prompts_per_step: float  # unique prompts generated per optimizer step
    steps_per_epoch: int
    total_steps: int
    first_return_step: int | None  # first step whose batch holds a prompt generated before
    first_snapshot_step: int | None  # first step after which a seed shard is written (None: no snapshot needed/none)
    first_seeded_step: int | None  # first step whose batch can hold a group with an eligible seed
    expected_by_step: int | None  # by this step a working run has logged a non-zero eligible share

    @property
    def late(self) -> bool:
        return self.first_seeded_step is not None and self.first_seeded_step > LATE_SHARE * self.total_steps

    def describe(self) -> str:
        """The numbers behind the first seeded step, and the settings that move it."""
        shape = (
            f"{self.num_prompts} prompts at {self.prompts_per_step:g} a step make {self.steps_per_epoch} steps an "
            f"epoch, {self.total_steps} steps in all"
        )
        when = (
            f"seeding can start at step {self.first_seeded_step} of {self.total_steps}"
            if self.first_seeded_step is not None
            else "no group can be seeded within the run"
        )
        reasons = [
            f"a prompt first comes back at step {self.first_return_step}"
            if self.first_return_step is not None
            else "no prompt comes back within the run (each is generated once)"
        ]
        if self.first_snapshot_step is not None:
            reasons.append(f"the first seed shard is written after step {self.first_snapshot_step}")
        return (
            f"{shape}; {when}: {', '.join(reasons)}. Seeds are drawn per prompt, so prompts must come "
            f"back: raise num_train_epochs (or max_steps), train on fewer prompts ({_FEWER_PROMPTS.get()}), and write "
            "seed shards early (seed_snapshot_steps, save_steps); seed_min_age delays seeding further. "
            "seed_method='none' trains plain GRPO."
        )


@dataclass(frozen=True)
class _RunShape:
    """How a run walks through its prompts: generation batches per epoch, optimizer steps per epoch and in all."""

    generations: int  # generation batches per epoch (TRL's RepeatSampler drops an incomplete one)
    prompts_per_generation: int
    micro_steps_per_generation: int
    accumulation: int  # gradient_accumulation_steps
    steps_per_epoch: int
    total_steps: int

    def step_of(self, epoch: int, generation: int) -> int:
        """The global step at which generation batch `generation` of `epoch` is made."""
        return epoch * self.steps_per_epoch + generation * self.micro_steps_per_generation // self.accumulation

    def generations_by(self, epoch: int, cutoff: int) -> int:
        """How many generation batches of `epoch` are made at a step <= `cutoff`."""
        room = cutoff - epoch * self.steps_per_epoch
        if room < 0:
            return 0
        return min(self.generations, -(-((room + 1) * self.accumulation) // self.micro_steps_per_generation))


def _snapshot_intervals(save_strategy, save_steps: float, seed_snapshot_steps, steps_per_epoch: int, total: int):
    """The step intervals at which seed shards are written (None: they follow a metric, unknown in advance)."""
    strategy = str(getattr(save_strategy, "value", save_strategy))
    every = []
    if seed_snapshot_steps:
        every.append(seed_snapshot_steps)
    if strategy == "steps" and save_steps:
        every.append(save_steps if save_steps >= 1 else math.ceil(save_steps * total))
    if strategy == "epoch":
        every.append(steps_per_epoch)
    return [int(e) for e in every if e >= 1]


def _eligible_share(shape: _RunShape, epoch: int, generation: int, cutoff: int, shuffle: bool, num_prompts: int):
    """The chance that a prompt of this generation batch has a rollout made at a step <= `cutoff`."""
    if cutoff < 0:
        return 0.0
    if not shuffle:  # the same prompts as this generation in every epoch: eligible once the first visit is
        return float(shape.step_of(0, generation) <= cutoff)
    # The prompt sat in a uniformly random generation batch of each earlier epoch.
    covered = shape.generations * shape.prompts_per_generation / num_prompts  # drawn in an epoch
    made = [shape.generations_by(e, cutoff) for e in range(epoch)]
    whole = sum(m == shape.generations for m in made)
    partial = next((m for m in made if m < shape.generations), 0)
    return 1 - (1 - covered) ** whole * (1 - partial * shape.prompts_per_generation / num_prompts)


def seeding_schedule(
    *,
    num_prompts: int,
    per_device_train_batch_size: int,
    num_processes: int,
    gradient_accumulation_steps: int,
    num_generations: int,
    steps_per_generation: int | None = None,
    num_iterations: int = 1,
    num_train_epochs: float = 3.0,
    max_steps: int = -1,
    save_strategy: str = "steps",
    save_steps: float = 500,
    seed_snapshot_steps: int | None = None,
    seed_min_age: int = 1,
    seed_snapshot_only: bool = True,
    shuffle_dataset: bool = True,
) -> SeedingSchedule | None:
    """Computes when seeding can start; `None` where the run's shape cannot be known (a `"best"` save strategy with
    no `seed_snapshot_steps`, or fewer prompts than one generation, which the trainer refuses on its own).

    It walks the run's generation batches in order, as TRL makes them, and adds up each one's expected eligible groups.

    Long: a keyword-only signature of every setting that moves the schedule, then the arithmetic in the order the run
    takes its steps.
    """
    steps_per_generation = steps_per_generation or gradient_accumulation_steps
    prompts_per_generation = per_device_train_batch_size * num_processes * steps_per_generation // num_generations
    generations = num_prompts // prompts_per_generation
    if generations == 0:
        return None
    micro_per_generation = steps_per_generation * num_iterations
    # transformers counts a last partial accumulation as a step
    per_epoch = max(math.ceil(generations * micro_per_generation / gradient_accumulation_steps), 1)
    total = max_steps if max_steps > 0 else math.ceil(num_train_epochs * per_epoch)
    shape = _RunShape(
        generations, prompts_per_generation, micro_per_generation, gradient_accumulation_steps, per_epoch, total
    )
    if (
        seed_snapshot_only
        and str(getattr(save_strategy, "value", save_strategy)) == "best"
        and not seed_snapshot_steps
    ):
        return None  # checkpoints (and their shards) follow the metric: unknown in advance
    every = _snapshot_intervals(save_strategy, save_steps, seed_snapshot_steps, per_epoch, total)
    first_return = first_seeded = expected_by = None
    expected = 0.0
    steps = ((e, g) for e in itertools.count(1) for g in range(generations))
    for epoch, generation in itertools.takewhile(lambda eg: shape.step_of(*eg) < total, steps):
        t = shape.step_of(epoch, generation)
        first_return = t + 1 if first_return is None else first_return
        cutoff = t - seed_min_age
        if seed_snapshot_only:
            cutoff = min(cutoff, max((t // e * e for e in every), default=0) - 1)  # rollouts of the last snapshot
        share = _eligible_share(shape, epoch, generation, cutoff, shuffle_dataset, num_prompts)
        if share > 0 and first_seeded is None:
            first_seeded = t + 1
        expected += share * prompts_per_generation
        if expected >= EXPECTED_ELIGIBLE_GROUPS:
            expected_by = t + 1
            break
    return SeedingSchedule(
        num_prompts=num_prompts,
        prompts_per_step=prompts_per_generation * gradient_accumulation_steps / micro_per_generation,
        steps_per_epoch=per_epoch,
        total_steps=total,
        first_return_step=first_return,
        first_snapshot_step=min(every) if seed_snapshot_only and every else None,
        first_seeded_step=first_seeded,
        expected_by_step=expected_by,
    )


def schedule_of(args, num_prompts: int, num_processes: int) -> SeedingSchedule | None:
    """`seeding_schedule` for a `SeedGRPOConfig` (or anything with its field names) on `num_processes` processes."""
    return seeding_schedule(
        num_prompts=num_prompts,
        per_device_train_batch_size=args.per_device_train_batch_size,
        num_processes=num_processes,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        num_generations=args.num_generations,
        steps_per_generation=args.steps_per_generation,
        num_iterations=args.num_iterations,
        num_train_epochs=args.num_train_epochs,
        max_steps=args.max_steps,
        save_strategy=args.save_strategy,
        save_steps=args.save_steps,
        seed_snapshot_steps=args.seed_snapshot_steps,
        seed_min_age=args.seed_min_age,
        seed_snapshot_only=args.seed_snapshot_only,
        shuffle_dataset=args.shuffle_dataset if args.shuffle_dataset is not None else True,
    )


def check_seeding(args, train_dataset, refuse: bool = True) -> SeedingSchedule | None:
    """Refuses a run whose number of epochs cannot seed, warns when seeding starts late or not within `max_steps`.

    Plain GRPO (`seed_method="none"` or `seed_fraction=0`), a `seed_dataset` (its seeds are eligible at once) and a
    dataset without a length are not checked. A run cut short by `max_steps` (a smoke test, most often), or one whose
    settings nobody chose (`refuse=False`: the trainer was given no `args`, as `GRPOTrainer` allows), is warned about
    rather than refused.
    """
    if args.seed_method == "none" or args.seed_fraction == 0 or train_dataset is None:
        return None
    if not hasattr(train_dataset, "__len__"):
        return None
    # GRPOConfig already derived generation_batch_size for this run's processes.
    num_processes = args.generation_batch_size // (args.per_device_train_batch_size * args.steps_per_generation)
    schedule = schedule_of(args, len(train_dataset), num_processes)
    if schedule is None or args.seed_dataset is not None:
        return schedule
    if schedule.first_seeded_step is None:
        message = f"seed_method={args.seed_method!r} would train plain GRPO: {schedule.describe()}"
        if args.max_steps <= 0 and refuse:
            raise ValueError(message)
    elif schedule.late:
        message = f"Seeding starts late, after {LATE_SHARE:.0%} of the run: {schedule.describe()}"
    else:
        return schedule
    if args.process_index == 0:  # every rank computes the same schedule; one says so
        logger.warning(message)
    return schedule


class SeedingWatch(TrainerCallback):
    """Warns once when the eligible group share is still 0 at a step by which a working run would have raised it."""

    def __init__(self, schedule: SeedingSchedule | None):
        self.schedule = schedule
        self.seen = False
        self.warned = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        share = (logs or {}).get(ELIGIBLE_SHARE_KEY)
        if share is None or self.schedule is None or self.schedule.expected_by_step is None:
            return
        self.seen = self.seen or share > 0
        if self.seen or self.warned or state.global_step < self.schedule.expected_by_step:
            return
        self.warned = True
        if state.is_world_process_zero:
            logger.warning(
                f"{ELIGIBLE_SHARE_KEY} is still 0 at step {state.global_step}, although seeds could be eligible from "
                f"step {self.schedule.first_seeded_step}: no prompt of a batch has a usable earlier rollout. Check that "
                "prompts repeat with the same text (or prompt_id), and that rollouts are at least 2 tokens long."
            )
