"""Gymnasium environments: the vector an env rank steps, and the spaces every role sizes buffers by.

No MPI and no torch here: env ranks that use remote inference import only this and numpy.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from hpcrl.config import ConfigError, EnvConfig


@dataclass(frozen=True)
class EnvSpaces:
    """What buffers and networks need to know about an env, small enough to broadcast at start."""

    obs_shape: tuple          # e.g. (4,) or (4, 84, 84) for stacked Atari frames
    obs_dtype: str            # 'float32', 'float64' or 'uint8'
    num_actions: int          # Discrete: n; continuous (Box actions): 0
    action_shape: tuple = ()  # Discrete: (); Box: (d,)
    action_dtype: str = "int64"   # Discrete: 'int64'; Box: 'float32'
    action_low: tuple = ()    # Box only: per-dimension bounds (floats), for clipping on env ranks
    action_high: tuple = ()

    @property
    def continuous(self) -> bool:
        return self.num_actions == 0


def _make(cfg: EnvConfig) -> gym.Env:
    try:
        return gym.make(cfg.id, **cfg.kwargs)
    except gym.error.Error as exc:
        raise ConfigError(f"env.id: cannot make environment {cfg.id!r}: {exc}") from None
    except (ImportError, ModuleNotFoundError) as exc:
        raise ConfigError(f"env.id: cannot import the module for {cfg.id!r}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"env.kwargs: {cfg.id!r} rejected the keyword arguments {cfg.kwargs}: {exc}") from None


def probe_spaces(cfg: EnvConfig) -> EnvSpaces:
    """Make one env to read its spaces; a ConfigError if the env or its spaces are unsupported."""
    env = _make(cfg)
    try:
        obs, act = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(obs, gym.spaces.Box):
        raise ConfigError(f"env.id: {cfg.id!r} has observation space {obs}; hpcrl supports Box observations")
    if not isinstance(act, gym.spaces.Discrete):
        raise ConfigError(f"env.id: {cfg.id!r} has action space {act}; hpcrl supports Discrete actions so far")
    return EnvSpaces(obs_shape=tuple(obs.shape), obs_dtype=np.dtype(obs.dtype).name, num_actions=int(act.n))


def make_vector_env(cfg: EnvConfig, seed: int, num_envs: int | None = None) -> tuple[gym.vector.VectorEnv, np.ndarray]:
    """`num_envs` copies (default: the config's) stepped in this process; env i is seeded seed + i. SAME_STEP autoreset: a finished env returns its
    reset observation at once and its final observation in info (needed to bootstrap truncation).
    Returns the vector and its first observations."""
    # partial, not a lambda: the vector stays picklable, so serial-mode checkpoints can hold it
    envs = gym.vector.SyncVectorEnv([functools.partial(_make, cfg) for _ in range(num_envs or cfg.num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs, _ = envs.reset(seed=seed)
    return envs, obs
