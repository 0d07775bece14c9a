"""The shared-prefix forward under `accelerate launch` on 2 CPU processes (DDP and ZeRO-3): the same losses as TRL's
row-by-row forward, one model call a micro-batch under gradient, and an exact resume with it on."""

import json

import pytest
import yaml

from tests.cli.test_cli import ZERO3_CPU
from tests.conftest import RANKS
from tests.support.ranks import DDP, run_on_two_ranks

pytestmark = RANKS  # tests/conftest.py: one launch at a time


@pytest.mark.parametrize("backend", ["ddp", "zero3"])
def test_two_processes_train_alike_with_and_without_sharing_and_resume_exactly(tmp_path, backend):
    config, env = DDP, {}
    if backend == "zero3":
        config = tmp_path / "zero3_cpu.yaml"
        config.write_text(yaml.safe_dump(ZERO3_CPU))
        env = {"DS_ACCELERATOR": "cpu"}
    run_on_two_ranks("shared_prefix_ranks.py", str(tmp_path), config=config, env=env)
    runs = json.loads((tmp_path / "losses.json").read_text())
    on, off, resumed = runs["on"], runs["off"], runs["resumed"]
    assert len(on["loss"]) == 4 and max(on["seeds/seeded_group_share"]) > 0  # steps 3 and 4 draw seeds
    shares = on["shared_prefix/token_share"]
    assert len(shares) == 4 and all(share < 1.0 for share in shares)  # every loss forward packed
    assert not off["shared_prefix/token_share"]
    # one model call a micro-batch under gradient, as on every rank (ts_trl/trainer/shared_prefix.py): rank 0's
    # step-4 micro-batch alone would take two, and DDP's forward is a collective
    assert on["calls"] == [1, 1, 1, 1]
    for key in ("loss", "grad_norm", "seeds/seeded_group_share"):
        assert on[key] == pytest.approx(off[key], rel=1e-4, abs=1e-6), key
    # the resumed run's history: steps 1 and 2 from the checkpoint, then steps 3 and 4 trained again
    assert len(resumed["loss"]) == 4
    for key in ("loss", "grad_norm", "shared_prefix/token_share", "seeds/seeded_group_share"):
        assert resumed[key][2:] == pytest.approx(on[key][2:], rel=1e-5, abs=1e-7), key
