"""GAE and V-trace through the C extension (src_ext/kernels.c) when it is built, else numpy.

`HPCRL_KERNELS=numpy` forces the numpy reference (the tests compare the two). The numpy code in
gae.py and vtrace.py is the specification; the C loops are the same recursions.
"""
from __future__ import annotations

import os

import numpy as np

from hpcrl.algos import gae as gae_numpy
from hpcrl.algos import vtrace as vtrace_numpy

try:
    from hpcrl import _kernels
except ImportError:  # no compiler at install time: numpy only
    _kernels = None


def backend() -> str:
    """'c' or 'numpy': which implementation gae() and vtrace() use now."""
    return "c" if _kernels is not None and os.environ.get("HPCRL_KERNELS", "c") != "numpy" else "numpy"


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def gae(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray, dones: np.ndarray,
        gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and value targets, [T, N] (see gae.gae)."""
    if backend() == "numpy":
        return gae_numpy.gae(rewards, values, next_values, dones, gamma, lam)
    T, N = rewards.shape
    values = _f32(values)
    adv = np.empty((T, N), dtype=np.float32)
    _kernels.gae(_f32(rewards), values, _f32(next_values), np.ascontiguousarray(dones, dtype=np.uint8), adv,
                 T, N, float(gamma), float(lam))
    return adv, adv + values


def vtrace(log_rhos: np.ndarray, rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray,
           dones: np.ndarray, gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0,
           lam: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """V-trace targets and policy-gradient advantages, [T, N] (see vtrace.vtrace)."""
    if backend() == "numpy":
        return vtrace_numpy.vtrace(log_rhos, rewards, values, next_values, dones, gamma, rho_bar, c_bar, lam)
    T, N = rewards.shape
    vs = np.empty((T, N), dtype=np.float32)
    pg = np.empty((T, N), dtype=np.float32)
    _kernels.vtrace(_f32(log_rhos), _f32(rewards), _f32(values), _f32(next_values),
                    np.ascontiguousarray(dones, dtype=np.uint8), vs, pg, T, N, float(gamma), float(rho_bar),
                    float(c_bar), float(lam))
    return vs, pg
