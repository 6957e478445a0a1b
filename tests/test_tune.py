"""`hpcrl tune`: the throughput model's choices on synthetic measurements (which role it gives the
ranks to, and which role it names as the bound), and the real command: it measures this machine,
writes a config that validates, and that config runs under mpirun."""
import dataclasses

import pytest
import torch
import yaml

from hpcrl.core.config import parse_config
from hpcrl.envs import EnvSpaces
from hpcrl.tools.cli import _parser
from hpcrl.tools.tune.model import Measured, fit_line
from hpcrl.tools.tune.search import candidates
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
    assert "averaging (wall seconds added to a gradient step) 2 learners" in text  # the 2-rank measurement ran
    costs = tmp_path / "costs.json"
    dqn = run_hpcrl("tune", str(REPO / "jobs/cartpole_dqn.yaml"), "--ranks-per-node", "4", "--budget-s", "2",
                    "--no-averaging-measure", "-o", str(tmp_path / "dqn.yaml"), "--save-costs", str(costs))
    assert dqn.returncode == 0, dqn.stdout + dqn.stderr
    # costs saved once plan other sizes without measuring again, for the same env, algorithm and network only
    again = run_hpcrl("tune", str(REPO / "jobs/cartpole_dqn.yaml"), "--ranks-per-node", "16", "--nodes", "2",
                      "--costs", str(costs))
    assert again.returncode == 0 and f"from {costs}" in again.stdout, again.stdout + again.stderr
    other = run_hpcrl("tune", str(REPO / "jobs/cartpole_appo.yaml"), "--ranks-per-node", "4", "--costs", str(costs))
    assert other.returncode == 2 and "measured for" in other.stderr and "'algo': 'dqn'" in other.stderr
    no_gpu = run_hpcrl("tune", str(REPO / "jobs/cartpole_appo.yaml"), "--ranks-per-node", "4", "--gpus-per-node", "1",
                       "--budget-s", "2", "--no-averaging-measure")
    if torch.cuda.is_available():  # GPU costs are measured here
        assert no_gpu.returncode == 0 and "forward_cuda" in no_gpu.stdout, no_gpu.stdout + no_gpu.stderr
    else:
        assert no_gpu.returncode == 2 and "this machine has none" in no_gpu.stderr
    gpu_from_cpu_costs = run_hpcrl("tune", str(REPO / "jobs/cartpole_dqn.yaml"), "--ranks-per-node", "4",
                                   "--gpus-per-node", "1", "--costs", str(costs))
    assert gpu_from_cpu_costs.returncode == 2 and "measured without a GPU" in gpu_from_cpu_costs.stderr
    assert "gradient steps/s, replay ratio 32.00" in dqn.stdout and "insert" in dqn.stdout
    tuned_dqn = parse_config((tmp_path / "dqn.yaml").read_text())  # validates
    assert tuned_dqn.algo.dqn.batch_size == 64 and tuned_dqn.algo.replay.replay_ratio == 32
    failed = run_hpcrl("tune", str(REPO / "jobs/cartpole_appo.yaml"), "--ranks-per-node", "4", "--budget-s", "1",
                       "--averaging-launcher", "false")
    assert failed.returncode == 2 and "the averaging measurement on two learners failed" in failed.stderr
    assert "Traceback" not in failed.stderr
    zero = run_hpcrl("tune", str(REPO / "jobs/cartpole_appo.yaml"), "--ranks-per-node", "0")
    assert zero.returncode == 2 and "--ranks-per-node must be above 0" in zero.stderr


def test_tunes_former_flag_names_still_work_and_are_hidden(capsys):
    base = ["tune", "c.yaml", "--ranks-per-node", "4"]
    new = _parser().parse_args([*base, "--averaging-launcher", "srun -n 2", "--no-averaging-measure"])
    old = _parser().parse_args([*base, "--probe-launcher", "srun -n 2", "--no-learner-probe"])
    default = _parser().parse_args(base)
    assert (old.averaging_launcher, old.no_averaging_measure) == (new.averaging_launcher, new.no_averaging_measure)
    assert (new.averaging_launcher, new.no_averaging_measure) == ("srun -n 2", True)
    assert (default.averaging_launcher, default.no_averaging_measure) == ("mpirun -n 2", False)
    with pytest.raises(SystemExit):
        _parser().parse_args(["tune", "--help"])
    shown = capsys.readouterr().out
    assert "--averaging-launcher" in shown and "--no-averaging-measure" in shown and "probe" not in shown


