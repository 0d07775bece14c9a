"""Thinking Seeds for TRL: restart on-policy GRPO from the model's own earlier reasoning states."""

from importlib import import_module

__version__ = "0.1.0"

# Imported lazily: `import ts_trl` stays cheap for the CLI and for reward workers that never touch torch.
_EXPORTS = {
    "SeedGRPOConfig": "ts_trl.trainer.seed_grpo_config",
    "SeedGRPOTrainer": "ts_trl.trainer.seed_grpo_trainer",
    "SeedBank": "ts_trl.store.bank",
    "Seed": "ts_trl.store.bank",
    "Rollout": "ts_trl.store.bank",
    "SeedSplicer": "ts_trl.method.cutting",
    "Cut": "ts_trl.method.cutting",
    "SeedSnapshotCallback": "ts_trl.store.seed_store",
    "smollm2_135m_instruct": "ts_trl.smollm2",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ts_trl' has no attribute {name!r}")
