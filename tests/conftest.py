"""Shared fixtures: the tiny tokenizer and model are built in-process, so the suite never touches the network."""

import dataclasses
import json
import os
import signal
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # TRL pings the Hub endpoint when online
# One torch thread in the tests and the commands they start, unless the caller set OMP_NUM_THREADS: on a busy 2-core
# machine two threads spin-wait for each other, and the real model's tests ran past pytest's timeout (issue 58).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# A suite started in the background (`bash .ci/run &` without job control) inherits SIGINT ignored, and so would every
# process the Ctrl-C tests start: a terminal's Ctrl-C never reaches a process that ignores it. A handled signal is
# reset to its default across exec, so the processes the tests start get Python's own Ctrl-C handling, as in a shell.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from ts_trl import SeedGRPOTrainer  # noqa: E402
from ts_trl.store.schema import prompt_id_of  # noqa: E402
from ts_trl.tiny import build_tiny_model, build_tokenizer  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# The tests that start distributed ranks, or DeepSpeed's one-rank group, run one after another in one xdist worker (the
# README's `pytest -n 2` with pyproject's `--dist loadgroup`): accelerate's launcher and DeepSpeed take port 29500 unless
# told otherwise, and two such launches at once would race for it.
RANKS = pytest.mark.xdist_group("ranks")


@pytest.fixture
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def quick_warm_cache(tmp_path_factory) -> Path:
    """A `TS_TRL_CACHE` holding the warm-up that `ts_trl compare --quick` loads, built once for the session (in this
    process, as compare builds it) rather than once by each compare test (about 30 s each), and once for all the
    workers of `pytest -n`. How a warm-up is built, cached and reused is tested in tests/embedded/test_embedded.py.
    `$TS_TRL_CACHE` where set (`.ci/run` fills it)."""
    if os.environ.get("TS_TRL_CACHE"):
        return Path(os.environ["TS_TRL_CACHE"])
    from filelock import FileLock

    from ts_trl.analysis.compare import build_parser
    from ts_trl.analysis.compare_protocol import QUICK, task_of
    from ts_trl.embedded.tasks import build_task_model

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' folders share this run's folder
        root = root.parent
    cache = root / "quick-warm-cache"
    with FileLock(root / "quick-warm-cache.lock"), pytest.MonkeyPatch.context() as patch:
        patch.setenv("TS_TRL_CACHE", str(cache))  # a worker that waited finds the warm-up cached
        args = build_parser().parse_args(["--quick"])
        build_task_model(args.task, task_of(args), warmup_steps=QUICK.warmup_steps)
    return cache


@pytest.fixture
def tiny_model(tokenizer):
    return build_tiny_model(tokenizer)


