"""The shipped CartPole jobs learn: mean return of the last >= 20 episodes reaches 475.

DQN learns on its 4-rank layout only: its serial mode runs the same actor, replay and step in one
process, and tests/test_dqn_runs.py and tests/test_resume.py check that mode (counters, target
network, replay, exact resumes); a second run to 475 would check again what the first did, at
100 s of the suite."""
import pytest

from hpcrl.io.metrics import read_metrics
from tests.conftest import REPO, mpirun

pytestmark = pytest.mark.learning


@pytest.mark.parametrize("ranks,job,extra", [
    (4, "cartpole_ppo.yaml", ()),  # 1 learner, 1 inference, 2 env ranks
    (1, "cartpole_ppo.yaml", ()),  # the same config in serial mode
    (6, "cartpole_ppo_2learners.yaml", ()),  # 2 learners (Horovod), 2 inference, 2 env ranks
    (4, "cartpole_appo.yaml", ()),  # async APPO with V-trace: 1 learner, 1 inference, 2 env ranks
    # the learner (and so the weights' root) on the last rank, world rank 0 an inference rank
    (4, "cartpole_ppo.yaml", ("--set", "roles.learner.place=high")),
    (4, "cartpole_dqn.yaml", ()),  # DQN: 1 learner with the replay, 1 inference (Q-values), 2 env ranks
], ids=["4-ranks", "serial", "2-learners", "appo", "learner-root-off-rank-0", "dqn-4-ranks"])
def test_cartpole_job_reaches_475(tmp_path, ranks, job, extra):
    result = mpirun(ranks, "run", str(REPO / "jobs" / job), "--set", f"run.output_dir={tmp_path}", *extra,
                    timeout=480)
    assert result.returncode == 0, result.stdout + result.stderr
    if extra:
        assert "roles: learner ranks 3; inference ranks 0; env ranks 1-2" in result.stdout
    run_dirs = list(tmp_path.iterdir())
    metrics = read_metrics(str(run_dirs[0] / "metrics.h5"))
    assert metrics["return_window_mean"][-1] >= 475  # stopped by run.target_return ...
    assert metrics["frames"][-1] < 300_000  # ... inside the frame budget (DQN's: 100,000)
