"""The seeding settings' allowed values and the rules between them, as plain functions of the values.

`SeedGRPOConfig` applies them to its fields, once: `ts_trl train` refuses a bad value with the config's sentences.
"""

from __future__ import annotations

from collections.abc import Mapping

SEED_METHODS = ("none", "seeds", "replay")
SEED_FILTERS = ("success",)
PREFIX_MODES = ("state", "action")
SEED_SELECTIONS = ("uniform", "oldest", "success", "failure", "passrate")
CUT_SELECTIONS = ("ratio", "target")
SEED_TRIGGERS = ("fraction", "zero_std")
AGENT_CUT_POINTS = ("any", "turns")  # any admissible point, or turn boundaries only (`method.turns`)

# The type of each setting a rule reads.
RULE_FIELDS = {
    "seed_method": str,
    "agent_cut_points": str,
    "prefix_mode": str,
    "seed_filter": str,
    "seed_selection": str,
    "seed_fraction": float,
    "cut_ratio_min": float,
    "cut_ratio_max": float,
    "cut_selection": str,
    "seed_trigger": str,
    "target_pass_rate": float,
    "prefix_is_clip": float,
    "seed_min_age": int,
    "seed_snapshot_steps": int,
    "replay_per_group": int,
    "num_generations": int,
}


def seeding_problems(values: Mapping) -> list[str]:
    """Every rule the seeding settings in `values` break, one sentence each, in the order `SeedGRPOConfig` checks
    them. A rule is checked only when `values` holds every setting it reads, so a partial mapping (what a command
    line gives) is checked as far as it goes.

    Long: one rule after another, each a line or two; split, the order that decides which one a config reports would
    be spread over several functions.
    """
    problems: list[str] = []

    def given(*names: str) -> bool:
        return all(name in values for name in names)

    v = values
    for name, allowed in (
        ("seed_method", SEED_METHODS),
        ("agent_cut_points", AGENT_CUT_POINTS),
        ("prefix_mode", PREFIX_MODES),
        ("seed_selection", SEED_SELECTIONS),
    ):
        if given(name) and v[name] not in allowed:
            problems.append(f"{name} must be one of {allowed}, got {v[name]!r}.")
        if name == "prefix_mode" and given("seed_filter") and v["seed_filter"] not in (None, *SEED_FILTERS):
            problems.append(f"seed_filter must be None or one of {SEED_FILTERS}, got {v['seed_filter']!r}.")
    if given("seed_fraction") and not 0.0 <= v["seed_fraction"] <= 1.0:
        problems.append(f"seed_fraction must lie in [0, 1], got {v['seed_fraction']}.")
    for name in ("cut_ratio_min", "cut_ratio_max"):
        if given(name) and not 0.0 < v[name] < 1.0:
            problems.append(f"{name} must lie strictly between 0 and 1, got {v[name]}.")
    if given("cut_ratio_min", "cut_ratio_max") and v["cut_ratio_min"] > v["cut_ratio_max"]:
        problems.append(f"cut_ratio_min ({v['cut_ratio_min']}) must not exceed cut_ratio_max ({v['cut_ratio_max']}).")
    problems += _extension_problems(v, given)
    if given("prefix_is_clip") and v["prefix_is_clip"] <= 0:
        problems.append(f"prefix_is_clip must be positive, got {v['prefix_is_clip']}.")
    if given("seed_min_age") and v["seed_min_age"] < 0:
        problems.append(f"seed_min_age must be >= 0, got {v['seed_min_age']}.")
    if given("seed_snapshot_steps") and v["seed_snapshot_steps"] is not None and v["seed_snapshot_steps"] < 1:
        problems.append(f"seed_snapshot_steps must be >= 1 (or unset), got {v['seed_snapshot_steps']}.")
    replay = given("seed_method", "replay_per_group", "num_generations") and v["seed_method"] == "replay"
    if replay and not 1 <= v["replay_per_group"] < v["num_generations"]:
        problems.append(
            f"replay_per_group must lie in [1, num_generations) = [1, {v['num_generations']}), "
            f"got {v['replay_per_group']}."
        )
    return problems


def _extension_problems(v: Mapping, given) -> list[str]:
    """`cut_selection` and `seed_trigger` (research/target-cuts.md): bad values and combinations."""
    problems = []
    if given("cut_selection") and v["cut_selection"] not in CUT_SELECTIONS:
        problems.append(f"cut_selection must be one of {CUT_SELECTIONS}, got {v['cut_selection']!r}.")
    if given("seed_trigger") and v["seed_trigger"] not in SEED_TRIGGERS:
        problems.append(f"seed_trigger must be one of {SEED_TRIGGERS}, got {v['seed_trigger']!r}.")
    if given("target_pass_rate") and not 0.0 < v["target_pass_rate"] < 1.0:
        problems.append(f"target_pass_rate must lie strictly between 0 and 1 (e.g. 0.5), got {v['target_pass_rate']}.")
    target = given("cut_selection") and v["cut_selection"] == "target"
    if target and given("seed_method") and v["seed_method"] != "seeds":
        problems.append(
            f"cut_selection='target' chooses where seeds are cut, and seed_method={v['seed_method']!r} cuts none: "
            "set seed_method='seeds' or cut_selection='ratio'."
        )
    if target and given("cut_ratio_min", "cut_ratio_max") and v["cut_ratio_min"] == v["cut_ratio_max"]:
        problems.append(
            "cut_selection='target' has a single ratio to choose from: set cut_ratio_min < cut_ratio_max, or "
            "cut_selection='ratio'."
        )
    if given("seed_trigger", "seed_method") and v["seed_trigger"] == "zero_std" and v["seed_method"] == "none":
        problems.append(
            "seed_trigger='zero_std' chooses which groups to seed, and seed_method='none' seeds none: set "
            "seed_method='seeds' (or 'replay'), or seed_trigger='fraction'."
        )
    return problems
