"""hpcrl.envs: spaces, envs by import path, continuous actions, vector backends (the SAME_STEP
contract), reward normalisation and the env-ceiling helpers."""
import sys

import gymnasium as gym
import numpy as np
import pytest

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.core.moments import ReturnScaler
from hpcrl.envs import EnvSpaces, make_vector_env, env_spaces, random_actions
from tests.conftest import mpirun


def env_cfg(**env):
    return parse_config("", overrides=tuple(f"env.{k}={v}" for k, v in env.items())).env


def error_of(**env) -> str:
    with pytest.raises(ConfigError) as info:
        env_spaces(env_cfg(**env))
    return str(info.value)


# --- spaces -------------------------------------------------------------------------------------

def test_spaces_of_discrete_continuous_and_image_envs():
    assert env_spaces(env_cfg(id="CartPole-v1")) == EnvSpaces((4,), "float32", 2)
    lander = env_spaces(env_cfg(id="LunarLander-v3"))
    assert (lander.obs_shape, lander.num_actions, lander.continuous) == ((8,), 4, False)
    cheetah = env_spaces(env_cfg(id="HalfCheetah-v5"))
    assert cheetah == EnvSpaces((17,), "float64", 0, (6,), "float32", (-1.0,) * 6, (1.0,) * 6)
    assert cheetah.continuous
    atari = env_spaces(env_cfg(id="ALE/Breakout-v5", preset="atari"))
    assert (atari.obs_shape, atari.obs_dtype, atari.num_actions) == ((4, 84, 84), "uint8", 4)


@pytest.mark.parametrize("env_id, obs_shape", [("HalfCheetah-v5", (17,)), ("LunarLander-v3", (8,))])
def test_mujoco_and_box2d_step_through_the_vector(env_id, obs_shape):
    cfg = env_cfg(id=env_id, num_envs=3)
    spaces = env_spaces(cfg)
    envs, obs = make_vector_env(cfg, seed=1)
    rng = np.random.default_rng(0)
    for _ in range(5):
        actions = random_actions(spaces, 3, rng)
        assert envs.single_action_space.contains(actions[0])
        obs, rewards, terminated, truncated, _ = envs.step(actions)
    assert obs.shape == (3, *obs_shape) and rewards.shape == (3,) and np.isfinite(rewards).all()
    envs.close()


def test_unsupported_action_space_says_what_is_supported():
    msg = error_of(id="tests.custom_envs:Keys")
    assert "MultiDiscrete" in msg and "supports Discrete actions" in msg and "Box (continuous)" in msg


def test_continuous_actions_are_clipped_before_the_env_sees_them():
    envs, _ = make_vector_env(env_cfg(id="tests.custom_envs:Pointer", num_envs=2), seed=0)
    actions = np.array([[5.0, -0.5], [-3.0, 0.25]], np.float32)
    obs, *_ = envs.step(actions)
    np.testing.assert_array_equal(obs, [[1.0, -0.5], [-1.0, 0.25]])
    assert actions[0, 0] == 5.0  # the caller's (the fragment's) array keeps the sampled action


# --- envs by import path ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["Corridor", "make_corridor"])
def test_class_or_factory_by_import_path_gets_kwargs_and_a_time_limit(name):
    envs, obs = make_vector_env(env_cfg(id=f"tests.custom_envs:{name}", num_envs=1,
                                        kwargs="{length: 2}"), seed=0)
    envs.step(np.array([1]))
    _, reward, terminated, _, info = envs.step(np.array([1]))
    assert terminated[0] and reward[0] == 1.0 and info["final_obs"][0][0] == 2.0  # length 2 reached
    envs, _ = make_vector_env(env_cfg(id=f"tests.custom_envs:{name}", num_envs=1,
                                      kwargs="{length: 5, max_episode_steps: 3}"), seed=0)
    for _ in range(3):
        _, _, terminated, truncated, _ = envs.step(np.array([0]))
    assert truncated[0] and not terminated[0]


def test_module_that_registers_an_id_still_works():
    assert env_spaces(env_cfg(id="tests.instrumented_envs:HpcrlTest/Exploding-v0")).num_actions == 2


