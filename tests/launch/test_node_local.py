"""Several machines (issue 40, item 8): two accelerate machines on localhost, one process each over gloo, with
node-local output_dirs (each machine its own folder) or one shared folder.

Every case checks that both ranks hold the same seed bank (a digest of its ids, tokens and log-probs) and that every
seeded row of the main process's seed dataset starts with its origin's tokens.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import free_port, seed_manifest, seed_rows, tiny_prompts

ROOT = Path(__file__).resolve().parents[2]


def _launch_two_machines(tmp_path, arguments, timeout=300) -> list[str]:
    """Starts machine 0 and machine 1 (`accelerate launch` each, `arguments[rank]` after the launcher's), waits for
    both, and returns their output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.update(TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.pop("ACCELERATE_USE_CPU", None)
    port, launches, logs = free_port(), [], []
    for rank, rank_arguments in enumerate(arguments):
        command = [sys.executable, "-m", "accelerate.commands.launch"]
        command += ["--config_file", str(ROOT / "accelerate_configs" / "multi_gpu.yaml"), "--num_machines", "2"]
        command += ["--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]
        command += ["--num_processes", "2", "--mixed_precision", "no", *rank_arguments]
        logs.append(tmp_path / f"machine{rank}.log")
        with open(logs[-1], "w") as log:
            launches.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        for launch in launches:
            launch.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for launch in launches:
            launch.kill()
        raise AssertionError("a machine hung:\n" + "\n".join(log.read_text()[-3000:] for log in logs)) from None
    return [log.read_text() for log in logs]


def _two_machines(tmp_path, output_dirs, *args) -> list[dict]:
    """Runs tests/support/two_node_seeds.py as machine 0 and machine 1 (`output_dirs[rank]` each); returns their reports."""
    return _two_machines_with(tmp_path, [[str(d)] for d in output_dirs], *args)


def _two_machines_with(tmp_path, arguments, *args) -> list[dict]:
    """`_two_machines` with `arguments[rank]` (the output_dir first, then options of that machine's own)."""
    reports = [tmp_path / f"report{rank}.json" for rank in range(2)]
    for report in reports:
        report.unlink(missing_ok=True)
    script = str(ROOT / "tests" / "support" / "two_node_seeds.py")
    outputs = _launch_two_machines(
        tmp_path, [[script, a[0], str(r), *a[1:], *args] for a, r in zip(arguments, reports)]
    )
    for rank, (report, output) in enumerate(zip(reports, outputs)):
        assert report.is_file(), f"machine {rank} wrote no report:\n{output[-4000:]}"
    return [json.loads(report.read_text()) for report in reports]


def _assert_same_bank_and_true_prefixes(reports, main_dir, step: int, seed_dataset=None) -> list[dict]:
    """Returns the seeded rows of the main process's seed dataset."""
    assert [r.get("step") for r in reports] == [step, step], reports
    assert reports[0]["bank"] == reports[1]["bank"], "the ranks hold different seed banks"
    rows = seed_rows(main_dir, by_id=True)
    origins = {**rows, **(seed_rows(seed_dataset, by_id=True) if seed_dataset else {})}
    assert reports[0]["rows"] == len(origins)
    seeded = [r for r in rows.values() if r["seed_origin"] is not None]
    assert seeded, "nothing was seeded"
    for row in seeded:  # every prefix is its origin's tokens, whichever rank generated it
        k = row["prefix_len"]
        assert k >= 1 and row["completion_ids"][:k] == origins[row["seed_origin"]]["completion_ids"][:k], row
    return seeded


def test_node_local_disks_train_and_resume_from_the_main_nodes_seeds(tmp_path):
    """(a) Each machine its own folder: only the main process writes seeds; a node whose checkpoint lacks the weights
    (transformers writes them on the main process only, even with save_on_each_node) stops both machines with one
    line; once the checkpoint folder alone is copied to it, a resume rebuilds that node's bank from the main
    process's seeds."""
    node0, node1 = tmp_path / "node0" / "run", tmp_path / "node1" / "run"
    reports = _two_machines(tmp_path, [node0, node1], "--max_steps", "2", "--save_on_each_node")
    _assert_same_bank_and_true_prefixes(reports, node0, step=2)
    assert not (node1 / "seeds").exists()  # only the main process writes seeds
    assert (node1 / "checkpoint-2" / "trainer_state.json").is_file()  # the node's own (save_on_each_node)

    reports = _two_machines(tmp_path, [node0, node1], "--max_steps", "4", "--resume", "newest")
    refusals = [r.get("refused") for r in reports]
    assert refusals[0] == refusals[1] and "\n" not in refusals[0], reports
    assert refusals[0].startswith("Rank 1 cannot resume") and str(node1 / "checkpoint-2") in refusals[0]
    assert "no model weights" in refusals[0] and "copy the main node's checkpoint folder" in refusals[0]

    shutil.copytree(node0 / "checkpoint-2", node1 / "checkpoint-2", dirs_exist_ok=True)  # the weights, not seeds/
    reports = _two_machines(tmp_path, [node0, node1], "--max_steps", "4", "--resume", "newest")
    _assert_same_bank_and_true_prefixes(reports, node0, step=4)
    assert [s["step"] for s in seed_manifest(node0)["shards"]] == [1, 2, 3, 4]
    assert not (node1 / "seeds").exists()


def test_a_node_holding_a_copy_of_an_abandoned_timeline_trains_on_the_main_processs_seeds(make_trainer, tmp_path):
    """(b) Machine 1's folder is a copy of machine 0's taken before a resume from an earlier checkpoint rewrote
    steps 2 and 3: its bank files have the same names and rollout ids, other tokens. It must never map them, and its
    checkpoint of the same step (another timeline's optimizer state) is refused until the main node's is copied."""
    node0, node1 = tmp_path / "node0" / "run", tmp_path / "node1" / "run"
    make_trainer(dataset=tiny_prompts(2), output_dir=str(node0), max_steps=3, save_steps=1).train()
    shutil.copytree(node0, node1)  # the "obvious workaround", taken now: then node 0 moves on
    other = make_trainer(dataset=tiny_prompts(2), output_dir=str(node0), max_steps=3, save_steps=1, temperature=0.5)
    other.train(resume_from_checkpoint=str(node0 / "checkpoint-1"))
    fresh, stale = seed_manifest(node0)["shards"], seed_manifest(node1)["shards"]
    assert [s["bank_sha256"] for s in fresh[1:]] != [s["bank_sha256"] for s in stale[1:]]  # the timelines differ

    # Its checkpoint-3 is of the abandoned timeline too: rank 1 would load that timeline's optimizer state.
    reports = _two_machines(tmp_path, [node0, node1], "--max_steps", "5", "--resume", "checkpoint-3")
    refusals = [r.get("refused") for r in reports]
    assert refusals[0] == refusals[1] and "\n" not in refusals[0], reports
    assert refusals[0].startswith("Rank 1 cannot resume") and "trainer_state.json differs from the main" in refusals[0]
    shutil.copytree(node0 / "checkpoint-3", node1 / "checkpoint-3", dirs_exist_ok=True)  # not seeds/
    reports = _two_machines(tmp_path, [node0, node1], "--max_steps", "5", "--resume", "checkpoint-3")
    _assert_same_bank_and_true_prefixes(reports, node0, step=5)
    log = (tmp_path / "machine1.log").read_text()
    assert "in another version than the main process's" in log and "step-000002.arrow" in log


def test_a_seed_dataset_only_the_main_node_holds_seeds_every_rank(make_trainer, tmp_path):
    """A `seed_dataset` on node 0's disk only (node 1 finds nothing at its path): node 1 takes the main process's
    seeds instead of stopping alone, and both ranks seed from the same bank."""
    source = tmp_path / "source"
    make_trainer(dataset=tiny_prompts(2), output_dir=str(source), max_steps=2, save_steps=1).train()
    node0, node1 = tmp_path / "node0" / "run", tmp_path / "node1" / "run"
    arguments = [[str(d), "--seed_dataset", str(s)] for d, s in ((node0, source), (node1, tmp_path / "absent"))]
    reports = _two_machines_with(tmp_path, arguments, "--max_steps", "2")
    seeded = _assert_same_bank_and_true_prefixes(reports, node0, step=2, seed_dataset=source)
    external = set(seed_rows(source, by_id=True))
    assert any(row["seed_origin"] in external for row in seeded)
    assert "Rank 1 could not read seed_dataset" in (tmp_path / "machine1.log").read_text()


def test_a_shared_folder_resumes_on_two_machines(make_trainer, tmp_path):
    """(c) Both machines resume in one folder (a shared disk): every rank maps the main process's bank files, and the
    snapshots they write. (A fresh two-process run in one folder: tests/cli/test_cli.py.)"""
    shared = tmp_path / "shared" / "run"
    make_trainer(dataset=tiny_prompts(2), output_dir=str(shared), max_steps=2, save_steps=1).train()
    reports = _two_machines(tmp_path, [shared, shared], "--max_steps", "4", "--resume", "checkpoint-2")
    _assert_same_bank_and_true_prefixes(reports, shared, step=4)
    assert [s["step"] for s in seed_manifest(shared)["shards"]] == [1, 2, 3, 4]
    assert "in another version" not in (tmp_path / "machine1.log").read_text()  # rank 1 found the same files


def test_the_cli_stops_both_machines_with_one_line_when_one_lacks_the_checkpoint(tmp_path):
    """`train.py` checks each machine's own --output_dir before anything loads, and every machine stops with the line
    of the first that failed: none is left waiting for the other in a collective."""
    for rank in range(2):
        (tmp_path / f"node{rank}" / "run").mkdir(parents=True)
    checkpoint = tmp_path / "node0" / "run" / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    arguments = [
        ["train.py", "--use_cpu", "--output_dir", str(d), "--resume_from_checkpoint", str(d / "checkpoint-2")]
        for d in (tmp_path / "node0" / "run", tmp_path / "node1" / "run")
    ]
    outputs = _launch_two_machines(tmp_path, arguments, timeout=240)
    missing = str(tmp_path / "node1" / "run" / "checkpoint-2")
    for output in outputs:
        lines = [line for line in output.splitlines() if line.startswith("train.py: error: ")]
        assert len(lines) == 1 and lines[0].startswith("train.py: error: Rank 1 (its own --output_dir)"), output[
            -3000:
        ]
        assert missing in lines[0] and "does not exist" in lines[0]
