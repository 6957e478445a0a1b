"""`hpcrl plan` (no MPI) and the console entry point."""
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def hpcrl(*args):
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, cwd=REPO)


def test_plan_prints_every_rank_and_its_peers():
    result = hpcrl("plan", "jobs/cartpole_ppo_2learners.yaml", "--world-size", "7")
    assert result.returncode == 0, result.stderr
    assert "2 learner, 2 inference, 3 env ranks" in result.stdout
    assert "rank      6  env        inference rank 2, learner rank 0" in result.stdout
    assert "rank      0  learner    fragments from 2 env ranks" in result.stdout


def test_plan_reports_a_layout_that_does_not_fit():
    result = hpcrl("plan", "jobs/cartpole_ppo_2learners.yaml", "--world-size", "4")
    assert result.returncode == 2 and "need a world size of at least 5" in result.stderr
    assert "Traceback" not in result.stderr


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "hpcrl"  # installed beside the interpreter running the tests
    result = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "run" in result.stdout and "plan" in result.stdout
