"""The shipped CartPole jobs learn: mean return of the last >= 20 episodes reaches 475.

Each layout that computes something of its own learns here: one learner behind a policy server,
two learners averaging with Horovod, async APPO, and DQN. A layout that only moves the same
computation elsewhere is checked bit for bit instead, in a short run (tests/test_reproducible.py):
the serial mode, inline policies and more env ranks give the same weights as the 4-rank layout, and
so does a learner root that is not rank 0. DQN's serial mode runs the same actor, replay and step
in one process, and tests/test_dqn_runs.py and tests/test_resume.py check it (counters, target
network, replay, exact resumes). A second run to 475 of the same computation would check again what
the first did, at 30 to 100 s of the suite each."""
import pytest

from hpcrl.io.metrics import read_metrics
from tests.conftest import REPO, mpirun

pytestmark = pytest.mark.learning


@pytest.mark.parametrize("ranks,job", [
    (4, "cartpole_ppo.yaml"),  # 1 learner, 1 inference, 2 env ranks
    (6, "cartpole_ppo_2learners.yaml"),  # 2 learners (Horovod), 2 inference, 2 env ranks
    (4, "cartpole_appo.yaml"),  # async APPO with V-trace: 1 learner, 1 inference, 2 env ranks
    (4, "cartpole_dqn.yaml"),  # DQN: 1 learner with the replay, 1 inference (Q-values), 2 env ranks
], ids=["4-ranks", "2-learners", "appo", "dqn-4-ranks"])
def test_cartpole_job_reaches_475(tmp_path, ranks, job):
    result = mpirun(ranks, "run", str(REPO / "jobs" / job), "--set", f"run.output_dir={tmp_path}", timeout=480)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dirs = list(tmp_path.iterdir())
    metrics = read_metrics(str(run_dirs[0] / "metrics.h5"))
    assert metrics["return_window_mean"][-1] >= 475  # stopped by run.target_return ...
    assert metrics["frames"][-1] < 300_000  # ... inside the frame budget (DQN's: 100,000)
