"""Reproducible runs: a sync run is a function of its config, seed and learner count. Two runs on
one layout train bit-identical weights and metric rows, and a run with a fixed total of envs gives
the same weights on serial, 2 and 4 env ranks, with remote or inline inference (real mpirun jobs).
The replay families repeat in sync mode. Below them, the pieces that make it so: keyed draws and
forward passes in fixed blocks."""
import numpy as np
import pytest
import torch

from hpcrl.core.config import parse_config
from hpcrl.core.config_base import ConfigError
from hpcrl.core.messages import request_spec, reply_spec
from hpcrl.core.reproducible import MEASURED_COLUMNS, changed_packages, package_versions, repeatability
from hpcrl.core.seeds import env_seeds, keyed_uniforms
from hpcrl.envs import env_spaces
from hpcrl.io.checkpoint import load_checkpoint
from hpcrl.io.metrics import read_metrics
from hpcrl.models import build_policy, make_runner
from hpcrl.workers.policy_holder import PolicySet, RequestBatch
from tests.conftest import mpirun, run_dir, run_hpcrl, small_config, write_config
from tests.test_mpi_runs import imported



def test_keyed_draws_depend_on_their_key_alone():
    rows, steps = np.array([5, 900, 17, 3]), np.array([0, 0, 41, 7])
    both = keyed_uniforms(11, rows, steps, 3)
    assert both.shape == (4, 3) and ((both > 0) & (both < 1)).all()
    for i in range(4):  # a row drawn alone, or among others in another order: the same numbers
        np.testing.assert_array_equal(keyed_uniforms(11, rows[i:i + 1], steps[i:i + 1], 3)[0], both[i])
    np.testing.assert_array_equal(keyed_uniforms(11, rows[::-1], steps[::-1], 3), both[::-1])
    assert not np.isin(keyed_uniforms(12, rows, steps, 3), both).any()  # another key: other numbers
    assert not np.isin(keyed_uniforms(11, rows, steps + 1, 3), both).any()  # the next step: other numbers
    many = keyed_uniforms(0, np.arange(20_000), np.zeros(20_000, np.int64), 1)
    assert abs(many.mean() - 0.5) < 0.01 and abs(many.var() - 1 / 12) < 0.005  # uniform, as a check


def test_env_seeds_follow_the_global_env_index():
    """An env's seed is the same whichever rank steps it: 2 ranks of 8 envs, 4 of 4, one of 16."""
    whole = env_seeds(1, 0, 16)
    assert env_seeds(1, 8, 8) == whole[8:] and env_seeds(1, 12, 4) == whole[12:] and len(set(whole)) == 16


@pytest.mark.parametrize("sets, verdict", [
    (("run.deterministic=true",), "yes: the same config, seed and layout"),
    (("run.deterministic=true", "run.inference_block=2"), "forward passes of 2 envs: the same weights on other env-rank counts"),
    (("algo.mode=async",), "no: async mode trains on fragments in arrival order"),
    (("roles.inference.ranks=1",), "no: run.deterministic is false"),
    (("roles.inference.ranks=0",), "yes on this layout: inline policies compute each env rank's request alone"),
    (("algo.name=dqn",), "no: async dqn inserts records into replay in arrival order"),
    (("algo.name=sac", "env.id=Pendulum-v1", "algo.mode=sync", "algo.replay.replay_ratio=4", "run.deterministic=true"),
     "yes: the same config, seed and layout give bit-identical weights and metric rows (sync replay rounds)"),
    (("roles.learner.device=cuda",), "not guaranteed: CUDA's kernels"),
])
def test_inspect_verdict_says_what_repeats(sets, verdict):
    repeats, text = repeatability(parse_config("env: {num_envs: 8}", overrides=sets))
    assert verdict in text and repeats == text.startswith("yes")


def test_a_resume_names_the_packages_that_changed_since_its_checkpoint():
    now = package_versions()
    assert changed_packages({**now, "world_size": 4}) == [] and changed_packages({}) == []
    assert changed_packages({**now, "torch": "1.0.0"}) == [f"torch 1.0.0 -> {now['torch']}"]


def _holder(block, num_envs=8, continuous=False):
    cfg = parse_config("{}", overrides=(f"env.id={'Pendulum-v1' if continuous else 'CartPole-v1'}",
                                        f"env.num_envs={num_envs}", "model.hidden_sizes=[64, 64]"))
    spaces = env_spaces(cfg.env)
    torch.manual_seed(0)
    runner = make_runner(build_policy(spaces, cfg), "cpu", seed=0, draw_key=123)
    request = request_spec(num_envs, spaces.obs_shape, spaces.obs_dtype)
    reply = reply_spec(num_envs, spaces.action_shape, spaces.action_dtype)
    return RequestBatch(PolicySet([runner], []), request.allocate(), reply.allocate(), 4, block=block), request, reply