@pytest.fixture
def gsm8k_path():
    path = SHARED_DATA / "gsm8k_test.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is not laid out beside this checkout")
    return path


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A local Hub, with huggingface_hub and datasets pointed at it and online for this test only."""
    import datasets
    from huggingface_hub import constants as hf_constants

    from tests.support.hub_server import LocalHub

    server = LocalHub().start()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    # Both libraries read these at import time (conftest imported them offline), so the module values are patched too.
    monkeypatch.setattr(hf_constants, "ENDPOINT", server.endpoint)
    monkeypatch.setattr(
        hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", server.endpoint)
    monkeypatch.setattr(
        datasets.config, "HUB_DATASETS_URL", server.endpoint + "/datasets/{repo_id}/resolve/{revision}/{path}"
    )
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    # transformers keeps one HfApi for its pushes, with the endpoint of its first use: a test that reached the Hub
    # client before this one (in a full run) would leave the Trainer's pushes pointed at the real Hub.
    import transformers.trainer

    monkeypatch.setattr(sys.modules[transformers.trainer.hf_api.__module__], "_hf_api", None)
    yield server
    server.stop()
    assert server.unknown == [], f"the client called endpoints the local hub lacks: {server.unknown}"


def count_reward(completions, **kwargs):
    """A cheap deterministic reward with spread on random text: 1.0 when the response has an even number of digits."""
    return [float(sum(ch.isdigit() for ch in c) % 2 == 0) for c in completions]


def rescue_reward(completions, prompts, **kwargs):
    """For seed_trigger="zero_std": tiny prompt i always fails (i % 3 == 0), always passes (i % 3 == 2), or gets
    `count_reward` (mostly spread), so that all-equal plain groups of both kinds recur in a few steps."""
    spread = count_reward(completions)
    kinds = [int(str(p).split(":")[1].split("+")[0]) % 3 for p in prompts]
    return [0.0 if kind == 0 else 1.0 if kind == 2 else r for kind, r in zip(kinds, spread)]


# The extension switches of research/target-cuts.md, as the trainings that cover them turn them on.
TARGET_CUTS = dict(cut_selection="target", seed_trigger="zero_std", reward=rescue_reward)


def assert_target_cuts(trainer) -> None:
    """A run with `TARGET_CUTS` seeded only prompts whose last plain group was all-equal, cut where the planner chose,
    and logged the cut metrics."""
    args, planner = trainer.args, trainer.planner
    assert set(planner.last_plain.values()) >= {-1}, planner.last_plain  # rescue_reward's always-failing prompts
    assert planner.cut_outcomes.counts, "no continuation outcome was counted"
    assert set(logged(trainer, "seeds/target_pass_rate")) == {args.target_pass_rate}
    ratios = logged(trainer, "seeds/mean_cut_ratio")
    assert ratios and all(args.cut_ratio_min <= r <= args.cut_ratio_max for r in ratios), ratios
    assert all(0.0 <= p <= 1.0 for p in logged(trainer, "seeds/seeded_pass_rate"))
    rows = seed_rows(args.output_dir, by_id=True)
    kinds = {int(r["prompt"].split(":")[1].split("+")[0]) % 3 for r in rows.values() if r["seed_origin"]}
    assert kinds & {0, 2}, kinds  # the prompts that are always all-equal were seeded


def seed_manifest(output_dir) -> dict:
    """A run's seed manifest (`seeds/manifest.json`), as written."""
    return json.loads((Path(output_dir) / "seeds" / "manifest.json").read_text())


def seed_rows(output_dir, by_id: bool = False):
    """Every row of a run's seed dataset, read from the shards its manifest lists, in order, each with `shard_step`
    (the step of the shard that holds it); with `by_id`, a dict by rollout id, which must then be unique.

    The one reader of seed rows in the tests; it checks that each shard holds the rows its manifest entry counts.
    """
    import pyarrow.parquet as pq

    seeds = Path(output_dir) / "seeds"
    rows = []
    for shard in seed_manifest(output_dir)["shards"]:
        table = pq.read_table(seeds / shard["file"])
        assert table.num_rows == shard["rows"], shard
        rows += [{**row, "shard_step": shard["step"]} for row in table.to_pylist()]
    if not by_id:
        return rows
    unique = {row["rollout_id"]: row for row in rows}
    assert len(unique) == len(rows), "a rollout id occurs twice"
    return unique


def build_word_tokenizer():
    """A word-level BPE tokenizer trained on worked solutions of the embedded task: the "other model family" of the
    tests of text seeds across tokenizers."""
    from ts_trl.embedded.task import worked_solution
    from ts_trl.tiny import build_word_tokenizer as build

    operands = [(a, b, c) for a in range(1, 20) for b in range(1, 20) for c in (3, 7, 11)]
    return build([f"Q: {a}+{b}+{c}\nA:" + worked_solution((a, b, c)) for a, b, c in operands])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a rendezvous or a local server)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def seed_by_id(bank, rollout_id: str):
    """The seed stored under `rollout_id`."""
    return bank.get(bank.rollout_ids.index(rollout_id))


def logged(trainer, key) -> list:
    """The values a run logged under `key`, in order."""
    return [h[key] for h in trainer.state.log_history if key in h]


def recomputed_logprobs(model, tokenizer, row) -> list[float]:
    """The log-probs `model` gives a banked row's response tokens, scored alone (no padding)."""
    prompt_ids = tokenizer(row["prompt"])["input_ids"]
    ids = torch.tensor([prompt_ids + row["completion_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(row["completion_ids"])[:, None])[:, 0].tolist()


def tiny_prompts(n: int = 8):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"Q: {i}+{i + 1}=" for i in range(n)]})


