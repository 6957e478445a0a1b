"""`hpcrl tune`: the throughput model's choices on synthetic measurements (which role it gives the
ranks to, and which role it names as the bound), and the real command: it measures this machine,
writes a config that validates, and that config runs under mpirun."""
import pytest
import yaml

from hpcrl.core.config import parse_config
from hpcrl.envs import EnvSpaces
from hpcrl.tools.tune import candidates
from hpcrl.tools.tune_model import Measured, fit_line
from tests.conftest import REPO, mpirun, run_hpcrl

CARTPOLE = EnvSpaces((4,), "float32", 2)
CONFIG = """
env: {id: CartPole-v1, num_envs: 8}
algo: {mode: async, rollout_length: 32, batch_frames: 8192}
roles: {learner: {ranks: 1}, inference: {ranks: 1}, env: {ranks: rest}}
"""


def test_a_fit_recovers_a_line_and_never_goes_below_zero():
    assert fit_line([1, 2, 4], [3.0, 5.0, 9.0]) == (1.0, 2.0)
    a, b = fit_line([1, 2], [0.5, 2.5])  # through (0, -1.5): the fixed part would be negative
    assert a == 0.0 and b > 0
    assert fit_line([4, 4], [2.0, 2.0]) == (2.0, 0.0)


def best(m: Measured, ranks: int = 32, cores: float | None = None):
    ranked, _ = candidates(parse_config(CONFIG), CARTPOLE, m, ranks, 1, cores or ranks)
    return ranked[0]


def test_the_model_gives_ranks_to_the_role_that_costs_and_names_it_as_the_bound():
    cheap = (1e-6, 0.0)
    env_heavy = best(Measured(actor_step=(1e-3, 2e-4), forward=cheap, update=(1e-3, 1e-7), message=cheap))
    learner_heavy = best(Measured(actor_step=(1e-5, 1e-7), forward=cheap, update=(1e-3, 2e-4), message=cheap))
    # the expensive role gets every rank the layout rules allow it: env ranks all but one learner;
    # learners half the job (each needs an env rank of its own)
    assert env_heavy.counts == (1, 0, 31) and learner_heavy.counts == (16, 0, 16)
    assert env_heavy.prediction.bound == "env" and learner_heavy.prediction.bound == "learner"


def test_an_expensive_forward_call_goes_to_a_policy_server_that_batches_many_env_ranks():
    # (an actor's step with an inline policy includes the forward)
    forward_heavy = best(Measured(actor_step=(5e-3 + 1e-5, 1e-4), forward=(5e-3, 1e-7), update=(1e-4, 1e-8),
                                  message=(1e-6, 0.0)))
    assert forward_heavy.counts[1] >= 1  # inline inference would pay the whole forward on every env rank
    assert forward_heavy.prediction.bound == "env"  # and the env ranks, freed of it, are what is left
    cheap_forward = best(Measured(actor_step=(1e-5, 1e-6), forward=(1e-7, 1e-9), update=(1e-4, 1e-8),
                                  message=(1e-4, 0.0)))
    assert cheap_forward.counts[1] == 0  # and messages that cost more than a forward keep it inline


def test_on_fewer_cores_than_ranks_the_machine_is_the_bound():
    choice = best(Measured(actor_step=(1e-4, 1e-5), forward=(1e-4, 1e-7), update=(1e-3, 1e-6),
                           message=(1e-6, 0.0)), ranks=8, cores=2)
    assert choice.prediction.bound == "cores"


def test_hpcrl_tune_measures_writes_a_config_that_runs(tmp_path):
    out = tmp_path / "tuned.yaml"
    result = run_hpcrl("tune", str(REPO / "jobs/cartpole_appo.yaml"), "--ranks-per-node", "4", "--cores-per-node",
                       "2", "--budget-s", "4", "-o", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    text = out.read_text()
    assert text.startswith("# tuned by hpcrl tune from") and "# predicted:" in text and "bound by" in text
    cfg = yaml.safe_load(text)
    assert cfg["algo"]["batch_frames"] == 512  # the shipped job's frames per update: 2 env ranks x 8 x 32
    assert "best of" in result.stdout
    cfg["run"].update(output_dir=str(tmp_path / "runs"), total_frames=2048, target_return=None)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    run = mpirun(4, "run", str(tmp_path / "run.yaml"))
    assert run.returncode == 0, run.stdout + run.stderr
    refused = run_hpcrl("tune", str(REPO / "jobs/cartpole_dqn.yaml"), "--ranks-per-node", "4", "--budget-s", "1")
    assert refused.returncode == 2 and "not modelled yet" in refused.stderr
    zero = run_hpcrl("tune", str(REPO / "jobs/cartpole_appo.yaml"), "--ranks-per-node", "0")
    assert zero.returncode == 2 and "--ranks-per-node must be above 0" in zero.stderr


def test_sync_sampling_shares_the_cores_and_several_learners_pay_an_allreduce_per_gradient_step():
    """Sync mode on 4 ranks of 2 cores: the 3 sampling ranks (2 env, 1 inference) poll between
    steps, so sampling runs at 2/3 of their rates; two learners add a ring allreduce per step."""
    from hpcrl.tools.tune_model import Shape, predict
    m = Measured(actor_step=(5e-4, 0.0), forward=(2e-4, 0.0), update=(0.1, 0.0), message=(3e-6, 1e-9))
    shape = dict(learners=1, inference=1, envs=2, num_envs=8, groups=2, rollout=32, batch_frames=512,
                 envs_per_inference=2, envs_per_learner=2, request_bytes=400, reply_bytes=100, fragment_bytes=10_000,
                 sync=True, gradient_steps=40, gradient_bytes=40_000)
    crowded, roomy = predict(m, Shape(**shape), cores=2), predict(m, Shape(**shape), cores=3)
    sampling = lambda p: 1 / (1 / p.frames_per_s - 1 / p.per_role["learner"])  # noqa: E731
    assert sampling(crowded) == pytest.approx(sampling(roomy) * 2 / 3, rel=1e-6)
    two = predict(m, Shape(**{**shape, "learners": 2, "envs_per_learner": 1, "batch_frames": 1024}), cores=4)
    per_step = 1e-4 / 2 + 2 * (3e-6 + 1e-9 * 40_000 / 2)
    # its share of the batch (512 frames: 2 fragments of 32 x 8) and their receipt
    assert 1024 / two.per_role["learner"] == pytest.approx(0.1 + 40 * per_step + 2 * (3e-6 + 1e-5), rel=1e-6)
