"""FragmentQueue's batching (sync and async, with algo.batch_frames) against a stand-in for the
sample stream: the queue only reads its slots, asks which arrived, and releases them."""
import pytest

from hpcrl.core.messages import fragment_spec
from hpcrl.workers.batch_source import FragmentQueue

T, N = 4, 2
A, B = 7, 9  # the env (actor) ranks of the learner


class Stream:
    """What FragmentQueue uses of a SampleReceiver: `slots`, `ready()` (the slots that arrived,
    listed by slot number as Testsome does, not in arrival order) and `release`."""

    def __init__(self, n_slots: int):
        spec = fragment_spec(T, N, (3,), "float32", (), "int64")
        self.slots = [spec.allocate() for _ in range(n_slots)]
        self.free = list(range(n_slots))
        self.arrived: list[int] = []

    def deliver(self, env_rank: int, version: int, index: int, slot: int | None = None) -> None:
        """A fragment arrives, in `slot` or the lowest free one."""
        slot = min(self.free) if slot is None else slot
        self.free.remove(slot)
        self.slots[slot].set(env_rank=env_rank, version=version, index=index, frames=T * N, flags=0)
        self.slots[slot]["episode_stats"][:] = 0
        self.arrived.append(slot)

    def ready(self) -> list[int]:
        out, self.arrived = sorted(self.arrived), []
        return out

    def release(self, slot: int) -> None:
        self.free.append(slot)


def headers(batch):
    return [(f.get("env_rank"), f.get("version"), f.get("index")) for f in batch]


def test_sync_batch_is_k_fragments_of_the_version_from_every_actor_in_index_then_actor_order():
    stream = Stream(6)
    queue = FragmentQueue(stream, [A, B], sync=True, max_policy_lag=0, batch_fragments=4)  # 2 per actor
    stream.deliver(B, 0, 10)
    stream.deliver(A, 0, 4, slot=3)
    assert queue.poll(0) == (2, None)
    assert queue.waiting_for(0) == "waiting for fragments of policy version 0 (2 from each) from env ranks 7, 9"
    stream.deliver(B, 0, 11)  # B's share is in
    assert queue.poll(0) == (1, None) and queue.poll(0) == (0, None)
    assert queue.waiting_for(0).endswith("from env ranks 7")
    stream.deliver(A, 0, 5)  # in slot 2, below the slot of A's first: the batch goes by index
    arrived, batch = queue.poll(0)
    # each actor's first fragments, then its second: the envs' global order within each, as a layout
    # with other env-rank counts would assemble it
    assert arrived == 1 and headers(batch) == [(A, 0, 4), (B, 0, 10), (A, 0, 5), (B, 0, 11)]
    queue.release_batch()
    assert len(stream.free) == 6


def test_sync_refuses_a_fragment_beyond_the_share_or_of_another_version():
    stream = Stream(6)
    queue = FragmentQueue(stream, [A, B], sync=True, max_policy_lag=0, batch_fragments=4)
    stream.deliver(A, 3, 0)
    stream.deliver(A, 3, 1)
    stream.deliver(A, 3, 2)
    with pytest.raises(RuntimeError, match="3 fragments of policy version 3 from actor rank 7 .*collects 2 per"):
        queue.poll(3)
    stream = Stream(6)
    queue = FragmentQueue(stream, [A, B], sync=True, max_policy_lag=0, batch_fragments=4)
    stream.deliver(B, 2, 0)
    with pytest.raises(RuntimeError, match="collected with policy version 2, expected 3"):
        queue.poll(3)


def test_async_batch_is_batch_fragments_in_arrival_order_from_any_actor():
    stream = Stream(5)
    queue = FragmentQueue(stream, [A, B], sync=False, max_policy_lag=2, batch_fragments=3)
    for rank, index in ((A, 0), (A, 1)):
        stream.deliver(rank, 0, index)
    assert queue.poll(0) == (2, None)
    assert queue.waiting_for(0) == "waiting for fragments: 2 of 3 queued for policy version 0"
    stream.deliver(A, 0, 2)
    stream.deliver(B, 0, 0)
    arrived, batch = queue.poll(0)
    assert arrived == 2 and headers(batch) == [(A, 0, 0), (A, 0, 1), (A, 0, 2)]  # B's waits for the next
    queue.release_batch()
    stream.deliver(B, 1, 1)
    stream.deliver(A, 1, 3)
    arrived, batch = queue.poll(3)  # B's first (version 0) is now more than 2 versions old: dropped
    assert arrived == 2 and batch is None and len(queue.take_dropped()) == 1
    stream.deliver(A, 3, 4)
    assert headers(queue.poll(3)[1]) == [(B, 1, 1), (A, 1, 3), (A, 3, 4)]


def test_without_batch_fragments_a_batch_is_one_fragment_per_actor():
    stream = Stream(4)
    sync = FragmentQueue(stream, [A, B], sync=True, max_policy_lag=0)
    stream.deliver(B, 0, 0)
    stream.deliver(A, 0, 0)
    assert headers(sync.poll(0)[1]) == [(A, 0, 0), (B, 0, 0)]
    assert FragmentQueue(Stream(4), [A, B], sync=False, max_policy_lag=0).batch_fragments == 2
