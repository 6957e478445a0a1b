"""Message packing: header and arrays share one aligned buffer; partial sends keep a prefix."""
import numpy as np

from hpcrl.core.messages import EPISODE_STATS, MessageSpec, fragment_spec, request_spec


def test_fields_are_aligned_views_of_one_buffer():
    spec = MessageSpec(header=("a", "b"), fields=[("x", np.uint8, (3,)), ("y", np.float32, (2, 2))])
    assert spec.offsets == {"x": 16, "y": 24} and spec.nbytes == 40
    m = spec.allocate()
    m.set(a=7, b=-1)
    m["x"][:] = [1, 2, 3]
    m["y"][:] = 1.5
    assert m.get("a") == 7 and m.get("b") == -1
    assert np.shares_memory(m["y"], m.buffer)
    # a second message built from the same spec reads the same bytes the same way
    other = spec.allocate()
    other.buffer[:] = m.buffer
    assert other.get("a") == 7 and list(other["x"]) == [1, 2, 3] and other["y"][1, 1] == 1.5


def test_fragment_fields_do_not_overlap_and_keep_their_values():
    spec = fragment_spec(4, 3, (5,), "float32", (), "int64")
    spans = sorted((spec.offsets[f.name], spec.offsets[f.name] + f.nbytes) for f in spec.fields)
    assert spans[0][0] >= 8 * len(spec.header)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert spans[-1][1] <= spec.nbytes
    m = spec.allocate()
    for i, f in enumerate(spec.fields):  # a distinct value per field, all written before any is read
        m[f.name][...] = i + 1
    for i, f in enumerate(spec.fields):
        assert np.all(m[f.name] == i + 1), f.name


def test_fragment_round_trip_through_bytes():
    spec = fragment_spec(4, 3, (5,), "float32", (), "int64")
    m = spec.allocate()
    rng = np.random.default_rng(0)
    m["obs"][:] = rng.normal(size=(4, 3, 5))
    m["actions"][:] = rng.integers(0, 2, size=(4, 3))
    m["dones"][2, 1] = 1
    m["episode_stats"][:] = np.arange(len(EPISODE_STATS))
    m.set(env_rank=5, version=9, index=2, frames=12)
    received = spec.allocate()
    received.buffer[:] = np.frombuffer(m.buffer.tobytes(), dtype=np.uint8)
    for name in ("obs", "actions", "dones", "episode_stats"):
        np.testing.assert_array_equal(received[name], m[name])
    assert (received.get("env_rank"), received.get("version"), received.get("frames")) == (5, 9, 12)


def test_request_prefix_covers_exactly_the_final_rows_sent():
    spec = request_spec(4, (3,), "float32")
    assert spec.prefix_nbytes("final_obs", 0) == spec.offsets["final_obs"]
    assert spec.prefix_nbytes("final_obs", 4) == spec.nbytes
    assert spec.prefix_nbytes("final_obs", 1) == spec.offsets["final_obs"] + 12