def test_sync_sampling_shares_the_cores_and_several_learners_pay_an_allreduce_per_gradient_step():
    """Sync mode on 4 ranks of 2 cores: the 3 sampling ranks (2 env, 1 inference) poll between
    steps, so sampling runs at 2/3 of their rates; two learners add a ring allreduce per step."""
    from hpcrl.tools.tune.model import Shape, predict
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


DQN_CONFIG = """
env: {{id: CartPole-v1, num_envs: 8}}
algo: {{name: dqn, rollout_length: 32, dqn: {{batch_size: 64, gradient_steps: 4}},
        replay: {{replay_ratio: {ratio}, capacity: 100000, warmup: 1000}}}}
roles: {{learner: {{ranks: {learners}}}, inference: {{ranks: 1}}, env: {{ranks: rest}}}}
"""


def dqn_best(m: Measured, ratio="8", learners=1, ranks=32, cores=None):
    cfg = parse_config(DQN_CONFIG.format(ratio=ratio, learners=learners))
    ranked, _ = candidates(cfg, CARTPOLE, m, ranks, 1, cores or ranks)
    return ranked


def test_dqn_with_a_replay_ratio_gets_learners_while_averaging_is_cheap_and_its_steps_follow_the_ratio():
    """A replay ratio ties the learners' gradient steps to the frames: r rows sampled per row
    inserted, step_rows (batch_size / learners) rows per step. Costly steps want learners, unless
    averaging gradients between them costs more than it saves."""
    costly_steps = dict(actor_step=(1e-5, 1e-6), forward=(1e-7, 1e-9), update=(2e-3, 1e-5), message=(1e-6, 0.0),
                        insert=(1e-6, 1e-8))
    cheap = dqn_best(Measured(**costly_steps, averaging_step=1e-5))[0]
    L = cheap.counts[0]
    assert L > 1 and cheap.prediction.bound == "learner"
    p = cheap.prediction
    # every learner: 8 rows sampled per row it takes in, 64 / L rows a step, the frames shared evenly
    assert p.gradient_steps_per_s * (64 // L) * L == pytest.approx(p.frames_per_s * 8, rel=1e-9)
    assert p.replay_ratio == 8
    dear = dqn_best(Measured(**costly_steps, averaging_step=0.1))[0]
    assert dear.counts[0] == 1  # a step of 0.1 s more than undoes halving the batch


def test_ape_x_keeps_the_configs_learners_which_train_flat_out_on_what_the_sampling_ranks_leave():
    m = Measured(actor_step=(1e-4, 1e-5), forward=(1e-4, 1e-7), update=(1e-3, 1e-5), message=(1e-6, 0.0),
                 insert=(1e-6, 1e-8), averaging_step=1e-4)
    ranked = dqn_best(m, ratio="null", learners=2)
    assert {c.counts[0] for c in ranked} == {2}  # the learner count is the config's; the rest is tuned
    p = ranked[0].prediction
    assert p.bound == "env" and p.gradient_steps_per_s > 0
    # the replay ratio that follows: the busiest learner's rows sampled per row it took in (its env ranks' frames)
    envs = ranked[0].counts[2]
    taken_in = p.frames_per_s * -(-envs // 2) / envs
    assert p.replay_ratio == pytest.approx(p.gradient_steps_per_s * 32 / taken_in, rel=1e-9)
    # on 8 cores for 32 ranks, every rank busy: the learners keep their share (2 of 32), the others get the rest
    crowded = dqn_best(m, ratio="null", learners=2, cores=8)[0].prediction
    assert crowded.bound == "cores"
    assert crowded.frames_per_s == pytest.approx(8 * 30 / 32 / sum(v for r, v in crowded.cpu_per_frame.items()
                                                                   if r != "learner"), rel=1e-9)


def test_with_gpus_learners_go_on_them_when_their_update_is_faster_there_never_more_than_a_node_has():
    cpu_costs = dict(actor_step=(1e-5, 1e-6), forward=(1e-4, 1e-6), update=(1e-2, 1e-5), message=(1e-6, 0.0))
    gpu = Measured(**cpu_costs, forward_cuda=(2e-4, 1e-9), update_cuda=(1e-3, 1e-8))
    ranked, _ = candidates(parse_config(CONFIG), CARTPOLE, gpu, 32, 2, 64, gpus_per_node=2)
    best = ranked[0].cfg.roles
    assert best.learner.device == "cuda" and best.learner.per_node in (1, 2)
    for choice in ranked:  # one GPU per rank: learners and inference ranks on GPUs fit the node's 2
        r = choice.cfg.roles
        on_gpus = sum(spec.per_node or 0 for spec in (r.learner, r.inference) if spec.device == "cuda")
        assert on_gpus <= 2
    assert any(c.cfg.roles.inference.device == "cuda" for c in ranked)
    cpu_only, _ = candidates(parse_config(CONFIG), CARTPOLE, Measured(**cpu_costs), 32, 2, 64, gpus_per_node=2)
    assert {c.cfg.roles.learner.device for c in cpu_only} == {"cpu"}  # no GPU costs, no GPU layouts


def test_of_layouts_the_model_cannot_tell_apart_the_one_with_fewest_envs_per_rank_is_picked():
    from hpcrl.tools.tune.model import Prediction
    from hpcrl.tools.tune.search import Choice, pick
    cfg = parse_config(CONFIG)

    def choice(frames, envs):
        return Choice(dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, num_envs=envs)),
                      Prediction(frames, "env"), (1, 0, 3))
    fastest, close, slow = choice(1000.0, 64), choice(990.0, 8), choice(900.0, 4)
    assert pick([fastest, close, slow]) is close  # within 2%: fewer envs; 10% slower: not a tie
    assert pick([fastest, slow]) is fastest


