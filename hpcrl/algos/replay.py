"""One shard of proportional prioritized replay (Schaul et al. 2016), as Ape-X DQN's replay
workers hold it. Pure numpy: no torch, no MPI; the sum-tree runs through hpcrl.algos.kernels (C
when the extension is built).

Two priority spaces. A *raw* priority p is what callers give: |TD error| (or any finite value
>= 0). The sum-tree holds (p + eps) ** alpha per held row, and row i is drawn with probability
P(i) = (p_i + eps) ** alpha / sum_j (p_j + eps) ** alpha; eps keeps rows whose TD error reached 0
drawable, alpha = 0 is uniform replay. Rows added without priorities get the largest raw priority
seen so far (1.0 before any), as in Schaul et al.'s Algorithm 1, so every new row is seen soon.

The numpy code in add(), sample() and update_priorities() is the specification. With the C
extension built, each of the three hands its priority work (checks, powers, raw-priority writes,
the dedupe of repeated rows, the tree, the max, the importance weights) to one kernel in
src_ext/kernels.c instead: a call of a 64-row batch is a few microseconds of arithmetic, so the
numpy overhead of a dozen small array operations would cost more than the tree itself. The C path
gives the same trees bit for bit, the same raw priorities, max priority and indices, weights equal
within float32 rounding, and the same ValueErrors (tests/test_replay.py).
"""
from __future__ import annotations

import numpy as np

from hpcrl.algos import kernels
from hpcrl.algos import sumtree

Fields = dict[str, tuple[np.dtype, tuple[int, ...]]]
_COUNTERS = ("capacity", "alpha", "eps", "size", "inserted", "sampled", "max_priority")


def _first_bad(name: str, values: np.ndarray, ok: np.ndarray, valid: str) -> None:
    """ValueError naming the first element of `values` where `ok` is False, if there is one."""
    if not ok.all():
        j = int(np.argmax(~ok))
        raise ValueError(f"{name}[{j}] = {values[j]} is not valid ({valid})")


