"""The job scripts in jobs/ on a real single-node SLURM (started by scripts/slurm.sh)."""
import os
import re
import subprocess
import time

import pytest

from hpcrl.io.checkpoint import load_checkpoint
from hpcrl.io.metrics import read_metrics
from tests.conftest import REPO
from tests.test_resume import wait_for_rows

pytestmark = [pytest.mark.usefixtures("munged_as_found"), pytest.mark.slurm]

SBATCH_SCRIPT = "jobs/cartpole_ppo.sbatch"


@pytest.fixture(scope="module")
def slurm():
    script = str(REPO / "scripts" / "slurm.sh")
    result = subprocess.run(["bash", script, "start"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    yield True
    subprocess.run(["bash", script, "stop"], capture_output=True)


def job_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if os.getuid() == 0:  # Open MPI inside the job, as root on this test machine
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["HPCRL_BIND"] = "none"  # the test node declares 16 CPUs on 2 cores: 4 ranks cannot bind one per core
    return env


def submit(tmp_path, *hpcrl_args: str) -> str:
    result = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/%j.out", SBATCH_SCRIPT,
                             "--set", f"run.output_dir={tmp_path}/runs", *hpcrl_args],
                            cwd=REPO, env=job_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job_field(job: str, name: str) -> str:
    text = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    match = re.search(rf"\b{name}=(\S+)", text)
    return match.group(1) if match else ""


def wait_for_end(job: str, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job_field(job, "JobState")
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return state
        time.sleep(1)
    subprocess.run(["scancel", job])
    raise AssertionError(f"job {job} did not end in {timeout} s (state {job_field(job, 'JobState')})")


def test_submitted_job_finishes_and_writes_its_run_directory(slurm, tmp_path):
    job = submit(tmp_path, "--set", "run.total_frames=4096")
    assert wait_for_end(job) == "COMPLETED"
    out = (tmp_path / f"{job}.out").read_text()
    assert "[hpcrl] 4 ranks on 1 node" in out and "[hpcrl] done" in out  # mpirun used the 4-task allocation
    metrics = read_metrics(str(tmp_path / "runs" / "cartpole_ppo" / "metrics.h5"))
    assert metrics["frames"][-1] >= 4096


def test_invalid_config_fails_fast_with_the_message_in_the_job_output(slurm, tmp_path):
    start = time.monotonic()
    job = submit(tmp_path, "--set", "algo.gama=0.9")
    assert wait_for_end(job) == "FAILED"
    assert time.monotonic() - start < 90
    out = (tmp_path / f"{job}.out").read_text()
    assert "hpcrl: config error:" in out and "did you mean 'gamma'" in out
    assert "Traceback" not in out
    assert job_field(job, "ExitCode") == "2:0"


def test_usr1_checkpoints_requeues_and_the_requeued_job_resumes(slurm, tmp_path):
    job = submit(tmp_path, "--set", "run.name=pre", "--set", "run.total_frames=12288",
                 "--set", "run.target_return=null")
    run_dir = tmp_path / "runs" / "pre"
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.h5").exists():
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.5)

    class JobAlive:  # wait_for_rows' liveness check, for a SLURM job
        def poll(self):
            return None if job_field(job, "JobState") == "RUNNING" else 1

        def communicate(self):
            return (tmp_path / f"{job}.out").read_text(), ""

    wait_for_rows(str(run_dir / "metrics.h5"), 3, JobAlive())
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)  # what --signal=B:USR1@120 sends
    deadline = time.monotonic() + 120
    while job_field(job, "Restarts") in ("", "0") or job_field(job, "JobState") != "PENDING":
        assert time.monotonic() < deadline, (tmp_path / f"{job}.out").read_text()
        time.sleep(0.5)
    saved = load_checkpoint(str(run_dir / "checkpoint.h5"))["counters"]
    assert saved["stopped_by"] == "preempted"
    # SLURM holds a requeued job for about two minutes before it is eligible again; once the old
    # instance is gone (PENDING, and slurmd has dropped its credential) the test need not wait
    time.sleep(3)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
    assert wait_for_end(job) == "COMPLETED"
    out = (tmp_path / f"{job}.out").read_text()
    assert "preempted: checkpoint of policy version" in out
    assert f"requeueing job {job}" in out
    assert f"resuming from {run_dir / 'checkpoint.h5'}: policy version {saved['policy_version']}, " \
           f"{saved['frames']:,} frames" in out
    metrics = read_metrics(str(run_dir / "metrics.h5"))
    assert metrics["frames"][-1] >= 12288
    versions = metrics["policy_version"]
    assert list(versions) == list(range(1, len(versions) + 1))  # one series, no gap, no repeat
