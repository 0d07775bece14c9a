"""The protocol of `ts_trl compare` (docs/compare.md), fixed before any run: the methods (arms), the budgets per
task, the endpoints and their roles, and the task a comparison runs on."""

from __future__ import annotations

from dataclasses import dataclass

from ..embedded.agent import AGENT_TASKS
from ..embedded.tasks import make_task

METHODS = {
    "none": {"seed_method": "none"},
    "replay": {"seed_method": "replay"},
    "seeds-action": {"seed_method": "seeds", "prefix_mode": "action"},
    "seeds-state": {"seed_method": "seeds", "prefix_mode": "state", "seed_selection": "uniform"},
    "seeds-state-success": {"seed_method": "seeds", "prefix_mode": "state", "seed_selection": "success"},
    "seeds-state-failure": {"seed_method": "seeds", "prefix_mode": "state", "seed_selection": "failure"},
    "seeds-state-passrate": {"seed_method": "seeds", "prefix_mode": "state", "seed_selection": "passrate"},
    # Extensions beside the paper's method (research/target-cuts.md): cuts aimed at a pass rate, seeding all-equal groups.
    "seeds-state-target": {"seed_method": "seeds", "prefix_mode": "state", "cut_selection": "target"},
    "seeds-state-rescue": {"seed_method": "seeds", "prefix_mode": "state", "seed_trigger": "zero_std"},
}
DEFAULT_METHODS = ["none", "replay", "seeds-action", "seeds-state"]
BASELINE = "none"
PASS_K = 8
COVERAGE_CUT = 0.5  # states are the first half (in tokens) of the warm model's rollouts
BOOTSTRAP_SAMPLES = 2000
# The paper's claims that do not involve on-policy GRPO, compared directly: (method, against).
PAPER_CLAIMS = [("seeds-state", "seeds-action"), ("seeds-state", "replay")]
PRIMARY = "pass@1 at equal steps"
# Per-run endpoints from compare.csv, secondary to PRIMARY; a task adds its own through an `endpoints` attribute.
SCALAR_ENDPOINTS = ("coverage",)
ZERO_STD_GAP = "all-equal share, seeded - plain groups"
ZERO_STD_SEEDED, ZERO_STD_PLAIN = "seeds/zero_std_share_seeded", "seeds/zero_std_share_plain"  # the trainer's logs
PRECISION = "float32"  # saved runs without this key trained under bf16 autocast: not reused


@dataclass
class Budget:
    """Sizes of one comparison; `--quick` picks the small one."""

    steps: int
    n_train: int
    n_eval: int
    prompts_per_step: int
    num_generations: int
    max_completion_length: int
    eval_samples: int
    eval_every: int
    warmup_steps: int
    num_seeds: int
    n_probe: int


# The embedded default's task and training settings (ts_trl/cli/arguments.py EMBEDDED_DEFAULTS): same warm-up (hence the same
# cache), 32 groups of 8 per step, the same training prompts and learning rate. Held-out: 8 samples for pass@8.
FULL = Budget(300, 1024, 128, 32, 8, 32, 8, 50, 600, 5, 64)
QUICK = Budget(40, 1024, 64, 32, 8, 32, 8, 20, 600, 2, 32)
DIFFICULTY, MIN_DIFFICULTY, LEARNING_RATE = 2, 1, 1e-4
# The chain task (ts_trl.embedded.chain), sized so that 4 methods x 5 RNG seeds fit in 45 minutes on 2 shared cores;
# research/prereg-chain.md fixes these values, the learning rate by on-policy calibration and the cut range by
# `ts_trl probe-cuts` on the warm model.
CHAIN_FULL = Budget(60, 192, 256, 16, 8, 72, 8, 30, 700, 5, 64)
CHAIN_QUICK = Budget(10, 64, 32, 8, 8, 72, 8, 5, 700, 2, 16)
# The agent tasks (ts_trl.embedded.agent): a rollout of 3-5 turns costs several generate calls, so fewer, smaller
# steps. Not calibrated: the learning rate and cut range are the addition task's.
AGENT_FULL = Budget(60, 256, 64, 8, 8, 96, 8, 20, 400, 3, 32)
AGENT_QUICK = Budget(10, 64, 32, 4, 8, 96, 8, 5, 400, 2, 16)
BUDGETS = {
    "add": (FULL, QUICK),
    "chain": (CHAIN_FULL, CHAIN_QUICK),
    "chain-strict": (CHAIN_FULL, CHAIN_QUICK),
    **{name: (AGENT_FULL, AGENT_QUICK) for name in AGENT_TASKS},
}
# Per task: the learning rate and the top of the cut range when not given.
TASK_DEFAULTS = {
    "add": {"learning_rate": LEARNING_RATE, "cut_ratio_max": 0.9},
    "chain": {"learning_rate": None, "cut_ratio_max": 0.3},
    "chain-strict": {"learning_rate": None, "cut_ratio_max": None},
    **{name: {"learning_rate": LEARNING_RATE, "cut_ratio_max": 0.9} for name in AGENT_TASKS},
}
# Read from the samples on the chain task only (ts_trl.embedded.chain.trace_rates).
TRACE_KEYS = ("error_share", "repair_share", "error_or_repair_share", "recovery_rate")


def task_of(args):
    """The built-in task `args` name, at their difficulty; seed 0, so that every arm trains and is scored on the same
    prompts."""
    return make_task(args.task, seed=0, difficulty=args.difficulty, min_difficulty=args.min_difficulty)