def test_import_path_errors_name_the_problem():
    msg = error_of(id="tests.no_such_module:Env")
    assert "cannot import module 'tests.no_such_module'" in msg and "No module named" in msg
    msg = error_of(id="tests.custom_envs:Coridor")
    assert "has no attribute 'Coridor'" in msg and "close names: Corridor" in msg
    assert "not a gymnasium.Env subclass" in error_of(id="tests.custom_envs:NotAnEnv")
    assert "returned int, not a gymnasium.Env" in error_of(id="tests.custom_envs:make_nothing")


# --- backends: the SAME_STEP contract -----------------------------------------------------------

def cartpole_step(obs: np.ndarray, action: int) -> np.ndarray:
    """One CartPole step from `obs`, by gymnasium's reference single env."""
    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    env.state = obs.astype(np.float64)
    return env.step(action)[0]


@pytest.mark.parametrize("backend", ["sync", "numpy", "envpool"])
def test_every_backend_resets_finished_envs_in_the_same_step(backend):
    """Env 0 pushes right until the pole falls (terminated), env 1 balances until the time limit
    (truncated at step 12): a finished env returns its reset obs at once, its last obs in
    info["final_obs"], and steps on from the reset obs."""
    cfg = env_cfg(id="CartPole-v1", num_envs=2, backend=backend, kwargs="{max_episode_steps: 12}")
    envs, obs = make_vector_env(cfg, seed=3)
    seen = {"terminated": 0, "truncated": 0}
    for t in range(48):
        actions = np.array([1, int(obs[1, 2] + 0.5 * obs[1, 3] > 0)])  # env 1: a simple balancer
        next_obs, rewards, terminated, truncated, info = envs.step(actions)
        done = terminated | truncated
        for i in range(2):
            stepped = info["final_obs"][i] if done[i] else next_obs[i]
            np.testing.assert_allclose(stepped, cartpole_step(obs[i], actions[i]), atol=1e-5)
            if done[i]:
                assert np.all(np.abs(next_obs[i]) <= 0.05)  # a fresh reset state
                seen["terminated" if terminated[i] else "truncated"] += 1
        assert rewards.tolist() == [1.0, 1.0]  # no reward-0 "reset steps"
        assert not (truncated & terminated).any()
        if truncated[1]:
            assert (t + 1) % 12 == 0
        obs = next_obs
    assert seen["terminated"] >= 2 and seen["truncated"] >= 2
    envs.close()


def test_numpy_backend_needs_a_vectorised_env():
    msg = error_of(id="LunarLander-v3", backend="numpy")
    assert "env.backend: 'numpy'" in msg and "CartPole-v1" in msg and "use backend: sync" in msg


def test_missing_envpool_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # what a machine without envpool sees
    assert "pip install hpcrl[envpool]" in error_of(id="CartPole-v1", backend="envpool")


def test_same_seed_same_envs_for_each_backend():
    for backend in ("sync", "numpy", "envpool"):
        cfg = env_cfg(id="CartPole-v1", num_envs=3, backend=backend)
        a, b = make_vector_env(cfg, seed=7)[1], make_vector_env(cfg, seed=7)[1]
        np.testing.assert_array_equal(a, b)


# --- reward normalisation -----------------------------------------------------------------------

def test_actors_report_the_moments_of_the_discounted_return_and_pass_rewards_unchanged():
    gamma, n = 0.9, 2
    cfg = env_cfg(id="CartPole-v1", num_envs=n, normalize_reward="true", kwargs="{max_episode_steps: 5}")
    envs, _ = make_vector_env(cfg, seed=0, gamma=gamma)
    returns, history = np.zeros(n), []
    for step in range(12):
        _, rewards, terminated, truncated, _ = envs.step(np.zeros(n, dtype=np.int64))
        np.testing.assert_array_equal(rewards, 1.0)  # the trainers scale them
        returns = returns * gamma + rewards
        history.extend(returns)
        returns[terminated | truncated] = 0.0
        if step in (4, 11):  # as at two fragment ends: the moments since the last one
            count, mean, m2 = envs.take_moments()
            x = np.array(history)
            assert count == len(x) and mean == pytest.approx(x.mean()) and m2 == pytest.approx(((x - x.mean()) ** 2).sum())
            history = []


