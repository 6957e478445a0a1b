"""GAE against hand-computed cases, including termination and truncation."""
import numpy as np

from hpcrl.algos.gae import gae, successor_values

R = np.ones((3, 1), dtype=np.float32)
V = np.array([[0.5], [0.4], [0.3]], dtype=np.float32)
LAST = np.array([0.2], dtype=np.float32)


def advantages(dones, trunc_values):
    dones = np.array(dones, dtype=np.uint8).reshape(3, 1)
    trunc = np.array(trunc_values, dtype=np.float32).reshape(3, 1)
    nxt = successor_values(V, LAST, dones, trunc)
    adv, ret = gae(R, V, nxt, dones, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(ret, adv + V, rtol=1e-6)
    return adv[:, 0]


def test_no_episode_end():
    # deltas: 1 + .9*.4 - .5 = .86, 1 + .9*.3 - .4 = .87, 1 + .9*.2 - .3 = .88; gamma*lam = .72
    np.testing.assert_allclose(advantages([0, 0, 0], [0, 0, 0]), [0.86 + 0.72 * (0.87 + 0.72 * 0.88),
                                                                    0.87 + 0.72 * 0.88, 0.88], rtol=1e-6)


def test_termination_cuts_and_zeroes_the_future():
    # t=1 terminated: delta_1 = 1 - .4 = .6, no carry from t=2
    np.testing.assert_allclose(advantages([0, 1, 0], [0, 0, 0]), [0.86 + 0.72 * 0.6, 0.6, 0.88], rtol=1e-6)


def test_truncation_bootstraps_from_the_final_observation():
    # t=1 truncated with V(final obs) = .7: delta_1 = 1 + .9*.7 - .4 = 1.23, no carry from t=2
    np.testing.assert_allclose(advantages([0, 1, 0], [0, 0.7, 0]), [0.86 + 0.72 * 1.23, 1.23, 0.88], rtol=1e-6)


def test_lambda_one_gives_discounted_returns_minus_values():
    rng = np.random.default_rng(1)
    r = rng.normal(size=(6, 2)).astype(np.float32)
    v = rng.normal(size=(6, 2)).astype(np.float32)
    last = rng.normal(size=2).astype(np.float32)
    dones = np.zeros((6, 2), dtype=np.uint8)
    adv, ret = gae(r, v, successor_values(v, last, dones, np.zeros_like(v)), dones, gamma=0.95, lam=1.0)
    expected = np.array([sum(0.95 ** k * r[t + k] for k in range(6 - t)) + 0.95 ** (6 - t) * last
                         for t in range(6)])
    np.testing.assert_allclose(ret, expected, rtol=1e-5)
