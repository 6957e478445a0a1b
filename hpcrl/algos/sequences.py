"""DQN's targets and priorities: n-step transitions' and R2D2's sequences' (Kapturowski et al. 2019),
in one place for the actors that compute initial priorities (workers/transition_writer.py,
workers/sequence_writer.py: numpy, no torch) and the trainer step that learns from them
(algos/dqn.py, which hands a sequence's bootstrap values over as numpy).

A stored sequence is L steps of one env: observations 0..L (L+1 of them, the last for the
bootstrap), actions, rewards, and per step whether the episode ended there by termination or by a
time limit (then the value of its final observation, `final_values`, taken by the actors' policy
from the state that episode ended in). Episodes may begin and end inside a sequence: the
recurrent state is zeroed where one begins, and no return runs past an episode's end.

Steps `start`..L-1 are trained (the steps before are burn-in: they only warm the recurrent state
up). Step t's target is the n-step double-Q return within the sequence,
    y_t = r_t + g r_t+1 + ... + g^(k-1) r_t+k-1 + g^k v_t+k,   k = min(n, L - t),
cut short at an episode's end: no bootstrap after a terminal step, the final observation's value
after a time limit. With value rescaling (R2D2's h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x) the
network learns h(y), and its values are mapped back with h^-1 before they are discounted.
"""
from __future__ import annotations

import numpy as np

RESCALE_EPS = 1e-3  # R2D2's epsilon in h(x)


def _sign(x):
    return x.sign() if hasattr(x, "sign") else np.sign(x)  # a torch tensor's own, or numpy's


def rescale(x):
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x, of a numpy array or a torch tensor (the DQN step's
    targets are tensors on the learner's device; this module never imports torch)."""
    return _sign(x) * ((abs(x) + 1.0) ** 0.5 - 1.0) + RESCALE_EPS * x


def unrescale(y):
    """h^-1(y), the closed form (Pohlen et al. 2018, proposition A.2); numpy or torch."""
    e = RESCALE_EPS
    return _sign(y) * ((((1.0 + 4.0 * e * (abs(y) + 1.0 + e)) ** 0.5 - 1.0) / (2.0 * e)) ** 2 - 1.0)


def n_step_target(returns, discounts, bootstrap, value_rescale: bool):
    """An n-step transition's target G + discount v' (numpy or torch), in the network's units:
    with value rescaling, h(G + discount h^-1(v'))."""
    if not value_rescale:
        return returns + discounts * bootstrap
    return rescale(returns + discounts * unrescale(bootstrap))


def sequence_targets(rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, final_values: np.ndarray,
                     bootstrap: np.ndarray, gamma: float, n: int, start: int, value_rescale: bool) -> np.ndarray:
    """Targets [L - start, B] of steps start..L-1 of B sequences (see the module's docstring).
    `rewards`, `terminated`, `truncated`, `final_values`: [L, B]; `bootstrap`: [L + 1 - start, B],
    the value of each step's observation from `start` to L (max_a Q for the actors, the target
    network's value of the online network's choice for the learner), in the network's units."""
    L = rewards.shape[0]
    value = unrescale if value_rescale else (lambda v: v)
    boot = value(np.asarray(bootstrap, dtype=np.float64))
    finals = value(np.asarray(final_values, dtype=np.float64))
    steps = np.arange(start, L)
    shape = (len(steps), rewards.shape[1])
    y, ret = np.zeros(shape), np.zeros(shape)
    alive = np.ones(shape, dtype=bool)  # the return runs on
    discount = 1.0
    for j in range(n):
        s = steps + j
        past = (s >= L)[:, None] & alive  # the sequence ends first: bootstrap from observation L
        y[past] = (ret + discount * boot[L - start])[past]
        alive &= ~past
        s = np.minimum(s, L - 1)
        ret += np.where(alive, discount * rewards[s], 0.0)
        discount *= gamma
        ended = alive & terminated[s].astype(bool)
        y[ended] = ret[ended]
        alive &= ~ended
        cut = alive & truncated[s].astype(bool)
        y[cut] = (ret + discount * finals[s])[cut]
        alive &= ~cut
    last = np.minimum(steps + n, L) - start  # n steps taken: bootstrap from observation t + n
    y[alive] = (ret + discount * boot[last])[alive]
    return (rescale(y) if value_rescale else y).astype(np.float32)


def sequence_priorities(abs_td: np.ndarray, eta: float) -> np.ndarray:
    """A sequence's priority from its trained steps' |TD errors| [T, B]: eta max + (1 - eta) mean
    (R2D2's eta = 0.9: a mean alone would let long sequences hide their few large errors)."""
    return (eta * abs_td.max(0) + (1.0 - eta) * abs_td.mean(0)).astype(np.float32)
