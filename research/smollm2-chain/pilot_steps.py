"""The comparison's STEPS from the on-policy pilot, by the rule of research/prereg-smollm2-chain.md ("Steps").

STEPS is the first evaluation step at which the pilot's held-out pass@1 is within 0.03 of its maximum over the run,
plus 20 (one evaluation on the plateau), at least 60 and at most 120. Run from the repository root:
    python research/smollm2-chain/pilot_steps.py
"""

import json
from pathlib import Path

PILOT = Path(__file__).parent / "runs" / "pilot-seed100" / "metrics.jsonl"


def main() -> None:
    curve = {}
    for line in PILOT.read_text().splitlines():
        record = json.loads(line)
        if "eval_held_out_pass@1" in record:
            curve[record["step"]] = record["eval_held_out_pass@1"]
    best = max(curve.values())
    first = min(step for step, value in curve.items() if value >= best - 0.03)
    steps = min(max(first + 20, 60), 120)
    for step, value in sorted(curve.items()):
        print(
            f"step {step:3d}  held-out pass@1 {value:.3f}"
            + ("  <- first within 0.03 of the maximum" if step == first else "")
        )
    print(f"maximum {best:.3f}; STEPS = min(max({first} + 20, 60), 120) = {steps}")


if __name__ == "__main__":
    main()