def test_the_reward_scale_merges_every_env_rank_and_is_the_same_on_every_trainer():
    rng = np.random.default_rng(0)
    per_rank = [rng.normal(5.0, 3.0, size=k) for k in (40, 7, 100, 1)]  # four env ranks' returns
    rows = [(len(x), x.mean(), ((x - x.mean()) ** 2).sum()) for x in per_rank]
    trainers = [ReturnScaler(), ReturnScaler()]  # env ranks 0-1 feed the first, 2-3 the second
    local = [trainers[0], rows[:2]], [trainers[1], rows[2:]]
    sums = {}
    for scaler, mine in local:  # what the allreduce does: each trainer's pooled sums, added up
        scaler.fold(mine, reduce=lambda v, key=id(scaler): sums.setdefault(key, v))
    total = sum(sums.values())
    for scaler, mine in local:
        scaler.__init__()
        scaler.fold(mine, reduce=lambda v: total)
    everything = np.concatenate(per_rank)
    reference = ReturnScaler()
    reference.fold([(len(everything), everything.mean(), ((everything - everything.mean()) ** 2).sum())])
    for scaler in trainers:
        assert (scaler.mean, scaler.var, scaler.count) == pytest.approx((reference.mean, reference.var, reference.count))
    w = 1e-4  # SB3's start: mean 0, variance 1, weight 1e-4
    mean = everything.sum() / (len(everything) + w)
    var = (w * (1 + mean ** 2) + ((everything - mean) ** 2).sum()) / (len(everything) + w)
    assert reference.var == pytest.approx(var, rel=1e-9)
    np.testing.assert_allclose(reference.scale(np.array([1.0, 1e6])), [1 / np.sqrt(var + 1e-8), 10.0], rtol=1e-6)
    saved = reference.state()
    restored = ReturnScaler()
    restored.restore(saved)
    assert (restored.mean, restored.var, restored.count) == (reference.mean, reference.var, reference.count)


# --- the env ceiling ----------------------------------------------------------------------------

def test_random_actions_fit_the_spaces():
    rng = np.random.default_rng(0)
    discrete = random_actions(EnvSpaces((4,), "float32", 3), 100, rng)
    assert discrete.dtype == np.int64 and set(discrete.tolist()) == {0, 1, 2}
    box = random_actions(EnvSpaces((3,), "float32", 0, (2,), "float32", (-2.0, 0.0), (2.0, np.inf)), 100, rng)
    assert box.shape == (100, 2) and box.dtype == np.float32
    assert (np.abs(box[:, 0]) <= 2).all() and box[:, 0].std() > 0.5 and (box[:, 1] < 0).any()



def test_an_env_whose_observations_do_not_fit_its_space_is_refused_at_start_up(tmp_path):
    """Issue 46, item 1: a Box(2) space and 3 values from reset() was a 30-line traceback ending in
    numpy's 'Output array is the wrong shape', exit 1. Now one message names the env, the space and
    what reset() returned; `hpcrl run` exits 2 and writes nothing."""
    message = ("env.id 'tests.custom_envs:WrongShape': reset() returned an observation of shape (3,) (float32), but "
               "its observation_space is Box(-1.0, 1.0, (2,), float32) (shape (2,), float32); return arrays of shape "
               "(2,) from reset() and step(), or declare the space the env really gives")
    assert error_of(id="tests.custom_envs:WrongShape") == message
    path = tmp_path / "job.yaml"
    path.write_text(f"env: {{id: 'tests.custom_envs:WrongShape'}}\nrun: {{output_dir: {tmp_path / 'runs'}}}\n")
    run = mpirun(1, "run", str(path))
    assert run.returncode == 2 and "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
    said = [line for line in run.stderr.splitlines() if line.startswith("hpcrl:")]
    assert said == [f"hpcrl: config error: {message}"]
    assert not (tmp_path / "runs").exists()
