"""Gymnasium team envs as agent rows (envs/gym_teams.py): Level-Based Foraging and the Multi-Robot
Warehouse (the `marl` extra), stepped through hpcrl's vector against the packages' own envs, and a
short serial IPPO run on Level-Based Foraging."""
import sys

import gymnasium as gym
import numpy as np
import pytest

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.envs import env_spaces, imports_of_env_id, make_vector_env
from hpcrl.envs.multiagent import ParallelVector
from hpcrl.io.metrics import read_metrics
from tests.conftest import mpirun, run_dir, small_config, write_config


LBF, LBF_ID = "lbforaging:Foraging-8x8-2p-3f-v3", "Foraging-8x8-2p-3f-v3"
RWARE, RWARE_ID = "rware:rware-tiny-2ag-v2", "rware-tiny-2ag-v2"


def env_config(env_id: str, num_envs: int = 2, algo: str = "ippo", **kwargs):
    return parse_config(f"env: {{id: '{env_id}', num_envs: {num_envs}, kwargs: {kwargs}}}\n"
                        f"algo: {{name: {algo}}}").env


@pytest.mark.parametrize("env_id, obs_width, actions", [(LBF, 15, 6), (RWARE, 71, 5)], ids=["lbf", "rware"])
def test_spaces_count_the_agents_as_for_a_pettingzoo_env(env_id, obs_width, actions):
    spaces = env_spaces(env_config(env_id))
    assert spaces.num_agents == 2 and spaces.agents == ("agent_0", "agent_1")
    assert spaces.obs_shape == (obs_width,) and spaces.obs_dtype == "float32"
    assert spaces.num_actions == actions and not spaces.continuous and not spaces.action_mask
    assert spaces.state_dim == 0  # ippo: no global state in the rows
    assert imports_of_env_id(env_id) is None  # a known family: the id only looks an env up


def follow_the_packages_env(env_id: str, gym_id: str, num_envs: int, seed: int, steps: int, **kwargs) -> dict:
    """Steps hpcrl's vector of `env_id` and the package's own envs with the same random actions,
    asserting that rows are env-major agents, rewards per agent, ends, final observations and
    same-step resets agree with the package; returns what happened."""
    envs, obs = make_vector_env(env_config(env_id, num_envs, **kwargs), seed=seed)
    assert type(envs.unwrapped) is ParallelVector and obs.shape[0] == 2 * num_envs
    spec = gym.spec(gym_id)
    own = [gym.make(gym_id, disable_env_checker=True, **kwargs) for _ in range(num_envs)]
    limit = {**spec.kwargs, **kwargs}.get("max_episode_steps", {**spec.kwargs, **kwargs}.get("max_steps"))
    expected = [np.stack(env.reset(seed=seed + e)[0]) for e, env in enumerate(own)]
    np.testing.assert_array_equal(obs, np.concatenate(expected))  # row 2e + i: agent i of env e
    rng = np.random.default_rng(seed)
    n_actions = int(envs.single_action_space.n)
    seen = {"rewarded": 0, "unequal_rewards": 0, "truncated": 0, "terminated": 0}
    elapsed = np.zeros(num_envs, dtype=int)
    for _ in range(steps):
        actions = rng.integers(0, n_actions, 2 * num_envs)
        obs, rewards, terminated, truncated, info = envs.step(actions)
        elapsed += 1
        for e, env in enumerate(own):
            rows = slice(2 * e, 2 * e + 2)
            observed, reward, done, _, _ = env.step(tuple(int(a) for a in actions[rows]))
            assert rewards[rows].tolist() == list(reward)  # each agent's own, as the package gives it
            seen["rewarded"] += int(np.count_nonzero(reward))
            seen["unequal_rewards"] += int(reward[0] != reward[1])
            # the package ends its episodes at its step limit too, but calls that terminated
            assert bool(info["env_done"][e]) == done == (terminated[rows].any() or truncated[rows].any())
            if done:
                cut_off = bool(elapsed[e] == limit)
                assert truncated[rows].tolist() == [cut_off] * 2 and terminated[rows].tolist() == [not cut_off] * 2
                assert info["_final_obs"][rows].all()
                np.testing.assert_array_equal(np.stack(info["final_obs"][rows]), np.stack(observed))
                seen["truncated" if cut_off else "terminated"] += 1
                observed, elapsed[e] = env.reset()[0], 0  # hpcrl's vector restarted it in the same step
            np.testing.assert_array_equal(obs[rows], np.stack(observed))
            assert info["active"][rows].all()
    envs.close()
    return seen