def test_when_no_layout_fits_the_error_says_whether_the_batch_or_the_memory_is_why():
    from hpcrl.core.config import ConfigError
    m = Measured(actor_step=(1e-4, 1e-5), forward=(1e-4, 1e-7), update=(1e-3, 1e-6), message=(1e-6, 0.0))
    with pytest.raises(ConfigError, match=r"need more than .* GiB on a rank \(at least .* GiB on a .* rank; "
                                          r"--memory-per-rank-gib raises the limit"):
        candidates(parse_config(CONFIG), CARTPOLE, m, 8, 1, 8, memory_per_rank=4096)
    odd = parse_config(CONFIG.replace("batch_frames: 8192", "batch_frames: 1000"))
    with pytest.raises(ConfigError, match="do not split algo.batch_frames 1,000 into whole fragments"):
        candidates(odd, CARTPOLE, m, 8, 1, 8)


def test_dqn_layouts_fit_where_the_configs_own_learner_count_does_not_split_its_batch():
    m = Measured(actor_step=(1e-4, 1e-5), forward=(1e-4, 1e-7), update=(1e-3, 1e-5), message=(1e-6, 0.0),
                 insert=(1e-6, 1e-8))
    ranked, own = candidates(parse_config(DQN_CONFIG.format(ratio="8", learners=3)), CARTPOLE, m, 16, 1, 16)
    assert own is None and ranked  # 64 rows per step do not split over 3 learners; over 1, 2, 4 they do
    assert {c.counts[0] for c in ranked} <= {1, 2, 4, 8}
    # Ape-X keeps one learner on CPUs and may still put its inference ranks on the GPUs
    gpu = Measured(actor_step=(1e-4, 1e-5), forward=(1e-3, 1e-5), update=(1e-3, 1e-5), message=(1e-6, 0.0),
                   insert=(1e-6, 1e-8), forward_cuda=(1e-4, 1e-9), update_cuda=(1e-4, 1e-8))
    apex, _ = candidates(parse_config(DQN_CONFIG.format(ratio="null", learners=1)), CARTPOLE, gpu, 8, 2, 16,
                         gpus_per_node=2)
    assert any(c.cfg.roles.inference.device == "cuda" and c.cfg.roles.learner.device == "cpu" for c in apex)
    from hpcrl.core.config import ConfigError
    with pytest.raises(ConfigError, match="need a world size of at least 4"):  # said clearly, not "no layout"
        candidates(parse_config(DQN_CONFIG.format(ratio="null", learners=2)), CARTPOLE, m, 3, 1, 3)
