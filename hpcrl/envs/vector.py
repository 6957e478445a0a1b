"""Vector-env backends adapted to the one contract env ranks rely on, and the vector wrappers they share.

The contract (gymnasium's SAME_STEP autoreset): an env that finishes in a step is reset inside that
step; the step returns its reset observation, and info["final_obs"][i] holds its last observation
(needed to bootstrap truncated episodes). Backends that reset on the NEXT step instead (gymnasium's
numpy vector envs, envpool) are adapted in one place, `SameStepAutoreset`.

Episode statistics count raw rewards over whole episodes. When training sees something else (clipped
or normalised rewards, an Atari life loss treated as terminal), the step's info carries
info[RAW_REWARD] (float [N]) and info[GAME_OVER] (bool [N]); workers/env_group.py reads them when present.

No MPI and no torch here (env ranks with remote inference import only numpy and gymnasium).
"""
from __future__ import annotations

import difflib

import numpy as np
import gymnasium as gym
from gymnasium.vector import AutoresetMode

from hpcrl.core.moments import merge_moments
from hpcrl.core.config import ConfigError

RAW_REWARD = "raw_reward"  # the reward before clipping / normalising
GAME_OVER = "game_over"    # the whole episode (an Atari game, not a life) ended in this step


class SameStepAutoreset(gym.vector.VectorWrapper):
    """A NEXT_STEP vector env made SAME_STEP: envs that finish are reset at once with
    `reset_rows(vector, rows) -> their reset observations`."""

    def __init__(self, env: gym.vector.VectorEnv, reset_rows):
        super().__init__(env)
        self.reset_rows = reset_rows
        self.metadata = {**env.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}

    def step(self, actions):
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        done = terminated | truncated
        if done.any():
            rows = np.flatnonzero(done)
            info = {**info, "final_obs": obs, "_final_obs": done}
            obs = obs.copy()
            obs[rows] = self.reset_rows(self.env, rows)
        return obs, rewards, terminated, truncated, info


class SyncVector(gym.vector.SyncVectorEnv):
    """gymnasium's SyncVectorEnv that also keeps the valid actions of envs that give them in
    info["action_mask"] (a Discrete env's mask of its actions, the convention of gymnasium's toy
    text envs), the same way a PettingZoo vector keeps its agents' (envs/multiagent.py):
    `masked`, and `action_mask` for the current observations. SAME_STEP autoreset puts a reset
    env's new mask in the step's info."""

    masked = False
    action_mask: np.ndarray | None = None
    # per row, besides its envs (hpcrl/envs/per_env.py); the rest is config or a step's scratch
    ROW_STATE = ("_autoreset_envs", "action_mask")

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self._take_mask(info)
        return obs, info

    def step(self, actions):
        result = super().step(actions)
        self._take_mask(result[4])
        return result

    def _take_mask(self, info: dict) -> None:
        if "action_mask" in info:
            self.masked = True
            self.action_mask = np.asarray(info["action_mask"], dtype=np.uint8)


class LiftEpisodeInfo(gym.vector.VectorWrapper):
    """SyncVectorEnv (SAME_STEP) files a finished env's step info under info["final_info"] and puts
    its reset info at the top level; bring the episode keys of the step back to the top level."""

    ROW_STATE = ()  # (stateless: hpcrl/envs/per_env.py)

    def step(self, actions):
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        final, finished = info.get("final_info", {}), info.get("_final_info")
        for key, dtype in ((RAW_REWARD, np.float64), (GAME_OVER, np.bool_)):
            if key not in info and key not in final:
                continue
            value = np.zeros(self.num_envs, dtype=dtype)
            if key in info:
                value[info[f"_{key}"]] = info[key][info[f"_{key}"]]
            if key in final:
                rows = finished & final[f"_{key}"]
                value[rows] = final[key][rows]
            info[key] = value
        return obs, rewards, terminated, truncated, info


class ClipActions(gym.vector.VectorWrapper):
    """Continuous actions clipped to the action bounds before they reach the envs. The fragment keeps
    the policy's unclipped sample, whose log-probability the learner recomputes."""

    ROW_STATE = ()  # (its bounds are config: hpcrl/envs/per_env.py)

    def __init__(self, env: gym.vector.VectorEnv):
        super().__init__(env)
        space = env.single_action_space
        self.low, self.high, self.dtype = space.low, space.high, space.dtype

    def step(self, actions):
        return self.env.step(np.clip(actions, self.low, self.high).astype(self.dtype, copy=False))


class DiscountedReturns(gym.vector.VectorWrapper):
    """env.normalize_reward, actor side: the discounted return of every env (gamma = algo.gamma)
    and the moments (count, mean, M2) of the returns seen since the last `take_moments()`, which
    ride with each fragment to the trainers; they scale the rewards (core.moments.ReturnScaler)
    with statistics merged over every env rank. Rewards pass through unchanged."""

    # per row: the returns (hpcrl/envs/per_env.py). The moments ride with the record that ends where
    # the state is split, which a resumed run does not send again, so they are not carried
    ROW_STATE = ("returns",)

    def __init__(self, env: gym.vector.VectorEnv, gamma: float):
        super().__init__(env)
        self.gamma = gamma
        self.returns = np.zeros(env.num_envs, dtype=np.float64)
        self.mean, self.var, self.count = 0.0, 0.0, 0

    def take_moments(self) -> np.ndarray:
        """(count, mean, M2) since the last call, and start again."""
        out = np.array([self.count, self.mean, self.var * self.count], dtype=np.float64)
        self.mean, self.var, self.count = 0.0, 0.0, 0
        return out

    def step(self, actions):
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        self.returns = self.returns * self.gamma + rewards
        x = self.returns
        self.mean, self.var, self.count = merge_moments(self.mean, self.var, self.count, float(x.mean()),
                                                        float(x.var()) * len(x), len(x))
        self.returns[terminated | truncated] = 0.0
        return obs, rewards, terminated, truncated, info


