"""GAE against hand-computed cases, including termination and truncation."""
import numpy as np
import pytest

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


def test_own_steps_match_gae_over_each_agents_own_turns():
    """A turn-based column (its agent acts at steps 0, 2, 4 of 7): the rewards of the steps it sits
    out go to its previous own step, an end while it waits (step 3) ends that step's episode with
    step 3's trunc value, and its last own step bootstraps from last_values; the other column,
    always active, gets plain GAE."""
    from hpcrl.algos.gae import OwnSteps
    rng = np.random.default_rng(3)
    T, gamma, lam = 7, 0.9, 0.8
    rewards = rng.normal(size=(T, 2)).astype(np.float32)
    values = rng.normal(size=(T, 2)).astype(np.float32)
    trunc = rng.normal(size=(T, 2)).astype(np.float32)
    last = rng.normal(size=2).astype(np.float32)
    dones = np.zeros((T, 2), np.uint8)
    dones[3, 0] = 1
    dones[5, 1] = 1
    active = np.ones((T, 2), bool)
    active[[1, 3, 5, 6], 0] = False
    own = OwnSteps(active)
    adv_c, _ = gae(*own.compact(rewards, values, last, dones, trunc), gamma, lam)
    adv = own.scatter(adv_c, np.zeros((T, 2)))
    # column 0 by hand: own steps 0, 2, 4
    r = rewards[:, 0]
    mine = [(0, r[0] + r[1], values[2, 0], 0), (2, r[2] + r[3], trunc[3, 0], 1), (4, r[4] + r[5] + r[6], last[0], 1)]
    expected, carry = {}, 0.0
    for t, reward, successor, ended in reversed(mine):
        carry = reward + gamma * successor - values[t, 0] + gamma * lam * (1 - ended) * carry
        expected[t] = carry
    for t in (0, 2, 4):
        assert adv[t, 0] == pytest.approx(expected[t], abs=1e-5)
    assert all(adv[t, 0] == 0 for t in (1, 3, 5, 6))  # sat out: nothing to learn from there
    plain, _ = gae(rewards[:, 1:], values[:, 1:], successor_values(values[:, 1:], last[1:], dones[:, 1:],
                                                                   trunc[:, 1:]), dones[:, 1:], gamma, lam)
    np.testing.assert_allclose(adv[:, 1], plain[:, 0], atol=1e-6)
