"""DQN's exploration, in one place for the actors that explore (workers/replay_writer.py) and the
trainer step that reports it (algos/dqn.py). Pure numpy: actors import no torch."""
from __future__ import annotations

import numpy as np


def apex_epsilons(eps: float, alpha: float, total_envs: int) -> np.ndarray:
    """Ape-X's fixed exploration per env (Horgan et al. 2018): eps_i = eps ^ (1 + alpha i / (N - 1))."""
    i = np.arange(total_envs, dtype=np.float64)
    return eps ** (1.0 + alpha * i / max(total_envs - 1, 1))


def linear_epsilon(dqn, frames: float) -> float:
    """algo.dqn.eps_schedule linear: eps_start to eps_final over eps_decay_frames (all env ranks' frames)."""
    progress = min(1.0, frames / dqn.eps_decay_frames)
    return dqn.eps_start + (dqn.eps_final - dqn.eps_start) * progress
