"""Jobs fail loudly and quickly: a killed rank, a hung env step, an exception; checkpoints stay valid."""
import json
import os
import signal
import subprocess
import time

import pytest

from hpcrl.io.checkpoint import load_latest
from tests.conftest import job_pids, mpirun, run_dir, run_hpcrl, small_config, write_config
from tests.test_hard_stop import start
from tests.test_resume import wait_for_rows

pytestmark = pytest.mark.waits  # timeouts of 4 s, and bounds in seconds on how soon a job ends


def test_hung_env_step_ends_the_job_naming_the_rank_and_what_it_did(tmp_path):
    cfg = small_config(tmp_path, env={"id": "tests.instrumented_envs:HpcrlTest/Hanging-v0", "num_envs": 2,
                                      "kwargs": {"hang_after": 200}},
                       run={"total_frames": 10**7, "hang_timeout_s": 4, "checkpoint_interval_s": 0.01})
    start = time.monotonic()
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)), timeout=120)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < 60, elapsed  # the 4 s timeout, plus start-up: not the allocation's wall time
    assert "has been stuck for" in result.stderr and "stepping envs" in result.stderr, result.stderr
    assert any(f"hpcrl: rank {r} has been stuck" in result.stderr for r in (2, 3))
    ck, used, problems = load_latest(str(run_dir(cfg) / "checkpoint.h5"))
    assert ck is not None and problems == []  # the checkpoints written before the hang stay valid


def start_training(tmp_path, cfg: dict) -> tuple[subprocess.Popen, str]:
    """A run of 4 ranks under mpirun, past its third metrics row; its config file's path."""
    path = str(write_config(tmp_path, cfg))
    proc = start(4, path)
    wait_for_rows(str(run_dir(cfg) / "metrics.h5"), 3, proc)
    return proc, path


def test_killed_env_rank_ends_the_job_within_seconds(tmp_path):
    cfg = small_config(tmp_path, run={"total_frames": 10**7, "checkpoint_interval_s": 0.5, "log_interval_s": 60})
    proc, path = start_training(tmp_path, cfg)
    deadline = time.monotonic() + 60
    while not (run_dir(cfg) / "checkpoint.h5").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    victims = job_pids(path, rank=2)
    assert len(victims) == 1
    os.kill(victims[0], signal.SIGKILL)
    killed = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - killed < 30
    assert proc.returncode != 0
    assert "rank 2" in err and "signal 9" in err, err  # Open MPI names the dead rank
    assert "env ranks 2-3" in out  # and the start-up banner says what rank 2 was
    ck, _, problems = load_latest(str(run_dir(cfg) / "checkpoint.h5"))
    assert ck is not None and problems == []


def test_rank_that_raises_aborts_the_whole_job(tmp_path):
    cfg = small_config(tmp_path, env={"id": "tests.instrumented_envs:HpcrlTest/Exploding-v0", "num_envs": 2},
                       run={"total_frames": 10**7})
    start = time.monotonic()
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)), timeout=120)
    assert time.monotonic() - start < 60
    assert result.returncode != 0
    assert "simulated env failure" in result.stderr
    assert "hpcrl: rank 2 (env: stepping envs" in result.stderr or "hpcrl: rank 3 (env: stepping envs" in result.stderr
    # the run directory says so after the job is gone (issue 46, item 6): the first rank that failed
    ended = json.loads((run_dir(cfg) / "status.json").read_text())
    assert ended["state"] == "failed" and ended["rank"] in (2, 3) and ended["doing"].startswith("env: stepping envs")
    assert ended["error"] == "RuntimeError: simulated env failure"
    report = run_hpcrl("inspect", str(run_dir(cfg)))
    assert report.returncode == 0 and f"FAILED at {ended['time']}: rank {ended['rank']} (env: stepping envs" in \
        report.stdout and "RuntimeError: simulated env failure" in report.stdout, report.stdout + report.stderr


def test_a_stopped_rank_is_lost_after_peer_timeout_and_every_rank_ends_itself(tmp_path):
    """An env rank stopped (SIGSTOP) past run.peer_timeout_s: its neighbour on the control tree names
    it and ends the job, mpirun included; continued later, the stopped rank finds no one and ends
    itself: nothing waits on a peer that will never answer."""
    cfg = small_config(tmp_path, run={"total_frames": 10**7, "peer_timeout_s": 4, "log_interval_s": 60})
    proc, path = start_training(tmp_path, cfg)
    victim, = job_pids(path, rank=3)
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - stopped < 30  # 4 s of silence and 5 s of grace, on a loaded machine
        assert proc.returncode != 0
        # rank 3's parent on the control tree is rank 1 (the tree inside a node is binary)
        assert "hpcrl: rank 1 (inference rank on node" in err and "has heard nothing from rank 3 (env rank" in err, err
        assert "(run.peer_timeout_s = 4)" in err
        while set(job_pids(path)) - {victim} and time.monotonic() - stopped < 40:
            time.sleep(0.2)  # the ranks that heard END leave a grace period after their neighbour
        assert not set(job_pids(path)) - {victim}  # mpirun and every other rank are gone
    finally:
        try:
            os.kill(victim, signal.SIGCONT)
        except ProcessLookupError:
            pass  # the kernel ended it: a stopped process whose parent (mpirun) dies gets SIGHUP
    continued = time.monotonic()
    while job_pids(path) and time.monotonic() - continued < 40:
        time.sleep(0.5)
    assert not job_pids(path), "the stopped rank did not end itself once continued"
