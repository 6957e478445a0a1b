"""Stop signals end a run with a checkpoint and status 3, never a death (docs/clusters.md, "Signals"): a
second signal while the checkpoint is written, Ctrl-C, a signal in the first moments of the run,
and SIGTERM to the launcher of a multi-rank job. And one writer per run directory: a second run
on a busy directory exits 2 naming the holder, and changes nothing."""
import os
import signal
import subprocess
import sys
import time

import pytest

from hpcrl.io.checkpoint import read_summary
from hpcrl.io.metrics import read_metrics
from tests.conftest import MPIRUN, REPO, run_dir, small_config, write_config

EXIT_PREEMPTED = 3


def start(tmp_path, cfg: dict, *launcher: str, args: tuple = ()) -> subprocess.Popen:
    """`python -m hpcrl run` in a session of its own (a terminal's process group, for Ctrl-C)."""
    path = str(write_config(tmp_path, cfg, f"{cfg['run']['name']}.yaml"))
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    return subprocess.Popen([*launcher, sys.executable, "-m", "hpcrl", "run", path, *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def long_run(tmp_path, name: str = "t") -> dict:
    return small_config(tmp_path, name=name, run={"total_frames": 10**8, "log_interval_s": 0.2},
                        roles={"inference": {"ranks": 0}})


def read_until(proc: subprocess.Popen, text: str, timeout: float = 120) -> list[str]:
    """stdout lines up to and including the first that holds `text`."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the run ended before {text!r}: {lines} {proc.communicate()}")
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"no {text!r} within {timeout} s: {lines}")


def assert_preempted(proc: subprocess.Popen, cfg: dict) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    counters = read_summary(str(run_dir(cfg) / "checkpoint.h5"))[1]
    assert counters["stopped_by"] == "preempted"
    assert read_metrics(str(run_dir(cfg) / "metrics.h5"))["frames"][-1] == counters["frames"]  # nothing lost
    return out


def test_ctrl_c_checkpoints_and_signals_during_the_shutdown_cannot_kill_the_run(tmp_path):
    """SIGINT to the process group (Ctrl-C in a terminal), then SIGTERM after SIGTERM from the
    moment the checkpoint is written until the process is gone: the interpreter's shutdown resets
    Python's handlers, and a signal there used to turn the finished checkpoint into status 143."""
    cfg = long_run(tmp_path)
    proc = start(tmp_path, cfg)
    read_until(proc, "| version")
    os.killpg(proc.pid, signal.SIGINT)
    os.killpg(proc.pid, signal.SIGINT)  # a second Ctrl-C is ignored, not an interrupt
    read_until(proc, "preempted: checkpoint of policy version")
    while proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    assert_preempted(proc, cfg)


def test_a_signal_before_the_run_has_started_is_a_request_too(tmp_path):
    """SIGTERM while Python still imports torch and MPI: the run starts, checkpoints its first
    update and exits 3 (it used to die at once)."""
    cfg = long_run(tmp_path)
    proc = start(tmp_path, cfg)
    deadline = time.monotonic() + 30
    while not catches(proc.pid, signal.SIGTERM):  # the handlers come first in Python's start-up; the imports
        assert proc.poll() is None and time.monotonic() < deadline  # then take seconds
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGTERM)
    assert_preempted(proc, cfg)


def catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (the SigCgt mask of /proc/PID/status)."""
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        return False
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (sig - 1) & 1)


def test_sigterm_twice_to_the_launcher_of_a_multi_rank_job_exits_3_after_the_checkpoint(tmp_path):
    """scripts/mpirun.sh passes SIGTERM on as SIGUSR1, which mpirun forwards to every rank (mpirun
    itself takes SIGTERM as an abort: status 1, no checkpoint); every rank exits 3."""
    cfg = small_config(tmp_path, run={"total_frames": 10**8, "log_interval_s": 0.2})
    proc = start(tmp_path, cfg, "bash", str(MPIRUN), "-n", "4")
    read_until(proc, "| version")
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    out = assert_preempted(proc, cfg)
    assert "preempted: checkpoint of policy version" in out


def test_one_writer_a_second_run_on_a_busy_run_directory_exits_2_naming_the_holder(tmp_path):
    """Two runs on one directory: the second (resume or --overwrite alike) exits 2 with the
    holder's host and pid and leaves every file as it was; once the first has ended (its lock
    goes with its process), the directory resumes."""
    cfg = long_run(tmp_path)
    first = start(tmp_path, cfg)
    read_until(first, "| version")
    files = sorted(os.listdir(run_dir(cfg)))
    config_text = (run_dir(cfg) / "config.yaml").read_text()
    for extra in ((), ("--overwrite",)):
        second = start(tmp_path, cfg, args=extra)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2, out + err
        assert f"is in use by another run (host {os.uname().nodename}, pid {first.pid}, started" in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert first.poll() is None  # the first run goes on, its files untouched
        assert sorted(os.listdir(run_dir(cfg))) == files
        assert (run_dir(cfg) / "config.yaml").read_text() == config_text
    first.send_signal(signal.SIGKILL)  # even a hard kill leaves no stale lock
    first.communicate(timeout=60)
    resumed = start(tmp_path, {**cfg, "run": {**cfg["run"], "total_frames": 64}})
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0 and "Traceback" not in err, out + err
