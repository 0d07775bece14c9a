"""What `ts_trl compare` writes: the CSVs of its runs and their differences, the markdown tables and the figure."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ..embedded.agent import AGENT_TASKS
from .common import (
    save_figure,
    write_csv,
)
from .compare_protocol import (
    SCALAR_ENDPOINTS,
    TRACE_KEYS,
    ZERO_STD_GAP,
    Budget,
    task_of,
)
from .compare_stats import all_differences, read_csv, summarize
from .stats import ALPHA, POWER


def write_report(outputs: list[dict], budget: Budget, args, out: Path, elapsed: float, partial: bool):
    """Writes the CSVs, the table and the plot from the finished runs (while others run: `partial`)."""
    starts = {o["seed"]: o for o in outputs if o["kind"] == "start"}
    results, curves, prompts = [], [], []
    for o in (o for o in outputs if o["kind"] == "train" and o["seed"] in starts):
        results.append({**o["result"], "pass_at_1_start": starts[o["seed"]]["pass_at_1"]})
        start = starts[o["seed"]]
        curves += [
            {"method": o["method"], "seed": o["seed"], "step": 0, "kind": kind, "value": start[kind]}
            for kind in start
            if kind.startswith("pass_at_") or kind in ("coverage", *TRACE_KEYS)
        ] + o["curves"]
        start_rows = [{**row, "method": o["method"], "generated_tokens": 0.0} for row in starts[o["seed"]]["prompts"]]
        prompts += start_rows + o["prompts"]
    order = {m: i for i, m in enumerate(args.methods)}
    results.sort(key=lambda r: (order[r["method"]], r["seed"]))
    names = ("compare.csv", "curves.csv", "prompts.csv", "differences.csv", "compare.md", "compare.png")
    paths = {name: out / name for name in names}
    if not results:
        return "", results, paths
    write_csv(paths["compare.csv"], results)
    write_csv(paths["curves.csv"], curves)
    write_csv(paths["prompts.csv"], prompts)
    differences = all_differences(read_csv(paths["prompts.csv"]), read_csv(paths["compare.csv"]), endpoints_of(args))
    write_csv(paths["differences.csv"], differences)
    table = format_table(summarize(results), differences, budget, args, elapsed)
    if partial:
        table = f"PARTIAL: {len(results)} of {len(args.methods) * budget.num_seeds} runs finished.\n\n{table}"
    paths["compare.md"].write_text(table + "\n")
    plot(read_csv(paths["curves.csv"]), paths["compare.png"], budget, args)
    return table, results, paths


def endpoints_of(args) -> tuple[str, ...]:
    """The per-run secondary endpoints: coverage, then the task's own (result columns its evaluation writes)."""
    if hasattr(args, "endpoints"):  # a recipe comparison names its own
        return tuple(args.endpoints)
    return (*SCALAR_ENDPOINTS, *getattr(task_of(args), "endpoints", ()))


def _title(args) -> str:
    if getattr(args, "title", None):
        return args.title
    if getattr(args, "task", "add") == "chain":
        return "Chain task (4-6 digits, repairable errors)"
    if getattr(args, "task", "add") == "chain-strict":
        return "Chain task, scored by the whole chain (4-6 digits, repairable errors)"
    if getattr(args, "task", "add") in AGENT_TASKS:
        return f"Agent task {args.task} (difficulty {args.min_difficulty}-{args.difficulty}, tool calls)"
    return f"Embedded task (difficulty {args.min_difficulty}-{args.difficulty})"


def _number(value: float, signed: bool = True) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.3f}" if signed else f"{value:.3f}"


def _interval(low: float, high: float) -> str:
    return "n/a" if math.isnan(low) else f"[{low:+.3f}, {high:+.3f}]"


def _p(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f}" if value >= 0.001 else "<0.001"


def difference_cells(d: dict) -> list[str]:
    """A difference's table cells: value (with * when significant), paired t interval, p, then the rest by role."""
    cells = [_number(d["difference"]) + (" *" if d["significant"] else ""), _interval(d["t_low"], d["t_high"])]
    cells.append(_p(d["p_value"]))
    if d["role"] == "primary":
        return cells + [_interval(d["boot_low"], d["boot_high"]), _number(d["mde"], signed=False)]
    return cells + [_p(d["p_holm"])]


