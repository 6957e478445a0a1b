"""GAE, V-trace and the sum-tree through the C extension (src_ext/kernels.c) when it is built,
else numpy.

`HPCRL_KERNELS=numpy` forces the numpy reference (the tests compare the two). The numpy code in
gae.py, vtrace.py and sumtree.py is the specification; the C loops are the same recursions.
"""
from __future__ import annotations

import os

import numpy as np

from hpcrl.algos import gae as gae_numpy
from hpcrl.algos import sumtree as sumtree_numpy
from hpcrl.algos import vtrace as vtrace_numpy

try:
    from hpcrl import _kernels
except ImportError:  # no compiler at install time: numpy only
    _kernels = None


def backend() -> str:
    """'c' or 'numpy': which implementation gae(), vtrace() and the sum-tree functions use now."""
    return "c" if _kernels is not None and os.environ.get("HPCRL_KERNELS", "c") != "numpy" else "numpy"


def c_module():
    """The C extension module if backend() is 'c', else None: for callers that choose once (a
    PrioritizedReplay at construction) and then call its kernels directly, without a look at
    os.environ per call."""
    return _kernels if backend() == "c" else None


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


def sumtree_update(tree: np.ndarray, indices: np.ndarray, priorities: np.ndarray) -> None:
    """Set leaves `indices` to `priorities` and recompute their sums, in place (see sumtree.update)."""
    if backend() == "numpy":
        return sumtree_numpy.update(tree, indices, priorities)
    L = sumtree_numpy.leaf_count(tree)  # in place, so no silent conversion of the tree
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    priorities = np.ascontiguousarray(priorities, dtype=np.float64)
    if indices.ndim != 1 or priorities.shape != indices.shape:
        raise ValueError(f"indices and priorities must be 1-D of one length, got shapes "
                         f"{indices.shape} and {priorities.shape}")
    _kernels.sumtree_update(tree, indices, priorities, L)


def sumtree_sample(tree: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The leaf index (int64[B]) of each prefix sum in `values` (see sumtree.sample)."""
    if backend() == "numpy":
        return sumtree_numpy.sample(tree, values)
    L = sumtree_numpy.leaf_count(tree)
    values = np.ascontiguousarray(values, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {values.shape}")
    out = np.empty(values.shape[0], dtype=np.int64)
    _kernels.sumtree_sample(tree, values, out, L)
    return out
