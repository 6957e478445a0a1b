"""V-trace off-policy targets (Espeholt et al. 2018, IMPALA) over [T, N] fragments.

The numpy reference; `hpcrl.algos.kernels` runs the same recursion in C when the extension is
built. Episode ends are handled as in GAE (`gae.successor_values`): `next_values[t]` is V(s_{t+1})
as seen from step t (0 after termination, V(final obs) after truncation), and `dones` cut the
recursion. With rho = c = 1 and lam = 1 the targets are the n-step returns.
"""
from __future__ import annotations

import numpy as np


def vtrace(log_rhos: np.ndarray, rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray,
           dones: np.ndarray, gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0,
           lam: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Value targets vs [T, N] and policy-gradient advantages [T, N].

    log_rhos = log pi(a|s) - log mu(a|s) (target minus behaviour policy).
    vs_t - V_t = delta_t + gamma * c_t * (1 - done_t) * (vs_{t+1} - V_{t+1}),
    delta_t = rho_t * (r_t + gamma * V(s_{t+1}) - V_t), rho_t = min(rho_bar, e^log_rho),
    c_t = lam * min(c_bar, e^log_rho); pg advantage = rho_t * (r_t + gamma * vs'_{t+1} - V_t),
    where vs'_{t+1} is vs_{t+1} inside an episode and next_values[t] at its end or the fragment's.
    """
    ratios = np.exp(log_rhos.astype(np.float64))
    rhos = np.minimum(rho_bar, ratios)
    cs = lam * np.minimum(c_bar, ratios)
    not_done = 1.0 - dones.astype(np.float64)
    deltas = rhos * (rewards + gamma * next_values - values)
    T = rewards.shape[0]
    vs_minus_v = np.zeros(rewards.shape, dtype=np.float64)
    carry = np.zeros(rewards.shape[1:], dtype=np.float64)
    for t in range(T - 1, -1, -1):
        carry = deltas[t] + gamma * cs[t] * not_done[t] * carry
        vs_minus_v[t] = carry
    vs = values + vs_minus_v
    vs_next = np.empty_like(vs)
    vs_next[:-1] = vs[1:]
    vs_next[-1] = next_values[-1]
    vs_next = np.where(not_done > 0, vs_next, next_values)
    pg_adv = rhos * (rewards + gamma * vs_next - values)
    return vs.astype(np.float32), pg_adv.astype(np.float32)
