"""`SeedGRPOConfig` validation: a bad seeding field is reported as itself, before anything TRL checks."""

import pytest

from ts_trl import SeedGRPOConfig


@pytest.mark.parametrize(
    "field, value",
    [("seed_fraction", 1.2), ("cut_ratio_min", 0.0), ("prefix_mode", "both"), ("seed_min_age", -1)],
)
def test_seeding_errors_come_before_trl_errors(tmp_path, field, value):
    # log_completions_hub_repo without log_completions is one of GRPOConfig's own errors; bf16 without a GPU (the
    # default on a CPU machine) is transformers'. Neither may hide the seeding field's own error.
    for trl_mistake in ({"log_completions_hub_repo": "org/completions"}, {"bf16": True}):
        with pytest.raises(ValueError, match=field):
            SeedGRPOConfig(output_dir=str(tmp_path), **trl_mistake, **{field: value})


def test_trl_errors_still_surface_when_seeding_fields_are_valid(tmp_path):
    with pytest.raises(ValueError, match="log_completions"):
        SeedGRPOConfig(output_dir=str(tmp_path), use_cpu=True, log_completions_hub_repo="org/completions")