class PrioritizedReplay:
    """A ring buffer of `capacity` rows, one preallocated array of shape (capacity, *shape) per
    field, with a sum-tree over the rows' priorities; the oldest rows are overwritten first.

    Attributes: `size` rows held (always rows 0 to size - 1), `inserted` rows ever added (for the
    replay ratio sampled / inserted), `sampled` rows ever drawn, `max_priority` the largest raw
    priority seen so far (1.0 before any; it never decreases), `storage` the field arrays.
    """

    def __init__(self, capacity: int, fields: Fields, alpha: float = 0.6, eps: float = 1e-6):
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"replay capacity must be an integer >= 1, got {capacity!r}")
        if not (np.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"replay alpha must be finite and >= 0 (0 is uniform, 0.6 Schaul's), got {alpha}")
        if not (np.isfinite(eps) and eps >= 0):
            raise ValueError(f"replay eps must be finite and >= 0 (it keeps zero-TD rows drawable), got {eps}")
        if not fields:
            raise ValueError("a replay needs at least one field, e.g. {'obs': (np.float32, (4,))}")
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.fields = {name: (np.dtype(dtype), tuple(int(n) for n in shape)) for name, (dtype, shape) in fields.items()}
        self.storage = {name: np.zeros((self.capacity, *shape), dtype=dtype)
                        for name, (dtype, shape) in self.fields.items()}
        self.raw_priorities = np.zeros(self.capacity, dtype=np.float64)
        self.tree = sumtree.empty(self.capacity)
        self._first_leaf = self.tree.shape[0] // 2  # tree index of row 0's leaf (= the leaf count L)
        # C kernels or None (numpy), chosen once: kernels.backend() reads os.environ, which costs
        # as much as a C kernel call; HPCRL_KERNELS applies to replays made after it is set
        self._c = kernels.c_module()
        self.size = 0
        self.inserted = 0
        self.sampled = 0
        self.max_priority = 1.0

    def _leaf_values(self, raw: np.ndarray) -> np.ndarray:
        return (raw + self.eps) ** self.alpha

    def _rows_of(self, data: dict[str, np.ndarray]) -> tuple[int, dict[str, np.ndarray]]:
        """The row count k of `data` and its arrays, after checking names, shapes and dtypes."""
        if set(data) != set(self.fields):
            missing, unexpected = sorted(set(self.fields) - set(data)), sorted(set(data) - set(self.fields))
            raise ValueError(f"replay rows need exactly the fields {sorted(self.fields)}: "
                             f"missing {missing}, unexpected {unexpected}")
        arrays, k = {}, None
        for name, (dtype, shape) in self.fields.items():
            a = np.asarray(data[name])
            if a.shape[1:] != shape or a.ndim != 1 + len(shape):
                raise ValueError(f"field {name!r}: expected rows of shape {shape}, i.e. an array (k, *{shape}), "
                                 f"got shape {a.shape}")
            if not np.can_cast(a.dtype, dtype, "same_kind"):
                raise ValueError(f"field {name!r}: {a.dtype} does not cast to the stored {dtype} without "
                                 f"changing kind (e.g. float to int); convert it first")
            if k is not None and a.shape[0] != k:
                raise ValueError(f"field {name!r} has {a.shape[0]} rows, the fields before it {k}")
            k = a.shape[0]
            arrays[name] = a
        return k, arrays

    def add(self, data: dict[str, np.ndarray], priorities: np.ndarray | None = None) -> None:
        """Add k rows (`data`: one array (k, *shape) per field) with raw `priorities` (float[k],
        finite, >= 0), or the max priority seen so far if None. k may run past the end of the
        ring (it wraps) or past the capacity (only the newest `capacity` rows are kept)."""
        k, arrays = self._rows_of(data)
        if priorities is None:
            raw = np.full(k, self.max_priority)
        else:
            raw = np.asarray(priorities, dtype=np.float64)
            if raw.shape != (k,):
                raise ValueError(f"priorities must have one value per row, shape ({k},), got {raw.shape}")
        if self._c is not None:  # the checks and priority writes below, in one C call
            self.max_priority = self._c.replay_add_priorities(
                self.tree, self.raw_priorities, np.ascontiguousarray(raw), self._first_leaf, self.capacity,
                self.inserted % self.capacity, self.alpha, self.eps, self.max_priority)
            if k:
                self._write_rows(arrays, k)
            return
        _first_bad("priorities", raw, np.isfinite(raw) & (raw >= 0), "valid: finite and >= 0")
        if k == 0:
            return
        if priorities is not None:
            self.max_priority = max(self.max_priority, float(raw.max()))
        keep = min(k, self.capacity)
        start = (self.inserted + k - keep) % self.capacity  # where the first kept row goes
        rows = (start + np.arange(keep)) % self.capacity
        raw = raw[k - keep:]
        self.raw_priorities[rows] = raw
        kernels.sumtree_update(self.tree, rows, self._leaf_values(raw))
        self._write_rows(arrays, k)

    def _write_rows(self, arrays: dict[str, np.ndarray], k: int) -> None:
        """Copy the newest min(k, capacity) of k checked rows into the ring and count them."""
        keep = min(k, self.capacity)
        start = (self.inserted + k - keep) % self.capacity  # where the first kept row goes
        before_wrap = min(keep, self.capacity - start)
        for name, store in self.storage.items():
            kept = arrays[name][k - keep:]
            store[start:start + before_wrap] = kept[:before_wrap]
            if keep > before_wrap:  # an empty slice assignment still costs a microsecond
                store[:keep - before_wrap] = kept[before_wrap:]
        self.size = min(self.size + k, self.capacity)
        self.inserted += k

    def sample(self, batch_size: int, beta: float,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Draw `batch_size` rows in proportion to their priorities, stratified: the total is cut
        into batch_size equal segments and one uniform draw from `rng` is taken in each.

        Returns (indices int64[B], importance weights float32[B], data), where the weights are
        (size * P(i)) ** -beta divided by the largest in the batch (so the largest is 1), and
        data holds each field's rows at the indices (copies). A row may be drawn more than once.
        """
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if not 0 <= beta <= 1:
            raise ValueError(f"beta must be in [0, 1] (0: no correction, 1: full correction), got {beta}")
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay: add rows first")
        total = self.tree[1]
        if not total > 0:
            raise ValueError(f"every one of the {self.size} held rows has priority 0 (eps = 0): nothing to sample")
        if self._c is not None:  # the prefix sums, the descent and the weights below, in one C call
            indices, weights = np.empty(batch_size, dtype=np.int64), np.empty(batch_size, dtype=np.float32)
            self._c.replay_sample(self.tree, rng.random(batch_size), indices, weights, self._first_leaf,
                                  self.size, float(beta))
        else:
            values = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
            indices = kernels.sumtree_sample(self.tree, values)
            probabilities = self.tree[self._first_leaf + indices] / total
            weights = (self.size * probabilities) ** -beta
            weights = (weights / weights.max()).astype(np.float32)
        data = {name: store[indices] for name, store in self.storage.items()}
        self.sampled += batch_size
        return indices, weights, data

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Set the raw priorities of held rows `indices` to |td_errors| (stored as
        (|td| + eps) ** alpha). Where an index repeats, the last one wins. A row overwritten since
        it was drawn gets the priority anyway (the learner's TD error is for its old content);
        callers that care compare `inserted` with what it was at the draw."""
        indices = np.asarray(indices)
        td = np.asarray(td_errors, dtype=np.float64)
        if indices.dtype.kind not in "iu":  # signed or unsigned integers
            raise ValueError(f"indices must be integers (as sample returns them), got {indices.dtype}")
        if indices.ndim != 1 or td.shape != indices.shape:
            raise ValueError(f"indices and td_errors must be 1-D of one length, got shapes {indices.shape} and {td.shape}")
        if self._c is not None:  # the checks, the dedupe and the priority writes below, in one C call
            self.max_priority = self._c.replay_update_priorities(
                self.tree, self.raw_priorities, np.ascontiguousarray(indices, dtype=np.int64),
                np.ascontiguousarray(td), self._first_leaf, self.capacity, self.size, self.alpha, self.eps,
                self.max_priority)
            return
        _first_bad("indices", indices, (indices >= 0) & (indices < self.size), f"valid: held rows 0 to {self.size - 1}")
        _first_bad("td_errors", td, np.isfinite(td), "valid: finite; a NaN or inf loss should stop the learner")
        if indices.shape[0] == 0:
            return
        winners = sumtree.last_occurrences(indices)
        rows, raw = indices[winners], np.abs(td[winners])
        self.raw_priorities[rows] = raw
        kernels.sumtree_update(self.tree, rows, self._leaf_values(raw))
        self.max_priority = max(self.max_priority, float(raw.max()))

    def mean_priority(self) -> float:
        """The mean raw priority (|TD| as last given, or the max priority a row was added with;
        before eps and alpha) over the `size` held rows; 0.0 when empty. O(size)."""
        return float(self.raw_priorities[:self.size].mean()) if self.size else 0.0

    def state(self) -> dict[str, np.ndarray]:
        """Everything a resume needs, as a flat dict of numpy arrays (an HDF5 group's datasets):
        the counters and settings as 0-d arrays, and 'raw_priorities', 'leaves' (the sum-tree's
        leaves) and 'data.<field>' for the held rows. The row arrays are read-only views of the
        live storage, not copies (a shard may be gigabytes): write them out before the next add
        or update_priorities."""
        state = {name: np.array(getattr(self, name)) for name in _COUNTERS}
        held = {"raw_priorities": self.raw_priorities,
                "leaves": self.tree[self._first_leaf:self._first_leaf + self.capacity],
                **{f"data.{name}": store for name, store in self.storage.items()}}
        for key, array in held.items():
            view = array[:self.size]
            view.flags.writeable = False
            state[key] = view
        return state

    def _restore_problems(self, state: dict) -> list[str]:
        """What keeps `state` from being restored here, as readable phrases (empty if nothing)."""
        wanted = set(_COUNTERS) | {"raw_priorities", "leaves"} | {f"data.{name}" for name in self.fields}
        if set(state) != wanted:
            return [f"keys missing {sorted(wanted - set(state))}, unexpected {sorted(set(state) - wanted)}"]
        problems = []
        for name in ("capacity", "alpha", "eps"):
            saved, here = state[name].item(), getattr(self, name)
            if saved != here:
                problems.append(f"{name}: saved {saved}, this replay {here}")
        size, inserted, capacity = int(state["size"]), int(state["inserted"]), int(state["capacity"])
        if size != min(inserted, capacity):
            problems.append(f"size {size} does not match {inserted} rows inserted into capacity {capacity}")
        for name, (dtype, shape) in self.fields.items():
            saved = state[f"data.{name}"]
            if saved.dtype != dtype or saved.shape[1:] != shape:
                problems.append(f"field {name!r}: saved rows {saved.dtype} {saved.shape[1:]}, this replay {dtype} {shape}")
        for key in ("raw_priorities", "leaves", *(f"data.{name}" for name in self.fields)):
            if state[key].shape[:1] != (size,):
                problems.append(f"{key}: {state[key].shape[:1]} rows saved for size {size}")
        for key in ("raw_priorities", "leaves"):
            values = state[key]
            if values.ndim != 1 or not (np.isfinite(values) & (values >= 0)).all():
                problems.append(f"{key}: not a 1-D array of finite priorities >= 0")
        return problems

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Take over a state() of a replay with the same capacity, alpha, eps and fields; a
        mismatch raises ValueError naming every difference, and changes nothing. The sum-tree
        is rebuilt from the saved leaves, which gives the same tree bit for bit (sumtree.py), so
        the same rng draws the same rows as the saved replay would have."""
        state = {key: np.asarray(value) for key, value in state.items()}
        problems = self._restore_problems(state)
        if problems:
            raise ValueError("cannot restore this replay state: " + "; ".join(problems))
        size = int(state["size"])
        # copies: the state may be this replay's own (views), and the zeroing below would reach it
        raw, leaves = np.array(state["raw_priorities"], dtype=np.float64), np.array(state["leaves"])
        for name, store in self.storage.items():
            store[:size] = state[f"data.{name}"]
        self.raw_priorities[:] = 0
        self.raw_priorities[:size] = raw
        self.tree[:] = 0
        kernels.sumtree_update(self.tree, np.arange(size), leaves)
        self.size, self.inserted, self.sampled = size, int(state["inserted"]), int(state["sampled"])
        self.max_priority = float(state["max_priority"])
