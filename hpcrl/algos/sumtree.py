"""A sum-tree over a power-of-two number of leaves: the numpy reference (the specification).

`hpcrl.algos.kernels` runs the same two operations in C when the extension is built; the tests
require bitwise-equal trees and equal sampled indices. Layout (the classic one): one float64 array
`tree` of length 2L, L a power of two; tree[1] is the root, node n has children 2n and 2n + 1, leaf
i (0-based, i < L) is tree[L + i], and tree[0] is unused. Every internal node is recomputed as
left + right (never adjusted by a difference), so the whole tree is a function of its leaves alone:
two trees with the same leaves are equal bit for bit, however they got there.

Both functions loop over the tree's depth and are vectorised over the batch, so the numpy version
is a fair baseline for the C one.
"""
from __future__ import annotations

import numpy as np


def leaves_for(capacity: int) -> int:
    """The leaf count of a tree that holds `capacity` priorities: the next power of two."""
    if capacity < 1:
        raise ValueError(f"a sum-tree needs a capacity >= 1, got {capacity}")
    return 1 << (capacity - 1).bit_length()


def empty(capacity: int) -> np.ndarray:
    """A tree of zeros with leaves_for(capacity) leaves (the leaves past `capacity` stay 0)."""
    return np.zeros(2 * leaves_for(capacity), dtype=np.float64)


def leaf_count(tree: np.ndarray) -> int:
    """L for a valid tree (1-D, C-contiguous float64 of length 2L, L a power of two), else ValueError."""
    if not (isinstance(tree, np.ndarray) and tree.dtype == np.float64 and tree.ndim == 1
            and tree.flags.c_contiguous):
        raise ValueError(f"a sum-tree is a 1-D C-contiguous float64 array, got "
                         f"{type(tree).__name__} {getattr(tree, 'dtype', '')} {getattr(tree, 'shape', '')}")
    n = tree.shape[0]
    L = n // 2
    if n % 2 or L < 1 or L & (L - 1):
        raise ValueError(f"a sum-tree has length 2L with L a power of two, got length {n}")
    return L


def last_occurrences(indices: np.ndarray) -> np.ndarray:
    """Positions in `indices` of the last occurrence of each distinct index (ascending by index):
    where an index repeats, the last one wins. numpy's fancy assignment does not promise an order
    for repeated indices, so the reference picks the winners itself."""
    _, first_in_reversed = np.unique(indices[::-1], return_index=True)
    return indices.shape[0] - 1 - first_in_reversed


def check_update(L: int, indices: np.ndarray, priorities: np.ndarray) -> None:
    """ValueError unless indices and priorities are 1-D of one length, indices in [0, L) and
    priorities finite and >= 0 (the C kernel checks the indices and priorities with the same
    messages, and rejects a call before it writes anything, as this does)."""
    if indices.ndim != 1 or priorities.shape != indices.shape:
        raise ValueError(f"indices and priorities must be 1-D of one length, got shapes "
                         f"{indices.shape} and {priorities.shape}")
    outside = (indices < 0) | (indices >= L)
    if outside.any():
        j = int(np.argmax(outside))
        raise ValueError(f"indices[{j}] = {indices[j]} is outside the tree's {L} leaves (valid: 0 to {L - 1})")
    bad = ~(np.isfinite(priorities) & (priorities >= 0))
    if bad.any():
        j = int(np.argmax(bad))
        raise ValueError(f"priorities[{j}] = {float(priorities[j])} is not a priority (valid: finite and >= 0)")


def update(tree: np.ndarray, indices: np.ndarray, priorities: np.ndarray) -> None:
    """Set leaves `indices` (int64[k]) to `priorities` (float64[k]) and recompute the sums on
    their paths to the root, in place. Where an index repeats, the last one wins."""
    L = leaf_count(tree)
    indices = np.asarray(indices, dtype=np.int64)
    priorities = np.asarray(priorities, dtype=np.float64)
    check_update(L, indices, priorities)
    if indices.shape[0] == 0:
        return
    winners = last_occurrences(indices)
    nodes = L + indices[winners]
    tree[nodes] = priorities[winners]
    # All leaves sit at one depth, so one level at a time, children before parents. A parent
    # reached from two children is assigned twice with the same (final) sum, which is harmless.
    while nodes[0] > 1:
        nodes = nodes // 2
        tree[nodes] = tree[2 * nodes] + tree[2 * nodes + 1]


def check_sample(tree: np.ndarray, values: np.ndarray) -> None:
    """ValueError unless the total is positive and finite and every value is finite and >= 0
    (the C kernel makes the same checks, in this order, with the same messages)."""
    total = tree[1]
    if not (np.isfinite(total) and total > 0):
        raise ValueError(f"the tree's total priority is {float(total)}: nothing to sample "
                         f"(sampling needs a positive, finite total)")
    if values.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {values.shape}")
    bad = ~(np.isfinite(values) & (values >= 0))
    if bad.any():
        j = int(np.argmax(bad))
        raise ValueError(f"values[{j}] = {float(values[j])} is not a prefix sum (valid: finite and >= 0)")


def sample(tree: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each v in `values` (float64[B], in [0, total)), the leaf i (int64, 0 <= i < L) whose
    prefix-sum interval holds v: from the root, go left if v < left sum, else subtract the left
    sum and go right.

    Round-off guard: go right only when the right sum is > 0. A v at or a hair above the total
    (float error in the caller or in the subtractions) then ends at the last leaf with non-zero
    priority instead of in the zero leaves past it, and no zero-priority leaf is ever returned:
    every node entered has a positive sum (left is entered either because v < left, so left > 0,
    or because right is 0, so left is the whole positive sum).
    """
    L = leaf_count(tree)
    v = np.array(values, dtype=np.float64)  # a copy: the descent subtracts from it
    check_sample(tree, v)
    nodes = np.ones(v.shape[0], dtype=np.int64)
    for _ in range(L.bit_length() - 1):
        left = tree[2 * nodes]
        go_right = (v >= left) & (tree[2 * nodes + 1] > 0)
        v -= np.where(go_right, left, 0.0)
        nodes = 2 * nodes + go_right
    return nodes - L
