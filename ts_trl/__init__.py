"""Thinking Seeds for TRL: restart on-policy GRPO from the model's own earlier reasoning states."""

from importlib import import_module

from .notices import quiet_dependencies

__version__ = "0.1.0"

# Imported lazily: `import ts_trl` stays cheap for the CLI and for reward workers that never touch torch.
_EXPORTS = {
    "SeedGRPOConfig": "ts_trl.config",
    "SeedGRPOTrainer": "ts_trl.trainer",
    "SeedBank": "ts_trl.bank",
    "Seed": "ts_trl.bank",
    "Rollout": "ts_trl.bank",
    "SeedSplicer": "ts_trl.cutting",
    "Cut": "ts_trl.cutting",
    "SeedSnapshotCallback": "ts_trl.snapshots",
}

__all__ = list(_EXPORTS)

quiet_dependencies()  # before torch, TRL or DeepSpeed is imported through the package


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ts_trl' has no attribute {name!r}")