def format_table(summary: list[dict], differences: list[dict], budget: Budget, args, total_s: float) -> str:
    start = summary[0]["pass_at_1_mean"] - summary[0]["gain_mean"]
    k = summary[0]["k"]
    lines = [
        f"{_title(args)}, {budget.steps} steps x "
        f"{budget.prompts_per_step} prompts x {budget.num_generations} generations, {summary[0]['runs']} RNG seeds; "
        f"held-out pass@1 and pass@{k} over {budget.n_eval} prompts x {budget.eval_samples} samples at temperature "
        f"{getattr(args, 'temperature', 1.0):g} (start pass@1: {start:.3f}).",
        "",
        f"| method | pass@1 (mean ± std) | change vs. start | pass@{k} | state coverage | generated tokens | "
        "reused tokens | wall time (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        std = "n/a" if math.isnan(s["pass_at_1_std"]) else f"{s['pass_at_1_std']:.3f}"
        lines.append(
            f"| {s['method']} | {s['pass_at_1_mean']:.3f} ± {std} | {s['gain_mean']:+.3f} | {s['pass_at_k_mean']:.3f} "
            f"| {s['coverage_mean']:.3f} | {s['generated_tokens']:,.0f} | {s['reused_tokens']:,.0f} | "
            f"{s['wall_s']:.0f} |"
        )
    tables = differences_tables(differences)
    return "\n".join([*lines, "", *tables, *([""] if tables else []), _footer(args, total_s)])


def differences_tables(differences: list[dict]) -> list[str]:
    """The primary and secondary endpoint tables of `assess`ed differences (markdown lines; [] when there are none)."""
    primary = [d for d in differences if d["role"] == "primary"]
    if not primary:
        return []
    tokens = next((d["budget"] for d in differences if d["endpoint"] == "pass@1 at equal tokens"), math.nan)
    lines = [
        f"Primary endpoint, fixed in advance: held-out pass@1 at equal optimizer steps ({primary[0]['budget']}), "
        "paired per RNG seed (each seed's mean over the held-out prompts), with a 95% paired t interval "
        f"(df = seeds - 1) and its p-value; * = p < {ALPHA}. The bootstrap interval (RNG seeds and prompts resampled) "
        "is a sensitivity check: with a few seeds it is too narrow. MDE: the smallest true difference the run would "
        f"detect with {POWER:.0%} power at two-sided {ALPHA}, (t_(1-a/2) + t_power) x SD / sqrt(seeds) from the "
        "observed SD of the per-seed differences.",
        "",
        "| method | against | pass@1 difference | 95% paired t CI | p | bootstrap CI | MDE |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {d['method']} | {d['baseline']} | " + " | ".join(difference_cells(d)) + " |" for d in primary]
    secondary = [d for d in differences if d["role"] == "secondary"]
    if secondary:
        lines += [
            "",
            "Secondary endpoints, Holm-corrected within each method's comparison (* = Holm p < "
            f"{ALPHA}); equal generated tokens: each run's per-prompt curve read at {tokens:,.0f} tokens, where the "
            f"cheapest run stops; '{ZERO_STD_GAP}': within each run, per RNG seed.",
            "",
            "| method | against | endpoint | difference | 95% paired t CI | p | Holm p |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {d['method']} | {d['baseline']} | {d['endpoint']} | " + " | ".join(difference_cells(d)) + " |"
            for d in secondary
        ]
    return lines


def _footer(args, total_s: float) -> str:

    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return (
        f"Total time including warm-up and evaluation: {total_s / 60:.1f} min with {args.jobs} runs at a time "
        f"(load average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f})."
    )


def plot(curves: list[dict], path, budget: Budget, args) -> None:
    """Six panels against optimizer step: training reward, held-out pass@1 and pass@k, coverage, zero-std groups."""
    import matplotlib  # lazy: start-up time; a figure is drawn once, at the end

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    kinds = list(dict.fromkeys(c["kind"] for c in curves))
    k_kind = next((kind for kind in kinds if kind.startswith("pass_at_") and kind != "pass_at_1"), None)
    panels = [
        ("train_reward", "training reward of plain groups (5-step mean)"),
        ("pass_at_1", f"held-out pass@1 ({budget.n_eval} prompts x {budget.eval_samples} samples)"),
        (k_kind, f"held-out {k_kind.replace('_at_', '@') if k_kind else ''}"),
        ("coverage", "state coverage of the warm model's states, E_q[min(1, p/q)]"),
        ("zero_std_groups", "share of groups with zero reward variance (no signal)"),
        ("zero_std_seeded", "the same share among seeded groups only"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    methods = list(dict.fromkeys(c["method"] for c in curves))
    for ax, (kind, title) in zip(axes.flat, panels):
        for method in methods:
            points = [c for c in curves if c["method"] == method and c["kind"] == kind]
            steps = sorted({int(c["step"]) for c in points})
            values = [[float(c["value"]) for c in points if int(c["step"]) == s] for s in steps]
            values = [[v for v in vs if not math.isnan(v)] for vs in values]
            keep = [i for i, v in enumerate(values) if v]
            if not keep:
                continue
            steps = [steps[i] for i in keep]
            mean = np.array([np.mean(values[i]) for i in keep])
            low = np.array([np.min(values[i]) for i in keep])
            high = np.array([np.max(values[i]) for i in keep])
            dense = kind in ("train_reward", "zero_std_groups", "zero_std_seeded")
            if dense and len(mean) >= 5:  # single steps are noisy
                mean = np.convolve(np.pad(mean, 2, mode="edge"), np.ones(5) / 5, mode="valid")
            line = ax.plot(steps, mean, "-" if dense else "-o", label=method, markersize=3)[0]
            if not dense:
                ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.12)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a panel may have no curve yet (no seeded step)
            ax.legend(fontsize=7)
    fig.suptitle(
        f"{_title(args)}, {len({c['seed'] for c in curves})} RNG seed(s) per method (mean; band: min-max over seeds), same steps and "
        f"prompts ({budget.prompts_per_step} x {budget.num_generations} rollouts per step)",
        fontsize=10,
    )
    save_figure(fig, path, dpi=110)