@pytest.mark.parametrize("continuous", [False, True])
def test_a_request_gets_the_same_bits_alone_or_batched_in_fixed_blocks(continuous):
    """run.deterministic: a request computed alone in blocks (of 3 envs: a size whose bits differ
    from a larger batch's in torch's CPU kernels) gives the same reply whichever other requests
    came with it; the same envs split over two requests of half the size (twice the env ranks) get
    the same reply bits too. Batched in one pass, the draws still follow each row's key."""
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(24, 3 if continuous else 4)).astype(np.float32)  # 24 env rows

    def answer(block, groups, per_request=6, step=5):
        batch, request, reply = _holder(block, per_request, continuous)
        items = []
        for g in groups:
            q, r = request.allocate(), reply.allocate()
            q["obs"][...] = obs[g * per_request:(g + 1) * per_request]
            q.set(row0=g * per_request, step=step)
            items.append((q, r, None))
        batch.answer(items)
        return {g: {k: r[k].copy() for k in ("actions", "logp", "values")} for g, (_, r, _) in zip(groups, items)}

    alone = answer(3, [2])[2]
    for together in (answer(3, [0, 1, 2, 3])[2], answer(3, [3, 2])[2]):
        for key in alone:
            np.testing.assert_array_equal(together[key], alone[key], err_msg=key)
    halves = answer(3, [4, 5], per_request=3)  # env rows 12-17 as two requests of 3
    for key in alone:
        np.testing.assert_array_equal(np.concatenate([halves[4][key], halves[5][key]]), alone[key], err_msg=key)
    batched = answer(None, [0, 1, 2, 3])[2]  # one pass of 24 rows: other bits, the same keyed draws
    assert not np.array_equal(batched["values"], alone["values"])
    np.testing.assert_allclose(batched["values"], alone["values"], rtol=1e-5)
    if continuous:
        np.testing.assert_allclose(batched["actions"], alone["actions"], rtol=1e-4)
    else:
        np.testing.assert_array_equal(batched["actions"], alone["actions"])  # no near-ties among 6 rows
    assert not np.array_equal(answer(3, [2], step=6)[2]["actions"], alone["actions"])


def _trained(cfg: dict) -> dict:
    """The final checkpoint's weights and optimizer state, and the metric rows of a finished run."""
    ckpt = load_checkpoint(str(run_dir(cfg) / "checkpoint.h5"))
    return {"model": ckpt["model"], "optimizer": ckpt["optimizer"],
            "metrics": read_metrics(str(run_dir(cfg) / "metrics.h5"))}


def assert_same_weights(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def assert_same_run(a: dict, b: dict, losses=("loss_policy", "loss_value", "entropy")) -> None:
    """Bit-identical weights, optimizer state and metric rows (the columns that measure the machine
    aside; a sync replay round without a gradient step has nan losses in both)."""
    assert_same_weights(a, b)
    for key, value in a["optimizer"].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b["optimizer"][key]), key
    assert a["metrics"].keys() == b["metrics"].keys()
    compared = [k for k in a["metrics"] if k not in MEASURED_COLUMNS]
    assert {"frames", "return_mean", *losses} <= set(compared)
    for key in compared:
        np.testing.assert_array_equal(a["metrics"][key], b["metrics"][key], err_msg=key)


TOTAL_ENVS = 12


