"""Hard stops (kill -9, the OOM killer, a dead node, a full disk) never leave a run that cannot be
resumed: repeated kills at random moments, kills inside the metrics and checkpoint writes, and a
disk that fills up, each followed by a resume that finishes the run with one gapless series."""
import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcrl.io.checkpoint import inspect_latest, load_arrays, load_latest, save_arrays
from hpcrl.io.metrics import MetricsWriter, read_metrics, rebuild_metrics
from tests.conftest import MPIRUN, REPO, job_pids, mpirun, run_dir, small_config, tmpfs, write_config

EXIT_OUTPUT_FAILED = 4
KILL_CONFIG = {"total_frames": 10**7, "checkpoint_interval_s": 0.3, "log_interval_s": 60}


def start(n: int, path: str, extra_env: dict | None = None) -> subprocess.Popen:
    """World size 1: `python -m hpcrl run` as a user starts a serial run; else through mpirun."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **(extra_env or {}))
    launcher = [] if n == 1 else ["bash", str(MPIRUN), "-n", str(n)]
    return subprocess.Popen([*launcher, sys.executable, "-m", "hpcrl", "run", path], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.communicate()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


def kill_hard(proc: subprocess.Popen, pid: int) -> str:
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, out + err
    return out


def checkpoint_counters(cfg: dict) -> dict:
    found, _, counters, problems = inspect_latest(str(run_dir(cfg) / "checkpoint.h5"))
    assert found is not None, problems
    return counters


def finish_and_check(cfg: dict, path: str, n: int) -> dict:
    """Resume once more with a budget just past the checkpoint; the whole run must be one series
    with rising frames and one row per policy version, nothing repeated, nothing skipped."""
    frames = int(checkpoint_counters(cfg)["frames"])
    done = mpirun(n, "run", path, "--set", f"run.total_frames={frames + 640}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resuming from" in done.stdout and "Traceback" not in done.stderr
    m = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    assert m["policy_version"].tolist() == list(range(1, len(m["policy_version"]) + 1))
    assert np.all(np.diff(m["frames"]) > 0) and m["frames"][-1] >= frames + 640
    assert not list(run_dir(cfg).glob("*.tmp.*"))  # temporaries of the killed writers are gone
    return m


@pytest.mark.parametrize("n, victims", [(1, ["serial"] * 3), (4, [0, 2])], ids=["serial", "4-ranks"])
def test_repeated_kill_9_at_random_moments_always_resumes(tmp_path, n, victims):
    """Serial: the process. 4 ranks: the learner root (it writes every file), then an env rank."""
    rng = random.Random(20261123)
    cfg = small_config(tmp_path, run=KILL_CONFIG)
    path = str(write_config(tmp_path, cfg))
    versions = []
    for victim in victims:
        proc = start(n, path)
        wait_for(lambda: (run_dir(cfg) / "checkpoint.h5").exists() and
                 (not versions or checkpoint_counters(cfg)["policy_version"] > versions[-1]), proc,
                 "a new checkpoint")
        time.sleep(rng.uniform(0.0, 1.5))  # an env step, an update, a metrics row or a checkpoint write
        pids = [proc.pid] if victim == "serial" else job_pids(path, rank=victim)
        assert len(pids) == 1, pids
        out = kill_hard(proc, pids[0])
        assert "resuming from" in out or not versions
        versions.append(int(checkpoint_counters(cfg)["policy_version"]))
    assert versions == sorted(versions)
    m = finish_and_check(cfg, path, n)
    assert len(m["policy_version"]) > versions[-1]


def pause_and_kill(tmp_path, cfg: dict, where: str, at: int) -> None:
    """Run serially until the `at`-th pass through the pause point inside the `where` write, then kill -9."""
    marker = tmp_path / "paused"
    proc = start(1, str(write_config(tmp_path, cfg)),
                 {"HPCRL_PAUSE_INSIDE": f"{where}:{at}", "HPCRL_PAUSE_MARKER": str(marker)})
    wait_for(marker.exists, proc, f"the pause inside the {where} write")
    kill_hard(proc, proc.pid)


@pytest.mark.parametrize("where, at", [("metrics", 8), ("checkpoint", 2)])
def test_a_kill_inside_a_write_still_resumes(tmp_path, where, at):
    """Checkpoints after (nearly) every update, so one exists before the paused write."""
    cfg = small_config(tmp_path, run={**KILL_CONFIG, "checkpoint_interval_s": 0.01})
    pause_and_kill(tmp_path, cfg, where, at)
    if where == "checkpoint":
        assert list(run_dir(cfg).glob("checkpoint.h5.tmp.*"))  # the half-written file the kill left
    else:
        with pytest.raises(OSError, match="already open for write"):  # the flags a dead SWMR writer leaves
            h5py.File(run_dir(cfg) / "metrics.h5", "a", libver="latest").close()
    finish_and_check(cfg, str(tmp_path / "config.yaml"), 1)
    if where == "checkpoint":
        assert "checkpoint a stopped run had not finished writing" in (run_dir(cfg) / "recovery.log").read_text()
        shown = subprocess.run([sys.executable, "-m", "hpcrl", "inspect", str(run_dir(cfg))], capture_output=True,
                               text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert "repairs      1 after hard stops (recovery.log); the last:" in shown.stdout, shown.stdout + shown.stderr


def test_a_run_killed_before_its_first_checkpoint_starts_again(tmp_path):
    cfg = small_config(tmp_path, run={**KILL_CONFIG, "checkpoint_interval_s": 600})
    pause_and_kill(tmp_path, cfg, "metrics", 3)
    again = mpirun(1, "run", str(tmp_path / "config.yaml"), "--set", "run.total_frames=640")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "stopped before its first checkpoint: starting it from the beginning" in again.stdout
    assert read_metrics(str(run_dir(cfg) / "metrics.h5"))["policy_version"].tolist() == list(range(1, 11))


def test_a_metrics_file_killed_mid_row_is_rebuilt_to_whole_rows(tmp_path):
    path = str(tmp_path / "metrics.h5")
    marker = tmp_path / "paused"
    code = ("from hpcrl.io.metrics import MetricsWriter\n"
            f"w = MetricsWriter({path!r})\n"
            "for v in range(1, 10):\n"
            "    w.append({'frames': 10 * v, 'policy_version': v, 'a': 1.0, 'b': 2.0, 'c': 3.0})\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), HPCRL_PAUSE_INSIDE="metrics:5", HPCRL_PAUSE_MARKER=str(marker))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    wait_for(marker.exists, proc, "the pause in row 5")
    proc.kill()
    proc.wait()
    lengths = {len(v) for v in read_metrics(path).values()}
    assert lengths == {4, 5}  # half of row 5's series have it
    rebuilt = rebuild_metrics(path, through_version=100)
    assert rebuilt.rows == 4 and rebuilt.problem == ""
    writer = MetricsWriter(path, resume=True)  # writable again, the flags are gone
    writer.append({"frames": 50, "policy_version": 5, "a": 1.0, "b": 2.0, "c": 3.0})
    writer.close()
    assert read_metrics(path)["policy_version"].tolist() == [1, 2, 3, 4, 5]


def test_an_unreadable_metrics_file_is_set_aside_and_the_run_resumes(tmp_path):
    cfg = small_config(tmp_path, run={"total_frames": 640})
    path = str(write_config(tmp_path, cfg))
    assert mpirun(1, "run", path).returncode == 0
    metrics = run_dir(cfg) / "metrics.h5"
    metrics.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)  # a damaged superblock
    resumed = mpirun(1, "run", path, "--set", "run.total_frames=1280")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    note = (run_dir(cfg) / "recovery.log").read_text()
    assert "could not be read" in note and "rows of the 10 updates up to the checkpoint are lost" in note
    assert "could not be read" in resumed.stdout  # said at start-up too
    damaged = list(run_dir(cfg).glob("metrics.damaged.*.h5"))
    assert len(damaged) == 1 and damaged[0].read_bytes().startswith(b"\x89HDF")  # kept, not deleted
    assert read_metrics(str(metrics))["policy_version"].tolist() == list(range(11, 21))



@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "16m") as disk:
        yield disk


def test_a_checkpoint_that_fills_the_disk_fails_as_an_os_error_and_leaves_no_part_behind(tmp_path):
    """Files of every size around a 1 MiB disk's room: the disk fills while the data goes out, or
    while HDF5 flushes the file's last blocks (which h5py raises as RuntimeError, a second one from
    the close hiding the first); either way the writer gets ENOSPC naming the file, the disk holds
    a whole file or nothing, and nothing is left at the temporary name."""
    outcomes = set()
    with tmpfs(tmp_path / "disk", "1m") as disk:
        for kib in range(1000, 1040):
            path = disk / "shard.h5"
            try:
                save_arrays(str(path), {"a": np.ones(kib * 128)}, {"kib": kib})
                assert load_arrays(str(path))[1]["kib"] == kib
                outcomes.add("written")
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                outcomes.add("ENOSPC, at the temporary name" if exc.filename else "ENOSPC")
            assert [p.name for p in disk.iterdir()] in ([], ["shard.h5"])
            for p in disk.iterdir():
                p.unlink()
    assert outcomes == {"written", "ENOSPC", "ENOSPC, at the temporary name"}


def fill(disk: Path) -> Path:
    """Write a file until the file system has no byte left."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as fh:
        for block in (1 << 20, 1 << 12, 1):
            try:
                while fh.write(b"\0" * block):
                    pass
            except OSError:
                continue
    return filler


