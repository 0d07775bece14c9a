"""Rewrites a running or stopped `compare`'s tables and plot from the runs it has finished, into another folder.

Usage: python research/report_partial.py COMPARE_DIR OUT_DIR
"""

import argparse
import json
import sys
import time
from pathlib import Path

from ts_trl.analysis import compare_protocol as compare
from ts_trl.analysis.compare_report import write_report


def main(source: str, target: str) -> None:
    outputs, settings = [], None
    for path in sorted(Path(source, "runs").glob("*/output.json")):
        saved = json.loads(path.read_text())
        outputs.append(saved["output"])
        settings = saved["settings"]
    budget = compare.Budget(**settings["budget"])
    args = argparse.Namespace(**settings)
    args.methods = [compare.BASELINE] + [m for m in compare.DEFAULT_METHODS if m != compare.BASELINE]
    out = Path(target)
    out.mkdir(parents=True, exist_ok=True)
    finished = sum(o["kind"] == "train" for o in outputs)
    table, _, _ = write_report(outputs, budget, args, out, 0.0, partial=finished < len(args.methods) * 5)
    print(table)


if __name__ == "__main__":
    main(*sys.argv[1:3])
    time.sleep(0)