def layout_run(tmp_path, name: str, env_ranks: int, inference: int = 1, learners: int = 1,
               num_envs: int | None = None, block: int = 3, frames: int = 4096, extra_env: dict | None = None,
               **sections) -> dict:
    """A sync PPO run on `env_ranks` env ranks (0: serial) of 12 envs in all (or `num_envs` each),
    in forward blocks of 3 envs (a size whose bits differ from larger batches' in torch's kernels);
    `sections` update the config's (env={...}, algo={...}). Its weights, optimizer state and
    metric rows, and what the launch printed ('out', 'err')."""
    serial = env_ranks == 0
    config = {"run": {"total_frames": frames, "target_return": None, "deterministic": True, "inference_block": block},
              "roles": {"learner": {"ranks": learners}, "inference": {"ranks": inference}, "env": {"ranks": "rest"}},
              "env": {"num_envs": num_envs or TOTAL_ENVS // max(env_ranks, 1)},
              "algo": {"rollout_length": 16, "epochs": 2, "num_minibatches": 4, "ent_coef": 0.01}}
    for key, value in sections.items():
        config[key] = {**config[key], **value}
    cfg = small_config(tmp_path, name=name, **config)
    ranks = 1 if serial else learners + inference + env_ranks
    done = mpirun(ranks, "run", str(write_config(tmp_path, cfg, f"{name}.yaml")), extra_env=extra_env)
    assert done.returncode == 0, done.stdout + done.stderr
    return {**_trained(cfg), "out": done.stdout, "err": done.stderr}


def test_a_sync_run_repeats_bit_for_bit_on_one_layout_and_trains_alike_on_others(tmp_path):
    """Twice on 4 ranks (1 learner, 1 policy server, 2 env ranks of 6 envs in groups of 3): the
    same weights, optimizer state and metric rows. The same 12 envs serially, on 2 env ranks with
    inline policies, and on 4 env ranks of 3 with the learner on the last rank (evaluating as it
    goes): the same weights."""
    first = layout_run(tmp_path, "remote2", env_ranks=2)
    assert_same_run(first, layout_run(tmp_path, "remote2_again", env_ranks=2))
    report = run_hpcrl("inspect", str(tmp_path / "runs" / "remote2"))
    assert report.returncode == 0, report.stderr
    assert "repeats      yes: the same config, seed and layout give bit-identical weights" in report.stdout
    assert (f"written by torch {package_versions()['torch']}, numpy {package_versions()['numpy']} on 4 ranks "
            f"(1 learner, 1 inference, 2 env; 12 envs)") in report.stdout
    for name, env_ranks, inference in (("serial", 0, 0), ("inline2", 2, 0)):
        assert_same_weights(first, layout_run(tmp_path, name, env_ranks, inference))
    # the learner (and so the weights' root) on the last rank, world rank 0 a policy server; the
    # learner root evaluates its policy (run.eval) without changing what it trains
    high = layout_run(tmp_path, "remote4_learner_high", env_ranks=4, roles={"learner": {"ranks": 1, "place": "high"}},
                      run={"eval": {"every_frames": 1500, "episodes": 2}})
    assert "roles: learner ranks 5; inference ranks 0; env ranks 1-4" in high["out"]
    assert high["out"].count("] eval at ") == 2 and np.isfinite(high["metrics"]["eval_return_mean"]).sum() == 2
    assert_same_weights(first, high)


def test_two_learners_stay_bit_identical_and_repeat_bit_for_bit(tmp_path):
    """6 ranks: 2 learners averaging gradients with Horovod, a policy server, 3 env ranks. After
    every update both learners hold the same weights, which change every update; the run repeats."""
    sections = dict(env_ranks=3, learners=2, num_envs=6, run={"replica_digests": True})
    first = layout_run(tmp_path, "two", **sections, extra_env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert imported("horovod", first["err"])  # the learners average with it
    # once, after the first updates: what averaging costs per gradient step against what it saves
    assert first["out"].count("gradient averaging over 2 learners: ") == 1, first["out"]
    digests = first["metrics"]["replica_digest"]
    assert digests.shape == (len(first["metrics"]["frames"]), 2) and np.all(digests[:, 0] == digests[:, 1])
    assert len(set(digests[:, 0])) == len(digests)  # the weights really change every update
    assert_same_run(first, layout_run(tmp_path, "two_again", **sections))


SPREAD = {"id": "mpe2:simple_spread_v3", "kwargs": {"N": 3, "max_cycles": 25, "continuous_actions": False}}


def test_ippo_repeats_and_trains_alike_serially(tmp_path):
    """MPE simple_spread, 3 agent rows per env: twice on 4 ranks (2 env ranks of 2 envs, blocks of
    one env, as a centralised critic needs), and the same 4 envs serially (MAPPO's repeat across
    nodes: tests/test_multinode.py)."""
    sections = dict(num_envs=2, block=1, frames=800, env=SPREAD, algo={"name": "ippo", "rollout_length": 25})
    first = layout_run(tmp_path, "ma", env_ranks=2, **sections)
    assert_same_run(first, layout_run(tmp_path, "ma_again", env_ranks=2, **sections))
    assert_same_weights(first, layout_run(tmp_path, "ma_serial", env_ranks=0, inference=0,
                                          **{**sections, "num_envs": 4}))


PENDULUM = {"env": {"id": "Pendulum-v1", "num_envs": 2},
            "algo": {"rollout_length": 8, "sac": {"batch_size": 32, "learning_starts": 64},
                     "replay": {"capacity": 4096, "warmup": 64, "replay_ratio": 4}}}
CARTPOLE_DQN = {"algo": {"rollout_length": 8, "dqn": {"batch_size": 32, "target_update_interval": 20,
                                                        "eps_schedule": "linear", "eps_decay_frames": 800},
                         "replay": {"capacity": 4096, "warmup": 128, "replay_ratio": 4}}}
R2D2 = {"model": {"core": "gru", "core_size": 16},
        "algo": {"rollout_length": 4, "dqn": {"batch_size": 8, "sequence_length": 8, "burn_in": 2,
                                              "sequence_period": 4, "eps_schedule": "linear"},
                 "replay": {"capacity": 1024, "warmup": 16, "replay_ratio": 2}}}


@pytest.mark.parametrize("name, sections, learners, inference, env_ranks, frames", [
    ("dqn", CARTPOLE_DQN, 1, 1, 2, 1200),  # a policy server, 2 groups of envs per env rank
    ("dqn", R2D2, 2, 1, 3, 600),  # R2D2: 2 learners averaging with Horovod, each with a replay shard
    ("sac", PENDULUM, 1, 0, 2, 600),  # inline policies
], ids=["dqn-4-ranks", "r2d2-6-ranks-2-learners", "sac-inline"])  # (TD3's: across nodes, tests/test_multinode.py)
def test_a_sync_replay_run_repeats_bit_for_bit(tmp_path, name, sections, learners, inference, env_ranks, frames):
    """algo.mode sync with a replay ratio: records enter the replay in rounds, in env-rank order,
    and each round's gradient steps are those the ratio owes, so two runs give the same weights,
    optimizer state and metric rows (the warm-up rounds' nan losses included)."""
    def run(label: str) -> dict:
        config = {"run": {"total_frames": frames, "target_return": None, "deterministic": True},
                  "roles": {"learner": {"ranks": learners}, "inference": {"ranks": inference}},
                  "env": {"num_envs": 4, "groups": 2 if inference else 1},
                  "algo": {"name": name, "mode": "sync"}, "model": {}}
        for key, value in sections.items():
            config[key] = {**config[key], **value}
        cfg = small_config(tmp_path, name=label, **config)
        done = mpirun(learners + inference + env_ranks, "run", str(write_config(tmp_path, cfg, f"{label}.yaml")))
        assert done.returncode == 0, done.stdout + done.stderr
        return _trained(cfg)

    first = run("first")
    losses = ("critic_loss", "actor_loss") if name != "dqn" else ("loss", "td_error")
    assert np.isnan(first["metrics"][losses[0]][0]) and not np.isnan(first["metrics"][losses[0]][-1])
    assert_same_run(first, run("again"), losses=losses)


def test_a_self_play_run_repeats_bit_for_bit(tmp_path):
    """Connect four against a pool of past versions drawn by PFSP, with anchors, on 4 ranks, twice:
    the same weights and metric rows, the games per pool age and against the anchors included."""
    def run(name: str) -> dict:
        sets = (f"run.output_dir={tmp_path / 'runs'}", f"run.name={name}", "run.total_frames=3072",
                "run.deterministic=true", "env.num_envs=4", "algo.rollout_length=16", "algo.selfplay.pool=2",
                "algo.selfplay.snapshot_every=2", "algo.selfplay.opponents=hard", "model.hidden_sizes=[32,32]")
        done = mpirun(4, "run", "jobs/connect_four_selfplay.yaml", *(a for s in sets for a in ("--set", s)))
        assert done.returncode == 0, done.stdout + done.stderr
        where = tmp_path / "runs" / name
        return {**load_checkpoint(str(where / "checkpoint.h5")), "metrics": read_metrics(str(where / "metrics.h5"))}

    first = run("first")
    assert first["metrics"]["selfplay.games"].sum() > 0 and first["metrics"]["anchor.uniform.games"].sum() > 0
    assert_same_run(first, run("again"))


def test_sync_replay_needs_a_replay_ratio():
    with pytest.raises(ConfigError) as refused:
        parse_config("algo: {name: dqn, mode: sync}")
    assert str(refused.value) == ("<config>: algo.mode: sync dqn trains the gradient steps algo.replay.replay_ratio "
                                  "owes after each round of records; set algo.replay.replay_ratio (e.g. 8: each "
                                  "transition sampled 8 times), or use algo.mode async")


@pytest.mark.parametrize("sets, message", [
    (("run.inference_block=2",), "run.inference_block: sets the forward passes of run.deterministic; set "
                                 "run.deterministic: true, or null here, got 2"),
    (("run.deterministic=true", "run.inference_block=3"), "run.inference_block: expected null or a divisor of the "
                                                         "envs per group (env.num_envs 8 / env.groups 2 = 4) such "
                                                         "as 1, 2, 4, got 3"),
])
def test_an_inference_block_that_cannot_apply_is_refused_with_one_message(sets, message):
    with pytest.raises(ConfigError) as refused:
        parse_config("env: {num_envs: 8}", overrides=sets)
    assert str(refused.value) == f"<config>: {message}"
