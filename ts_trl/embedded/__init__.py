"""The embedded default: a built-in reasoning task, a warmed-up tiny model and pass@k evaluation, all offline on CPU."""

from ts_trl.embedded.evaluate import pass_at_1, pass_at_k, sample_rewards
from ts_trl.embedded.task import EmbeddedTask, Problem, embedded_reward
from ts_trl.embedded.warmup import DEFAULT_MODEL_KWARGS, build_warm_model, warm_up

__all__ = [
    "DEFAULT_MODEL_KWARGS",
    "EmbeddedTask",
    "Problem",
    "build_warm_model",
    "embedded_reward",
    "pass_at_1",
    "pass_at_k",
    "sample_rewards",
    "warm_up",
]
