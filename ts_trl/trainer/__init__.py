"""The TRL glue: `SeedGRPOConfig`, `SeedGRPOTrainer` and the hooks, backends and internals they rely on.

This is the only layer that knows `GRPOTrainer`'s internals (listed in `trl_internals.py` and pinned by
`tests/test_trl_hooks.py`). It builds the settings the layers below take, once, from the config.
"""