# --- backends ------------------------------------------------------------------------------------

def _reset_cartpole_rows(envs, rows: np.ndarray) -> np.ndarray:
    # CartPoleVectorEnv resets only as a whole, or as a side effect of the next step: reset the rows'
    # state as its own reset() does, and clear its pending next-step reset.
    u = envs.unwrapped
    u.state[:, rows] = u.np_random.uniform(low=u.low, high=u.high, size=(4, len(rows)))
    u.steps[rows] = 0
    u.prev_done[rows] = False
    return u.state[:, rows].T.astype(np.float32)


def _row_resetter(envs):
    """Per-env resets for gymnasium's numpy vector envs that autoreset on the next step."""
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
    return _reset_cartpole_rows if isinstance(envs.unwrapped, CartPoleVectorEnv) else None


def numpy_vector(target, env_id: str, kwargs: dict, num_envs: int) -> gym.vector.VectorEnv:
    """gymnasium's own numpy-vectorised implementation (its vector entry point) of `target`, a
    registered id or an EnvSpec (env.id resolved)."""
    try:
        spec = target if isinstance(target, gym.envs.registration.EnvSpec) else gym.spec(target)
    except gym.error.Error as exc:
        raise ConfigError(f"env.id: cannot make environment {env_id!r}: {exc}") from None
    if spec.vector_entry_point is None:
        have = sorted(k for k, s in gym.registry.items() if isinstance(s.vector_entry_point, str)
                      and "jax" not in s.vector_entry_point.lower())
        raise ConfigError(f"env.backend: 'numpy' needs an env with a numpy-vectorised implementation; "
                          f"{env_id!r} has none (gymnasium has one for {', '.join(have)}); use backend: sync")
    try:
        envs = gym.make_vec(spec, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
    except TypeError as exc:
        raise ConfigError(f"env.kwargs: the vectorised {env_id!r} rejected {kwargs}: {exc}") from None
    except (gym.error.Error, ImportError) as exc:
        raise ConfigError(f"env.backend: cannot make the vectorised {env_id!r}: {exc}") from None
    if envs.metadata.get("autoreset_mode") == AutoresetMode.SAME_STEP:
        return envs
    reset_rows = _row_resetter(envs)
    if reset_rows is None:
        envs.close()
        raise ConfigError(f"env.backend: the numpy-vectorised {env_id!r} ({type(envs.unwrapped).__name__}) "
                          f"resets finished envs on the next step, and hpcrl cannot reset them one by one; "
                          f"use backend: sync")
    return SameStepAutoreset(envs, reset_rows)


def _import_envpool():
    try:
        import envpool
    except ImportError as exc:
        raise ConfigError(f"env.backend: 'envpool' needs the envpool package ({exc}); "
                          f"install it with: pip install hpcrl[envpool]") from None
    return envpool


class EnvpoolVector(gym.vector.VectorWrapper):
    """An envpool pool as a NEXT_STEP gymnasium vector with observations in env order; for Atari it
    also reports envpool's raw game reward and real game-over flag under the contract's keys."""

    def __init__(self, pool, atari: bool):
        super().__init__(pool)
        self.atari = atari

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        return obs[np.argsort(info["env_id"])], info

    def step(self, actions):
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        order = info["env_id"]
        if self.atari:
            info[RAW_REWARD] = np.asarray(info["reward"], dtype=np.float64)
            info[GAME_OVER] = info["terminated"].astype(bool) | truncated
        if not np.array_equal(order, np.arange(self.num_envs)):  # async pools answer out of order
            inverse = np.argsort(order)
            obs, rewards, terminated, truncated = obs[inverse], rewards[inverse], terminated[inverse], truncated[inverse]
            info = {k: v[inverse] if isinstance(v, np.ndarray) and len(v) == self.num_envs else v
                    for k, v in info.items()}
        return obs, rewards, terminated, truncated, info


def _reset_envpool_rows(envs, rows: np.ndarray) -> np.ndarray:
    # envpool resets a subset of its envs by id (rows is sorted; the answer may not be)
    obs, info = envs.env.reset(env_id=rows.astype(np.int32))
    return obs[np.argsort(info["env_id"])]


def envpool_vector(env_id: str, kwargs: dict, num_envs: int, seed: int, atari_kwargs: dict | None) -> gym.vector.VectorEnv:
    """envpool's pool of `num_envs` (ALE/ ids map to envpool's Atari task names)."""
    envpool = _import_envpool()
    task = env_id.removeprefix("ALE/")
    if task not in envpool.list_all_envs():
        close = difflib.get_close_matches(task, envpool.list_all_envs(), n=3)
        raise ConfigError(f"env.id: envpool has no task {task!r}" + (f" (close: {', '.join(close)})" if close else "")
                          + "; use backend: sync for gymnasium ids")
    try:
        pool = envpool.make(task, env_type="gymnasium", num_envs=num_envs, seed=seed,
                            **(atari_kwargs or {}), **kwargs)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"env.kwargs: envpool's {task!r} rejected {kwargs}: {exc}") from None
    return SameStepAutoreset(EnvpoolVector(pool, atari=atari_kwargs is not None), _reset_envpool_rows)