# The embedded default shrunk to seconds: a 5-step warm-up, 4 training prompts (so prompts repeat and later steps draw
# seeds), 8 held-out ones scored once each, two groups of four a step. Its code paths are the full run's, from the warm
# model built in memory to the saved folder and its card.
EMBEDDED_TINY = [
    "--embedded_warmup_steps", "5",
    "--embedded_train_problems", "4",
    "--embedded_eval_problems", "8",
    "--embedded_eval_samples", "1",
    "--per_device_train_batch_size", "8",
    "--num_generations", "4",
    "--max_completion_length", "16",
]  # fmt: skip


# Small, fast trainer settings shared by the tests; each shrunk value says why it is small.
TINY_SETTINGS = dict(
    per_device_train_batch_size=8,  # two prompt groups per step: enough to mix seeded and plain groups
    num_generations=4,  # the smallest group that still has a spread of rewards
    max_completion_length=12,  # short responses keep each step well under a second on CPU
    max_steps=6,
    save_steps=2,
    logging_steps=1,
    learning_rate=1e-3,  # large, so a handful of steps visibly moves the tiny model
    report_to=[],
    use_cpu=True,
    seed=0,
    seed_fraction=1.0,
    disable_tqdm=True,
)


@pytest.fixture
def make_trainer(tmp_path, tokenizer):
    """Builds a SeedGRPOTrainer (or any GRPOTrainer subclass) on the tiny model with small, fast settings."""
    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer

    def make(
        trainer_cls=SeedGRPOTrainer,
        config_cls=SeedGRPOConfig,
        dataset=None,
        reward=count_reward,
        eval_dataset=None,
        processing_class=None,
        **overrides,
    ):
        """`processing_class`: another tokenizer than the character one (the model is then sized for it)."""
        settings = {**TINY_SETTINGS, "output_dir": str(tmp_path / "run")}
        settings.update(overrides)
        known = {f.name for f in dataclasses.fields(config_cls)}
        args = config_cls(**{k: v for k, v in settings.items() if k in known})
        return trainer_cls(
            model=build_tiny_model(processing_class or build_tokenizer()),
            reward_funcs=reward,
            args=args,
            train_dataset=dataset if dataset is not None else tiny_prompts(),
            eval_dataset=eval_dataset,
            processing_class=processing_class or tokenizer,
        )

    return make


class GradientProbe(SeedGRPOTrainer):
    """Adds a zero-valued leaf to the training log-probs (to read d loss / d logp) and counts the forward passes."""

    forwards = 0

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self.forwards += 1
        if torch.is_grad_enabled():
            self.logps = logps.detach()
            self.delta = torch.zeros_like(logps, requires_grad=True)
            logps = logps + self.delta
        return logps, entropies, aux


def seeded_action_batch(make_trainer, state_value: float, baseline: float = 0.5, **settings):
    """One batch in which both prompt groups continue from a seed, in "action" mode, with its loss back-propagated.

    Two steps on two prompts bank and snapshot rollouts of both; then the batch is generated and scored with seeded
    rows rewarded `state_value` +- 0.1 (plain rows 0) and every prompt's baseline b set to `baseline`. Returns the
    trainer (a `GradientProbe`: `trainer.delta.grad` is d loss / d logp, `trainer.logps` the log-probs) and the inputs.
    """
    holder = {}

    def reward(completions, **kwargs):
        plan = holder["trainer"]._seed_batch.plan
        return [state_value + (0.1 if i % 2 else -0.1) if c is not None else 0.0 for i, c in enumerate(plan.cuts)]

    trainer = holder["trainer"] = make_trainer(
        trainer_cls=GradientProbe,
        prefix_mode="action",
        reward=reward,
        dataset=tiny_prompts(2),
        max_steps=2,
        save_steps=1,
        **settings,
    )
    trainer.train()  # banks and snapshots rollouts of both prompts, so the next batch is seeded
    trainer.model.train()
    batch = [trainer.train_dataset[i // 4] for i in range(8)]
    trainer.planner.reward_means = {prompt_id_of(row["prompt"]): baseline for row in batch}
    inputs = trainer._generate_and_score_completions(batch)
    trainer._compute_loss(trainer.model, inputs).backward()
    return trainer, inputs
