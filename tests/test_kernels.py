"""V-trace against hand-computed and on-policy cases; the C kernels against the numpy reference."""
import subprocess
import sys

import numpy as np
import pytest

from hpcrl.algos import gae as gae_numpy
from hpcrl.algos import kernels
from hpcrl.algos import vtrace as vtrace_numpy
from hpcrl.algos.gae import successor_values


def test_the_c_extension_is_built_and_selected():
    assert kernels.backend() == "c"  # the set-up builds it; a silent fallback would hide a broken build
    code = "from hpcrl.algos import kernels; print(kernels.backend())"
    forced = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={"HPCRL_KERNELS": "numpy", "PATH": ""})
    assert forced.stdout.strip() == "numpy"


def test_vtrace_hand_computed():
    # T=2, one env, gamma 0.9, rho_bar = c_bar = 1, lam = 1
    log_rhos = np.log(np.array([[2.0], [0.5]], dtype=np.float32))  # rho = c = (1, 0.5)
    r = np.array([[1.0], [2.0]], dtype=np.float32)
    v = np.array([[0.5], [1.0]], dtype=np.float32)
    nxt = np.array([[1.0], [3.0]], dtype=np.float32)  # V(s1) = 1, bootstrap V(s2) = 3
    d = np.zeros((2, 1), dtype=np.uint8)
    vs, pg = vtrace_numpy.vtrace(log_rhos, r, v, nxt, d, gamma=0.9)
    delta1 = 0.5 * (2 + 0.9 * 3 - 1)  # 1.85
    delta0 = 1.0 * (1 + 0.9 * 1 - 0.5)  # 1.4
    vs1 = 1 + delta1  # 2.85
    vs0 = 0.5 + delta0 + 0.9 * 1.0 * delta1  # c_0 = 1
    np.testing.assert_allclose(vs[:, 0], [vs0, vs1], rtol=1e-6)
    np.testing.assert_allclose(pg[:, 0], [1.0 * (1 + 0.9 * vs1 - 0.5), 0.5 * (2 + 0.9 * 3 - 1)], rtol=1e-6)


def random_fragment(T=64, N=33, seed=0):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(T, N)).astype(np.float32)
    v = rng.normal(size=(T, N)).astype(np.float32)
    last = rng.normal(size=N).astype(np.float32)
    dones = (rng.random((T, N)) < 0.08).astype(np.uint8)
    truncated = dones & (rng.random((T, N)) < 0.5)  # half the ends are time limits: bootstrap values
    trunc_values = np.where(truncated, rng.normal(size=(T, N)), 0.0).astype(np.float32)
    nxt = successor_values(v, last, dones, trunc_values)
    log_rhos = rng.normal(scale=0.7, size=(T, N)).astype(np.float32)
    return log_rhos, r, v, nxt, dones


def test_vtrace_on_policy_limit_is_the_n_step_return():
    _, r, v, nxt, dones = random_fragment(T=20, N=5, seed=3)
    vs, pg = kernels.vtrace(np.zeros_like(r), r, v, nxt, dones, gamma=0.97)
    T = r.shape[0]
    for n in range(r.shape[1]):
        for t in range(T):  # discounted rewards to the episode's (or fragment's) end, then its bootstrap
            ret, k = 0.0, t
            while True:
                ret += 0.97 ** (k - t) * r[k, n]
                if dones[k, n] or k == T - 1:
                    ret += 0.97 ** (k - t + 1) * nxt[k, n]
                    break
                k += 1
            assert vs[t, n] == pytest.approx(ret, rel=1e-4, abs=1e-4)
    adv, _ = kernels.gae(r, v, nxt, dones, gamma=0.97, lam=1.0)
    np.testing.assert_allclose(vs - v, adv, rtol=1e-4, atol=1e-4)  # and equals GAE with lambda = 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_c_and_numpy_agree_on_random_fragments(seed, monkeypatch):
    log_rhos, r, v, nxt, dones = random_fragment(seed=seed)
    c_adv, c_ret = kernels.gae(r, v, nxt, dones, 0.99, 0.95)
    c_vs, c_pg = kernels.vtrace(log_rhos, r, v, nxt, dones, 0.99, rho_bar=1.0, c_bar=0.9, lam=0.95)
    monkeypatch.setenv("HPCRL_KERNELS", "numpy")
    assert kernels.backend() == "numpy"
    n_adv, n_ret = kernels.gae(r, v, nxt, dones, 0.99, 0.95)
    n_vs, n_pg = kernels.vtrace(log_rhos, r, v, nxt, dones, 0.99, rho_bar=1.0, c_bar=0.9, lam=0.95)
    np.testing.assert_allclose(c_adv, n_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c_ret, n_ret, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c_vs, n_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c_pg, n_pg, rtol=1e-5, atol=1e-5)
    ref_adv, _ = gae_numpy.gae(r, v, nxt, dones, 0.99, 0.95)
    np.testing.assert_array_equal(n_adv, ref_adv)


def test_kernels_reject_wrong_shapes():
    _, r, v, nxt, dones = random_fragment(T=8, N=4)
    with pytest.raises(ValueError, match="values: expected 128 bytes"):
        kernels._kernels.gae(r, v[:4], nxt, dones, np.empty_like(r), 8, 4, 0.9, 0.9)