def test_foraging_rows_are_the_packages_agents_step_for_step_past_the_time_limit():
    """LBF's episodes last 50 steps unless the food runs out: 60 steps see every env cut off at 50
    (truncated, not terminated) and restarted in the same step, and rewards that differ by agent."""
    seen = follow_the_packages_env(LBF, LBF_ID, num_envs=4, seed=0, steps=60)
    assert seen["truncated"] == 4 and seen["rewarded"] > 0 and seen["unequal_rewards"] > 0
    # on a 5x5 field with one food, random agents finish the food early: the episode terminates
    seen = follow_the_packages_env("lbforaging:Foraging-5x5-2p-1f-v3", "Foraging-5x5-2p-1f-v3", 4, 0, 100)
    assert seen["terminated"] > 0 and seen["truncated"] > 0


def test_warehouse_rows_are_the_packages_agents_to_the_500_step_limit():
    seen = follow_the_packages_env(RWARE, RWARE_ID, num_envs=2, seed=5, steps=505)
    assert seen["truncated"] == 2 and seen["terminated"] == 0


@pytest.mark.parametrize("env_id, kwargs", [(LBF, {"max_episode_steps": 7}), (RWARE, {"max_steps": 7})],
                         ids=["lbf", "rware"])
def test_env_kwargs_set_the_step_limit_that_truncates(env_id, kwargs):
    envs, _ = make_vector_env(env_config(env_id, 2, **kwargs), seed=0)
    for t in range(1, 8):
        _, _, terminated, truncated, info = envs.step(np.zeros(4, dtype=np.int64))
        assert truncated.all() == info["env_done"].all() == (t == 7) and not terminated.any()
    envs.close()


@pytest.mark.parametrize("env_id, obs_width", [(LBF, 15), (RWARE, 71)], ids=["lbf", "rware"])
def test_the_global_state_is_every_agents_observation(env_id, obs_width):
    """MAPPO's rows: the agent's observation, then the env's state(), which is both agents' observations."""
    spaces = env_spaces(env_config(env_id, algo="mappo"))
    assert spaces.state_dim == 2 * obs_width and spaces.obs_shape == (3 * obs_width,)
    envs, obs = make_vector_env(env_config(env_id, 3, algo="mappo"), seed=1)
    rng = np.random.default_rng(1)
    for _ in range(3):
        for e in range(3):
            own = obs[2 * e:2 * e + 2, :obs_width]
            state = obs[2 * e:2 * e + 2, obs_width:]
            np.testing.assert_array_equal(state, np.tile(own.reshape(-1), (2, 1)))
            assert envs.unwrapped.envs[e].state().dtype == np.float32
        obs = envs.step(rng.integers(0, spaces.num_actions, 6))[0]
    envs.close()


@pytest.mark.parametrize("env_id", [LBF, RWARE], ids=["lbf", "rware"])
def test_seeded_resets_repeat_exactly(env_id):
    """The same seeds give the same episodes, and a seeded reset depends on its seed only, not on
    the episode before it (LBF's own reset does: it keeps players off where the last ones stood)."""
    def play(seed: int) -> list:
        envs, obs = make_vector_env(env_config(env_id, 2), seed=seed)
        rng = np.random.default_rng(0)
        n_actions = int(envs.single_action_space.n)
        steps = [obs] + [np.concatenate([out[0], out[1][:, None]], axis=1)
                         for out in (envs.step(rng.integers(0, n_actions, 4)) for _ in range(60))]
        steps.append(envs.reset(seed=[seed, seed + 1])[0])
        envs.close()
        return steps
    first, again, other = play(3), play(3), play(4)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(first[-1], first[0])
    assert not np.array_equal(first[0], other[0])


def test_a_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "rware", None)  # as if not installed: its import fails
    with pytest.raises(ConfigError, match=r"needs the rware package.*pip install 'hpcrl\[marl\]'"):
        env_spaces(env_config(RWARE))


def test_serial_ippo_trains_on_level_based_foraging(tmp_path):
    """A short real run: IPPO on 8 LBF envs (16 agent rows), 50-step rollouts, in one process."""
    cfg = small_config(tmp_path, env={"id": LBF, "num_envs": 8}, roles={"inference": {"ranks": 0}},
                       algo={"name": "ippo", "rollout_length": 50, "epochs": 2, "num_minibatches": 2,
                             "lr": 0.0005}, model={"hidden_sizes": [64, 64]}, run={"total_frames": 4000})
    result = mpirun(1, "run", str(write_config(tmp_path, cfg)), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    assert metrics["frames"][-1] == 4000 and len(metrics["frames"]) == 10
    assert metrics["episodes"].sum() >= 8 * 2 * 10  # every agent ends an episode in each 50-step rollout
    assert np.all(np.isfinite(metrics["return_mean"]))
