"""Copies a comparison's saved runs into another output folder, recording the warm start they were trained from.

Runs saved before `compare` fingerprinted the warm model carry no `warm_model` setting and are never reused. This
writes the SHA-256 of the warm folder they were trained from into the copies' settings, so that a `compare` whose
own warm start hashes the same reuses them (and one from another warm-up still retrains them).

    python research/chain/stamp_warm.py FROM TO none start seeds-state
"""

import argparse
import json
from pathlib import Path

from ts_trl.analysis.compare import _fingerprint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a compare output folder (its runs/ and warm/)")
    parser.add_argument("target", type=Path, help="the compare output folder that will reuse the runs")
    parser.add_argument("kinds", nargs="+", help="run names before -seedN: start, none, seeds-state, ...")
    args = parser.parse_args()
    sha = _fingerprint(args.source / "warm")
    for kind in args.kinds:
        for path in sorted((args.source / "runs").glob(f"{kind}-seed*/output.json")):
            saved = json.loads(path.read_text())
            if saved["settings"].setdefault("warm_model", sha) != sha:
                raise SystemExit(f"{path}: trained from warm model {saved['settings']['warm_model']}, not {sha}")
            copy = args.target / "runs" / path.parent.name / "output.json"
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(json.dumps(saved))
            print(f"{path} -> {copy}")
    print(f"warm model {sha}")


if __name__ == "__main__":
    main()
