"""The sum-tree: the C kernels against the numpy reference."""
import numpy as np
import pytest

from hpcrl import _kernels
from hpcrl.algos import kernels
from hpcrl.algos import sumtree

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
