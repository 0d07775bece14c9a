"""`SeedGRPOConfig` validation: a bad seeding field is reported as itself, before anything TRL checks."""

import pytest

from ts_trl import SeedGRPOConfig


@pytest.mark.parametrize(
    "field, value",
    [
        ("seed_fraction", 1.2),
        ("cut_ratio_min", 0.0),
        ("prefix_mode", "both"),
        ("seed_min_age", -1),
        ("cut_selection", "nearest"),
        ("target_pass_rate", 1.0),
        ("seed_trigger", "always"),
    ],
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


@pytest.mark.parametrize(
    "settings, fix",
    [
        (dict(cut_selection="target", seed_method="replay"), "set seed_method='seeds' or cut_selection='ratio'"),
        (dict(cut_selection="target", cut_ratio_min=0.5, cut_ratio_max=0.5), "set cut_ratio_min < cut_ratio_max"),
        (dict(seed_trigger="zero_std", seed_method="none"), "or seed_trigger='fraction'"),
        (dict(target_pass_rate=0.0), r"strictly between 0 and 1 \(e.g. 0.5\)"),
    ],
)
def test_bad_target_cut_settings_name_the_fix_in_one_line(tmp_path, settings, fix):
    with pytest.raises(ValueError, match=fix) as error:
        SeedGRPOConfig(output_dir=str(tmp_path), use_cpu=True, **settings)
    assert "\n" not in str(error.value)
    SeedGRPOConfig(output_dir=str(tmp_path), use_cpu=True, seed_method="replay", seed_trigger="zero_std")  # fine


def test_vllm_engine_kwargs_parse_from_json_and_are_refused_in_server_mode(tmp_path):
    """`--vllm_engine_kwargs '{"enforce_eager": true}'` reaches the colocated engine as a dict (tests/trainer/test_vllm_real.py
    builds the real engine with it); a vLLM server takes its settings on its own command line, so server mode refuses."""
    args = SeedGRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_mode="colocate",
                          vllm_engine_kwargs='{"enforce_eager": true, "dtype": "float32"}')  # fmt: skip
    assert args.vllm_engine_kwargs == {"enforce_eager": True, "dtype": "float32"}
    with pytest.raises(ValueError, match=r"vllm_engine_kwargs=.*vllm_mode='colocate'.*server's command line"):
        SeedGRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_mode="server",
                       vllm_engine_kwargs={"enforce_eager": True})  # fmt: skip