def test_a_full_disk_stops_the_job_with_one_message_and_resumes_once_space_is_freed(tmp_path, small_disk):
    cfg = small_config(tmp_path, run={**KILL_CONFIG, "output_dir": str(small_disk / "runs")})
    path = str(write_config(tmp_path, cfg))
    proc = start(4, path)
    wait_for(lambda: (run_dir(cfg) / "checkpoint.h5").exists(), proc, "the first checkpoint")
    filler = fill(small_disk)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_OUTPUT_FAILED, out + err
    messages = [line for line in err.splitlines() if line.startswith("hpcrl:")]
    assert len(messages) == 1, err
    assert "No space left on device" in messages[0] and str(run_dir(cfg)) in messages[0]
    assert "stays valid" in messages[0] and "run the same command again to resume" in messages[0]
    assert "Traceback" not in err + out and "MPI_ABORT" not in err
    checkpoint, _, problems = load_latest(str(run_dir(cfg) / "checkpoint.h5"))
    assert checkpoint is not None and problems == []
    assert f"policy version {int(checkpoint['counters']['policy_version'])}" in messages[0]

    filler.unlink()
    finish_and_check(cfg, path, 4)


def test_a_populations_lineage_left_open_by_a_kill_is_rebuilt_on_resume(tmp_path):
    """A population's launch killed hard leaves its lineage (the population's metrics.h5) with
    SWMR's "open for writing" flags: the next launch's directory rebuilds it, every row kept,
    and the lineage is writable again."""
    population = tmp_path / "runs" / "league"
    population.mkdir(parents=True)
    path = str(population / "metrics.h5")
    code = ("import os\nfrom hpcrl.io.metrics import MetricsWriter\n"
            f"w = MetricsWriter({path!r})\n"
            "for e in range(3):\n"
            "    w.append({'event': e, 'member': 1, 'frames': 100 * e})\n"
            "w.flush()\nos._exit(9)\n")  # no close: as kill -9 leaves it
    assert subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO))).returncode == 9
    with pytest.raises(OSError, match="already open for write"):
        MetricsWriter(path, resume=True)
    from hpcrl.io.rundir import prepare_population
    assert prepare_population(str(tmp_path / "runs"), "league", False, "population: {members: 2}\n") == str(population)
    writer = MetricsWriter(path, resume=True)
    writer.append({"event": 3, "member": 0, "frames": 400})
    writer.close()
    assert read_metrics(path)["event"].tolist() == [0, 1, 2, 3]
