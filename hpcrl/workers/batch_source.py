"""The trainer's batch source for on-policy algorithms: fragments from the sample stream, queued
until a batch is complete.

Sync mode (PPO): a batch is one fragment of the current policy version from every actor of this
trainer; a fragment of another version is a bug (sync actors wait for each version).
Async mode (APPO): fragments queue in arrival order; a batch is the oldest `batch_fragments` of
them, and fragments more than `max_policy_lag` versions old are dropped (their frames and
finished episodes still count).
Fragments stay in the stream's slots until the batch that holds them is trained on; releasing
the slots grants the actors credits again, so the stream's memory bound holds here too.
"""
from __future__ import annotations

from collections import deque

from hpcrl.core.messages import STOP, Message
from hpcrl.runtime.streams import SampleReceiver


class FragmentQueue:
    def __init__(self, stream: SampleReceiver, actors: list[int], sync: bool, max_policy_lag: int):
        self.stream = stream
        self.actors = list(actors)
        self.position = {rank: i for i, rank in enumerate(self.actors)}
        self.sync = sync
        self.max_policy_lag = max_policy_lag
        self.batch_fragments = len(self.actors)  # one per actor, as in sync mode
        if len(stream.slots) < self.batch_fragments:
            raise ValueError(f"{len(stream.slots)} sample slots cannot hold a batch of {self.batch_fragments} fragments")
        self.have: dict[int, int] = {}  # sync: actor position -> slot of its fragment
        self.queue: deque[int] = deque()  # async: slots in arrival order
        self.batch: list[int] = []  # slots of the batch handed out, until released
        self.dropped: list = []  # (frames, episode stats) of fragments dropped since the last batch
        self.goodbyes: set[int] = set()
        self._checked_version = None  # async: the version the queue was last checked for staleness at

    @classmethod
    def from_config(cls, cfg, stream: SampleReceiver, actors: list[int]) -> "FragmentQueue":
        """The algorithm's batch source for one trainer (named in core/dataflow.py)."""
        return cls(stream, actors, sync=cfg.algo.mode == "sync", max_policy_lag=cfg.algo.max_policy_lag)

    def poll(self, version: int) -> tuple[int, list[Message] | None]:
        """(fragments that arrived, the next batch or None). A batch's slots stay taken until
        `release_batch`."""
        ready = self.stream.ready()
        if not self.sync and version != self._checked_version:  # once per version, not per poll
            self._drop_stale(version)
        for slot in ready:
            self._take(slot, version)
        if self.sync:
            if len(self.have) < self.batch_fragments:
                return len(ready), None
            self.batch = [self.have[p] for p in range(self.batch_fragments)]  # in actor order: repeatable
            self.have.clear()
        else:
            if len(self.queue) < self.batch_fragments:
                return len(ready), None
            self.batch = [self.queue.popleft() for _ in range(self.batch_fragments)]
        return len(ready), [self.stream.slots[s] for s in self.batch]

    def release_batch(self) -> None:
        for slot in self.batch:
            self.stream.release(slot)
        self.batch = []

    def take_dropped(self) -> list:
        dropped, self.dropped = self.dropped, []
        return dropped

    def _take(self, slot: int, version: int) -> None:
        fragment = self.stream.slots[slot]
        if fragment.get("flags") & STOP:  # a goodbye before the stop word: the actor ended early
            raise RuntimeError(f"trainer: actor rank {fragment.get('env_rank')} said goodbye before the run ended")
        if not self.sync:
            if fragment.get("version") < version - self.max_policy_lag:
                self._drop(slot)
            else:
                self.queue.append(slot)
            return
        if fragment.get("version") != version:  # sync mode: on-policy or a bug
            raise RuntimeError(f"trainer: fragment from actor rank {fragment.get('env_rank')} was collected "
                               f"with policy version {fragment.get('version')}, expected {version}")
        position = self.position[fragment.get("env_rank")]
        if position in self.have:
            raise RuntimeError(f"trainer: two fragments of policy version {version} from actor rank "
                               f"{fragment.get('env_rank')} (sync mode collects one per version)")
        self.have[position] = slot

    def _drop_stale(self, version: int) -> None:
        """Async, when the policy version moves on: drop queued fragments that fell behind it
        (arrivals are checked as they come in `_take`)."""
        self._checked_version = version
        oldest_ok = version - self.max_policy_lag
        kept: deque[int] = deque()
        for slot in self.queue:
            if self.stream.slots[slot].get("version") >= oldest_ok:
                kept.append(slot)
            else:
                self._drop(slot)
        self.queue = kept

    def _drop(self, slot: int) -> None:
        fragment = self.stream.slots[slot]
        self.dropped.append((fragment.get("frames"), fragment["episode_stats"].copy()))
        self.stream.release(slot)

    # --- shutdown --------------------------------------------------------------------------------
    def drain(self) -> int:
        """After the stop word: discard fragments (their slots grant credits for the actors' last
        sends) until every actor's goodbye is in."""
        for slot in list(self.queue) + list(self.have.values()) + self.batch:
            self.stream.release(slot)
        self.queue.clear()
        self.have.clear()
        self.batch = []
        ready = self.stream.ready()
        for slot in ready:
            fragment = self.stream.slots[slot]
            if fragment.get("flags") & STOP:
                self.goodbyes.add(fragment.get("env_rank"))
            self.stream.release(slot)
        return len(ready)

    def all_gone(self) -> bool:
        return len(self.goodbyes) == len(self.actors)

    def waiting_for(self, version: int) -> str:
        """What the trainer waits for (the watchdog's message, if it fires)."""
        if not self.sync:
            return (f"waiting for fragments: {len(self.queue)} of {self.batch_fragments} queued "
                    f"for policy version {version}")
        missing = [r for r in self.actors if self.position[r] not in self.have]
        shown = ", ".join(str(r) for r in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        return f"waiting for fragments of policy version {version} from env ranks {shown}"
