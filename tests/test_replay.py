"""The sum-tree (C kernels against the numpy reference) and the prioritized-replay shard."""
import h5py
import numpy as np
import pytest

from hpcrl import _kernels
from hpcrl.algos import kernels
from hpcrl.algos import sumtree
from hpcrl.algos.replay import PrioritizedReplay

CAPACITIES = [1, 2, 3, 7, 64, 1000, 4097]  # powers of two and not (zero padding leaves past the capacity)


def c_update(tree, indices, priorities):
    _kernels.sumtree_update(tree, np.ascontiguousarray(indices, dtype=np.int64),
                            np.ascontiguousarray(priorities, dtype=np.float64), tree.shape[0] // 2)


def c_sample(tree, values):
    out = np.empty(len(values), dtype=np.int64)
    _kernels.sumtree_sample(tree, np.ascontiguousarray(values, dtype=np.float64), out, tree.shape[0] // 2)
    return out


def random_updates(rng, capacity, rounds=6):
    """(indices, priorities) batches with repeated indices, zeros and a spread of magnitudes."""
    for _ in range(rounds):
        k = int(rng.integers(1, 3 * capacity + 2))
        indices = rng.integers(0, capacity, size=k)
        priorities = rng.lognormal(sigma=3.0, size=k) * (rng.random(k) < 0.8)
        yield indices, priorities


def boundary_values(tree, rng, n=2000):
    total = tree[1]
    return np.concatenate([[0.0, np.nextafter(total, 0), total], rng.random(n) * total])


# --- the sum-tree -----------------------------------------------------------------------------

@pytest.mark.parametrize("capacity", CAPACITIES)
def test_c_and_numpy_sumtrees_are_bit_equal_and_sample_the_same_leaves(capacity):
    rng = np.random.default_rng(capacity)
    reference, c_tree = sumtree.empty(capacity), sumtree.empty(capacity)
    L = reference.shape[0] // 2
    for indices, priorities in random_updates(rng, capacity):
        sumtree.update(reference, indices, priorities)
        c_update(c_tree, indices, priorities)
        np.testing.assert_array_equal(c_tree, reference)
        internal = np.arange(1, L)
        np.testing.assert_array_equal(reference[internal], reference[2 * internal] + reference[2 * internal + 1])
        if reference[1] > 0:
            values = boundary_values(reference, rng)
            leaves = sumtree.sample(reference, values)
            np.testing.assert_array_equal(c_sample(c_tree, values), leaves)
            assert (reference[L + leaves] > 0).all()  # zero-priority leaves are never returned


def test_a_repeated_index_keeps_its_last_priority_in_both():
    for update in (sumtree.update, c_update):
        tree = sumtree.empty(4)
        update(tree, np.array([3, 1, 3, 3, 1]), np.array([1.0, 2.0, 5.0, 7.0, 4.0]))
        np.testing.assert_array_equal(tree[4:], [0.0, 4.0, 0.0, 7.0])
        assert tree[1] == 11.0


def test_sample_finds_the_leaf_whose_prefix_sum_interval_holds_the_value():
    # integer priorities: every sum is exact, so the descent must agree with a cumulative search
    rng = np.random.default_rng(1)
    priorities = rng.integers(0, 5, size=37).astype(np.float64)
    tree = sumtree.empty(37)
    sumtree.update(tree, np.arange(37), priorities)
    values = rng.random(5000) * priorities.sum()
    expected = np.searchsorted(np.cumsum(priorities), values, side="right")
    np.testing.assert_array_equal(sumtree.sample(tree, values), expected)
    np.testing.assert_array_equal(c_sample(tree, values), expected)
    exact = np.cumsum(priorities)[:-1]  # a value on a boundary belongs to the next non-zero leaf
    np.testing.assert_array_equal(sumtree.sample(tree, exact), np.searchsorted(np.cumsum(priorities), exact, "right"))


def test_round_off_at_the_total_ends_in_the_last_non_zero_leaf():
    # leaves 0.1, 0.2, 0.3 then zeros: v at or just below the float total must not reach a zero leaf
    tree = sumtree.empty(6)
    sumtree.update(tree, np.array([0, 1, 2]), np.array([0.1, 0.2, 0.3]))
    total = tree[1]
    values = np.array([np.nextafter(total, 0), total, total * (1 + 1e-15)])
    np.testing.assert_array_equal(sumtree.sample(tree, values), [2, 2, 2])
    np.testing.assert_array_equal(c_sample(tree, values), [2, 2, 2])
    zero_between = sumtree.empty(8)  # and a zero leaf between two positive ones is skipped
    sumtree.update(zero_between, np.array([0, 2]), np.array([1.0, 1.0]))
    np.testing.assert_array_equal(c_sample(zero_between, np.array([0.0, 0.999, 1.0, 1.999, 2.0])), [0, 0, 2, 2, 2])


@pytest.mark.parametrize("update, sample", [(sumtree.update, sumtree.sample), (c_update, c_sample)],
                         ids=["numpy", "c"])
def test_bad_arguments_raise_the_same_errors_and_change_nothing(update, sample):
    tree = sumtree.empty(4)
    update(tree, np.array([0, 1]), np.array([1.0, 2.0]))
    before = tree.copy()
    with pytest.raises(ValueError, match=r"indices\[1\] = 4 is outside the tree's 4 leaves \(valid: 0 to 3\)"):
        update(tree, np.array([2, 4]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match=r"indices\[0\] = -1 is outside"):
        update(tree, np.array([-1]), np.array([1.0]))
    with pytest.raises(ValueError, match=r"priorities\[1\] = -0.5 is not a priority \(valid: finite and >= 0\)"):
        update(tree, np.array([2, 3]), np.array([1.0, -0.5]))
    with pytest.raises(ValueError, match=r"priorities\[0\] = nan is not a priority"):
        update(tree, np.array([2]), np.array([np.nan]))
    np.testing.assert_array_equal(tree, before)
    with pytest.raises(ValueError, match=r"values\[1\] = inf is not a prefix sum"):
        sample(tree, np.array([0.5, np.inf]))
    with pytest.raises(ValueError, match=r"values\[0\] = -1.0 is not a prefix sum"):
        sample(tree, np.array([-1.0]))
    with pytest.raises(ValueError, match="total priority is 0.0: nothing to sample"):
        sample(sumtree.empty(4), np.array([0.0]))


def test_the_c_kernels_check_buffer_lengths():
    tree = sumtree.empty(4)
    with pytest.raises(ValueError, match="L a power of two, got L = 3"):
        _kernels.sumtree_update(np.zeros(6), np.array([0]), np.array([1.0]), 3)
    with pytest.raises(ValueError, match="priorities: expected 16 bytes, got 8"):
        _kernels.sumtree_update(tree, np.array([0, 1]), np.array([1.0]), 4)
    with pytest.raises(ValueError, match="indices: 4 bytes is not a whole number of 8-byte items"):
        _kernels.sumtree_update(tree, np.array([0], dtype=np.int32), np.array([1.0]), 4)
    with pytest.raises(ValueError, match="tree: expected 128 bytes, got 64"):
        _kernels.sumtree_sample(tree, np.array([0.0]), np.empty(1, dtype=np.int64), 8)
    with pytest.raises(ValueError, match="out_indices: expected 16 bytes, got 8"):
        _kernels.sumtree_sample(tree, np.array([0.0, 0.0]), np.empty(1, dtype=np.int64), 4)
    with pytest.raises(ValueError, match="a sum-tree is a 1-D C-contiguous float64 array"):
        kernels.sumtree_update(tree.astype(np.float32), np.array([0]), np.array([1.0]))
    with pytest.raises(ValueError, match="length 2L with L a power of two, got length 6"):
        sumtree.update(np.zeros(6), np.array([0]), np.array([1.0]))


def test_the_dispatch_gives_the_same_results_under_both_backends(monkeypatch):
    rng = np.random.default_rng(7)
    trees, leaves = {}, {}
    for backend in ("c", "numpy"):
        monkeypatch.setenv("HPCRL_KERNELS", backend)
        assert kernels.backend() == backend
        trees[backend] = sumtree.empty(300)
        for indices, priorities in random_updates(np.random.default_rng(3), 300):
            kernels.sumtree_update(trees[backend], indices, priorities)
        leaves[backend] = kernels.sumtree_sample(trees[backend], boundary_values(trees[backend], rng))
        rng = np.random.default_rng(7)
    np.testing.assert_array_equal(trees["c"], trees["numpy"])
    np.testing.assert_array_equal(leaves["c"], leaves["numpy"])


# --- the replay shard -------------------------------------------------------------------------

FIELDS = {"obs": (np.float32, (4,)), "action": (np.int64, ()), "reward": (np.float32, ())}


@pytest.fixture(params=["c", "numpy"])
def backend(request, monkeypatch):
    """Run a replay test with the C sum-tree and again with the numpy one."""
    monkeypatch.setenv("HPCRL_KERNELS", request.param)
    assert kernels.backend() == request.param
    return request.param


def rows(ids):
    """Rows that carry their own insertion number, so a test can tell which transition sits where."""
    ids = np.asarray(ids)
    return {"obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32), "action": ids.astype(np.int64),
            "reward": ids.astype(np.float32)}


def frequencies(replay, draws, batch_size=64, seed=0):
    rng = np.random.default_rng(seed)
    counts = np.zeros(replay.capacity)
    for _ in range(draws // batch_size):
        indices, _, _ = replay.sample(batch_size, beta=0.4, rng=rng)
        counts += np.bincount(indices, minlength=replay.capacity)
    return counts / counts.sum()


def test_rows_are_drawn_in_proportion_to_their_priorities(backend):
    raw = np.array([1.0, 4.0, 9.0, 16.0, 0.0, 25.0, 36.0, 49.0])
    replay = PrioritizedReplay(8, FIELDS, alpha=0.5, eps=0.0)
    replay.add(rows(range(8)), raw)
    expected = np.sqrt(raw) / np.sqrt(raw).sum()  # (1, 2, 3, 4, 0, 5, 6, 7) / 28
    n = 64 * 2000
    seen = frequencies(replay, n)
    # six binomial standard deviations of independent draws: stratified draws vary less, so a
    # correct sampler cannot fail this; uniform sampling (1/8 each) fails it at every row
    bound = 6 * np.sqrt(expected * (1 - expected) / n)
    assert (np.abs(seen - expected) <= bound).all(), (seen, expected)
    assert seen[4] == 0.0
    assert (np.abs(1 / 8 - expected) > bound).all()


def test_zero_priority_rows_and_padding_leaves_are_never_drawn(backend):
    replay = PrioritizedReplay(5, FIELDS, alpha=1.0, eps=0.0)  # 8 leaves: 3 padding leaves past row 4
    replay.add(rows(range(5)), np.array([0.0, 3.0, 0.0, 1e-300, 0.0]))
    seen = frequencies(replay, 64 * 500)
    assert set(np.flatnonzero(seen)) <= {1, 3} and seen[1] > 0.99  # 1e-300 next to 3: (almost) never
    replay.update_priorities(np.array([1]), np.array([0.0]))
    assert set(np.flatnonzero(frequencies(replay, 64 * 50))) == {3}


def test_the_ring_keeps_the_newest_rows_and_counts(backend):
    replay = PrioritizedReplay(5, FIELDS)
    replay.add(rows([0, 1, 2]), np.array([1.0, 2.0, 3.0]))
    assert (replay.size, replay.inserted, replay.sampled) == (3, 3, 0)
    replay.add(rows([3, 4, 5, 6]), np.array([4.0, 5.0, 6.0, 7.0]))  # runs past the end: wraps
    assert (replay.size, replay.inserted) == (5, 7)
    np.testing.assert_array_equal(replay.storage["action"], [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(replay.raw_priorities, [6.0, 7.0, 3.0, 4.0, 5.0])
    replay.add(rows(range(7, 19)), np.arange(7, 19, dtype=np.float64))  # 12 rows > capacity 5
    assert (replay.size, replay.inserted) == (5, 19)
    np.testing.assert_array_equal(replay.storage["action"], [15, 16, 17, 18, 14])  # row = id % capacity
    np.testing.assert_array_equal(replay.storage["obs"][:, 3], [15, 16, 17, 18, 14])
    np.testing.assert_array_equal(replay.raw_priorities, [15, 16, 17, 18, 14])
    replay.add(rows([]), np.array([]))
    assert replay.inserted == 19
    rng = np.random.default_rng(0)
    _, _, data = replay.sample(4, 0.4, rng)
    replay.sample(3, 0.4, rng)
    assert replay.sampled == 7
    assert set(data) == set(FIELDS) and data["obs"].shape == (4, 4) and data["action"].dtype == np.int64
    data["action"][:] = -1  # the batch is a copy
    assert (replay.storage["action"] >= 0).all()


def test_importance_weights_by_hand(backend):
    replay = PrioritizedReplay(4, FIELDS, alpha=1.0, eps=0.0)
    replay.add(rows([0, 1]), np.array([1.0, 3.0]))  # P = (1/4, 3/4), size 2
    # batch 4 cuts the total 4 into [0,1) [1,2) [2,3) [3,4): row 0 once, then row 1 three times
    indices, weights, _ = replay.sample(4, beta=1.0, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(indices, [0, 1, 1, 1])
    # (2 * 1/4) ** -1 = 2 and (2 * 3/4) ** -1 = 2/3, divided by the largest, 2
    np.testing.assert_allclose(weights, [1.0, 1 / 3, 1 / 3, 1 / 3], rtol=1e-6)
    assert weights.dtype == np.float32
    _, weights, _ = replay.sample(4, beta=0.5, rng=np.random.default_rng(0))
    np.testing.assert_allclose(weights, [1.0] + 3 * [np.sqrt(1 / 3)], rtol=1e-6)
    _, weights, _ = replay.sample(4, beta=0.0, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(weights, np.ones(4))


def test_the_largest_weight_of_every_batch_is_one(backend):
    rng = np.random.default_rng(2)
    replay = PrioritizedReplay(100, FIELDS)
    replay.add(rows(range(100)), rng.exponential(size=100))
    for batch_size in (1, 2, 17, 64):
        _, weights, _ = replay.sample(batch_size, beta=0.7, rng=rng)
        assert weights.max() == 1.0 and (weights > 0).all()


def test_updated_priorities_change_the_draws_and_new_rows_get_the_max(backend):
    replay = PrioritizedReplay(8, FIELDS, alpha=1.0, eps=0.0)
    replay.add(rows(range(4)))  # no priorities yet: the initial max, 1.0
    np.testing.assert_array_equal(replay.raw_priorities[:4], 1.0)
    np.testing.assert_allclose(frequencies(replay, 64 * 200), [0.25] * 4 + [0.0] * 4, atol=0.02)
    replay.update_priorities(np.array([2, 0]), np.array([-9.0, 0.5]))  # |td|
    np.testing.assert_allclose(frequencies(replay, 64 * 200)[:4], np.array([0.5, 1, 9, 1]) / 11.5, atol=0.02)
    assert replay.max_priority == 9.0
    replay.add(rows([4]))
    assert replay.raw_priorities[4] == 9.0 and replay.tree[8 + 4] == 9.0
    replay.add(rows([5]), np.array([20.0]))
    assert replay.max_priority == 20.0
    replay.update_priorities(np.array([5, 5]), np.array([2.0, 3.0]))  # a repeated row: the last wins
    assert replay.raw_priorities[5] == 3.0 and replay.max_priority == 20.0  # the max never decreases


def test_mean_priority_is_over_raw_priorities_of_held_rows(backend):
    replay = PrioritizedReplay(4, FIELDS, alpha=0.5, eps=0.1)
    assert replay.mean_priority() == 0.0
    replay.add(rows([0, 1, 2]), np.array([1.0, 2.0, 3.0]))
    assert replay.mean_priority() == pytest.approx(2.0)
    replay.update_priorities(np.array([0]), np.array([-4.0]))
    assert replay.mean_priority() == pytest.approx(3.0)


def test_bad_arguments_say_what_would_be_valid(backend):
    with pytest.raises(ValueError, match="capacity must be an integer >= 1, got 0"):
        PrioritizedReplay(0, FIELDS)
    with pytest.raises(ValueError, match="alpha must be finite and >= 0"):
        PrioritizedReplay(4, FIELDS, alpha=-0.5)
    replay = PrioritizedReplay(4, FIELDS)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="cannot sample from an empty replay"):
        replay.sample(2, 0.4, rng)
    replay.add(rows([0, 1]))
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        replay.sample(0, 0.4, rng)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
        replay.sample(2, 1.5, rng)
    with pytest.raises(ValueError, match=r"missing \['reward'\], unexpected \['rewards'\]"):
        replay.add({"obs": np.zeros((1, 4)), "action": np.zeros(1, np.int64), "rewards": np.zeros(1)})
    with pytest.raises(ValueError, match=r"field 'obs': expected rows of shape \(4,\)"):
        replay.add({**rows([2]), "obs": np.zeros((1, 3), np.float32)})
    with pytest.raises(ValueError, match="field 'action': float64 does not cast to the stored int64"):
        replay.add({**rows([2]), "action": np.zeros(1)})
    with pytest.raises(ValueError, match=r"priorities\[0\] = -1.0 is not valid"):
        replay.add(rows([2]), np.array([-1.0]))
    with pytest.raises(ValueError, match=r"td_errors\[1\] = nan is not valid \(valid: finite"):
        replay.update_priorities(np.array([0, 1]), np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match=r"indices\[0\] = 2 is not valid \(valid: held rows 0 to 1\)"):
        replay.update_priorities(np.array([2]), np.array([1.0]))
    assert (replay.size, replay.inserted) == (2, 2)  # rejected calls add nothing


def filled_replay(seed=0, capacity=50):
    rng = np.random.default_rng(seed)
    replay = PrioritizedReplay(capacity, FIELDS, alpha=0.6, eps=1e-6)
    for start in range(0, 130, 13):  # wraps twice
        replay.add(rows(range(start, start + 13)), rng.exponential(size=13) if start % 2 else None)
        indices, _, _ = replay.sample(8, 0.4, rng)
        replay.update_priorities(indices, rng.normal(size=8))
    return replay


def assert_same_future(a, b, seed=11):
    """The same rng draws the same rows with the same weights and data, through adds and updates."""
    rng_a, rng_b = np.random.default_rng(seed), np.random.default_rng(seed)
    for step in range(5):
        (ia, wa, da), (ib, wb, db) = a.sample(16, 0.5, rng_a), b.sample(16, 0.5, rng_b)
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(wa, wb)
        for name in FIELDS:
            np.testing.assert_array_equal(da[name], db[name])
        td = np.random.default_rng(step).normal(size=16)
        a.update_priorities(ia, td)
        b.update_priorities(ib, td)
        a.add(rows([1000 + step]))
        b.add(rows([1000 + step]))
    np.testing.assert_array_equal(a.tree, b.tree)
    assert (a.size, a.inserted, a.sampled, a.max_priority) == (b.size, b.inserted, b.sampled, b.max_priority)


def test_state_and_restore_give_the_same_future_draws(backend, tmp_path):
    saved = filled_replay()
    resumed = PrioritizedReplay(50, FIELDS, alpha=0.6, eps=1e-6)
    resumed.restore(saved.state())
    np.testing.assert_array_equal(resumed.tree, saved.tree)
    assert resumed.mean_priority() == saved.mean_priority()
    assert_same_future(saved, resumed)
    with h5py.File(tmp_path / "replay.h5", "w") as f:  # a flat dict of arrays: one HDF5 group
        for key, value in resumed.state().items():
            f.create_dataset(f"replay/{key}", data=value)
    from_file = PrioritizedReplay(50, FIELDS, alpha=0.6, eps=1e-6)
    with h5py.File(tmp_path / "replay.h5", "r") as f:
        from_file.restore({key: f["replay"][key][()] for key in f["replay"]})
    assert_same_future(resumed, from_file)


def test_a_partly_filled_replay_round_trips():
    small = PrioritizedReplay(10, FIELDS)
    small.add(rows([0, 1, 2]), np.array([0.5, 1.0, 2.0]))
    copy = PrioritizedReplay(10, FIELDS)
    copy.restore(small.state())
    assert (copy.size, copy.inserted) == (3, 3)
    assert_same_future(small, copy)


def test_a_mismatched_restore_names_every_difference_and_changes_nothing():
    state = filled_replay().state()
    other = PrioritizedReplay(40, {**FIELDS, "obs": (np.float32, (8,))}, alpha=0.5)
    other.add(rows([7]) | {"obs": np.zeros((1, 8), np.float32)})
    before = other.tree.copy()
    with pytest.raises(ValueError) as error:
        other.restore(state)
    message = str(error.value)
    for part in ("capacity: saved 50, this replay 40", "alpha: saved 0.6, this replay 0.5",
                 "field 'obs': saved rows float32 (4,), this replay float32 (8,)"):
        assert part in message
    np.testing.assert_array_equal(other.tree, before)
    assert (other.size, other.inserted) == (1, 1)
    with pytest.raises(ValueError, match=r"keys missing \['data.reward'\]"):
        PrioritizedReplay(50, FIELDS).restore({k: v for k, v in state.items() if k != "data.reward"})


# --- the shard's C kernels against its numpy specification -------------------------------------

def replay_under(backend, monkeypatch, *args, **kwargs):
    """A PrioritizedReplay made under HPCRL_KERNELS=backend (a replay picks its backend once, when made)."""
    monkeypatch.setenv("HPCRL_KERNELS", backend)
    replay = PrioritizedReplay(*args, **kwargs)
    assert (replay._c is not None) == (backend == "c")
    return replay


@pytest.mark.parametrize("alpha, eps", [(0.6, 1e-6), (0.0, 1e-6), (0.5, 0.0), (1.0, 0.0), (2.0, 0.01), (0.7, 1e-3)])
@pytest.mark.parametrize("capacity", [1, 5, 64, 1000])
def test_the_c_shard_kernels_match_the_numpy_specification(alpha, eps, capacity, monkeypatch):
    """Random adds (with and without priorities, zeros, wrapping, larger than the ring), draws at
    beta 0, 0.4 and 1, and updates with repeated rows and zero TD errors: the same raw priorities,
    max priority and indices; trees equal within round-off (on this project's machines bit for
    bit, since the C path mirrors numpy's sqrt/square/reciprocal shortcuts for ** 0.5, 2 and -1,
    but numpy may compute other powers with vectorised code that differs in the last bit);
    weights within one float32 ulp."""
    c, ref = (replay_under(b, monkeypatch, capacity, FIELDS, alpha=alpha, eps=eps) for b in ("c", "numpy"))
    rng = np.random.default_rng(capacity + int(100 * alpha))
    rng_c, rng_ref = np.random.default_rng(5), np.random.default_rng(5)
    next_id = 0
    for step in range(40):
        k = int(rng.integers(0, 2 * capacity + 3))
        priorities = None if step % 3 == 0 else rng.lognormal(sigma=2.0, size=k) * (rng.random(k) < 0.7)
        for replay in (c, ref):
            replay.add(rows(range(next_id, next_id + k)), priorities)
        next_id += k
        if c.size and c.tree[1] > 0:
            for beta in (0.0, 0.4, 1.0):
                (ic, wc, dc), (ir, wr, dr) = c.sample(17, beta, rng_c), ref.sample(17, beta, rng_ref)
                np.testing.assert_array_equal(ic, ir)
                assert wc.dtype == wr.dtype == np.float32
                np.testing.assert_array_max_ulp(wc, wr, maxulp=1)
                np.testing.assert_array_equal(dc["action"], dr["action"])
            repeated = np.concatenate([ic, ic[::-2]])  # every other drawn row twice, in another order
            td = rng.normal(size=repeated.shape[0]) * (rng.random(repeated.shape[0]) < 0.8) * 10.0 ** rng.integers(-3, 4)
            c.update_priorities(repeated, td)
            ref.update_priorities(repeated, td)
        # leaves are (p + eps) ** alpha from C's pow and from numpy's power, which on CPUs where numpy
        # vectorises it (AVX512's SVML) may differ in the last bit: equal within round-off, not bit for bit
        np.testing.assert_allclose(c.tree, ref.tree, rtol=1e-13, atol=0)
        np.testing.assert_array_equal(c.raw_priorities, ref.raw_priorities)
        assert (c.max_priority, c.size, c.inserted, c.sampled) == (ref.max_priority, ref.size, ref.inserted, ref.sampled)
        for name in FIELDS:
            np.testing.assert_array_equal(c.storage[name], ref.storage[name])


@pytest.mark.parametrize("backend_name", ["c", "numpy"])
def test_the_shard_rejects_bad_priorities_before_it_writes_anything(backend_name, monkeypatch):
    replay = replay_under(backend_name, monkeypatch, 4, FIELDS)
    replay.add(rows([0, 1]), np.array([1.0, 2.0]))
    tree, raw = replay.tree.copy(), replay.raw_priorities.copy()
    with pytest.raises(ValueError, match=r"^priorities\[2\] = inf is not valid \(valid: finite and >= 0\)$"):
        replay.add(rows([2, 3, 4]), np.array([1.0, 5.0, np.inf]))
    with pytest.raises(ValueError, match=r"^priorities\[0\] = -1e-300 is not valid"):
        replay.add(rows([2]), np.array([-1e-300]))
    with pytest.raises(ValueError, match=r"^indices\[1\] = -1 is not valid \(valid: held rows 0 to 1\)$"):
        replay.update_priorities(np.array([0, -1]), np.array([np.nan, 1.0]))  # indices are checked first
    with pytest.raises(ValueError, match=r"^td_errors\[0\] = -inf is not valid \(valid: finite; a NaN"):
        replay.update_priorities(np.array([1, 0], dtype=np.int32), np.array([-np.inf, 1.0]))
    np.testing.assert_array_equal(replay.tree, tree)
    np.testing.assert_array_equal(replay.raw_priorities, raw)
    assert (replay.size, replay.inserted, replay.max_priority) == (2, 2, 2.0)
    assert (replay.storage["action"][2:] == 0).all()


def test_the_c_shard_kernels_check_their_buffers():
    tree, store = sumtree.empty(4), np.zeros(4)
    with pytest.raises(ValueError, match="a replay of capacity 5 does not fit a sum-tree of 4 leaves"):
        _kernels.replay_add_priorities(tree, np.zeros(5), np.ones(1), 4, 5, 0, 0.6, 1e-6, 1.0)
    with pytest.raises(ValueError, match="raw_priorities: expected 24 bytes, got 32"):
        _kernels.replay_update_priorities(tree, store, np.zeros(1, np.int64), np.ones(1), 4, 3, 1, 0.6, 1e-6, 1.0)
    with pytest.raises(ValueError, match="out_weights: expected 8 bytes, got 16"):
        _kernels.replay_sample(tree, np.zeros(2), np.empty(2, np.int64), np.empty(2, np.float64), 4, 1, 0.4)
    with pytest.raises(ValueError, match="the tree's total priority is 0.0: nothing to sample"):
        _kernels.replay_sample(tree, np.zeros(1), np.empty(1, np.int64), np.empty(1, np.float32), 4, 1, 0.4)
    inf_tree = sumtree.empty(4)
    with np.errstate(over="ignore"):
        sumtree.update(inf_tree, np.array([0, 1]), np.array([1e308, 1e308]))  # a total that overflowed
    with pytest.raises(ValueError, match="the tree's total priority is inf"):
        _kernels.replay_sample(inf_tree, np.zeros(1), np.empty(1, np.int64), np.empty(1, np.float32), 4, 2, 0.4)
