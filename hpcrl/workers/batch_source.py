"""The trainer's batch source for on-policy algorithms: fragments from the sample stream, queued
until a batch is complete.

Sync mode (PPO): a batch is k fragments of the current policy version from every actor of this
trainer (k = 1 unless algo.batch_frames says more); a fragment of another version is a bug (sync
actors wait for each version after their k).
Async mode (APPO): fragments queue in arrival order; a batch is the oldest `batch_fragments` of
them (one per actor, or as algo.batch_frames says), and fragments more than `max_policy_lag`
versions old are dropped (their frames and finished episodes still count).
Fragments stay in the stream's slots until the batch that holds them is trained on; releasing
the slots grants the actors credits again, so the stream's memory bound holds here too.
"""
from __future__ import annotations

from collections import deque

from hpcrl.core.messages import STOP, Message
from hpcrl.runtime.streams import SampleReceiver


class FragmentQueue:
    def __init__(self, stream: SampleReceiver, actors: list[int], sync: bool, max_policy_lag: int,
                 batch_fragments: int | None = None):
        """`batch_fragments`: fragments per batch (hpcrl.core.sizing.LearnerSizes; default one per
        actor); in sync mode a multiple of the actors, each sending its share per version."""
        self.stream = stream
        self.actors = list(actors)
        self.position = {rank: i for i, rank in enumerate(self.actors)}
        self.sync = sync
        self.max_policy_lag = max_policy_lag
        self.batch_fragments = len(self.actors) if batch_fragments is None else batch_fragments
        # Sizes.of refuses a config that breaks these (roles.learner.sample_slots, algo.batch_frames)
        assert len(stream.slots) >= self.batch_fragments and not (sync and self.batch_fragments % len(self.actors))
        self.per_actor = self.batch_fragments // len(self.actors)  # sync: fragments per actor and version
        self.have: dict[int, list[int]] = {}  # sync: actor position -> slots of its fragments, in index order
        self.complete = 0  # sync: actors whose fragments of this version are all in
        self.queue: deque[int] = deque()  # async: slots in arrival order
        self.batch: list[int] = []  # slots of the batch handed out, until released
        self.dropped: list = []  # (frames, episode stats) of fragments dropped since the last batch
        self._checked_version = None  # async: the version the queue was last checked for staleness at

    @classmethod
    def from_config(cls, cfg, layout, sizes, stream: SampleReceiver, actors: list[int]) -> "FragmentQueue":
        """The algorithm's batch source for one trainer (named in core/dataflow.py); `sizes`: the
        trainer's (hpcrl.core.sizing.LearnerSizes)."""
        return cls(stream, actors, sync=cfg.algo.mode == "sync", max_policy_lag=cfg.algo.max_policy_lag,
                   batch_fragments=sizes.batch_fragments)

    def poll(self, version: int, frames: int = 0) -> tuple[int, list[Message] | None]:
        """(fragments that arrived, the next batch or None). A batch's slots stay taken until
        `release_batch`. (`frames`, the run's so far, is for sources that anneal on it.)"""
        ready = self.stream.ready()
        if not self.sync and version != self._checked_version:  # once per version, not per poll
            self._drop_stale(version)
        for slot in ready:
            self._take(slot, version)
        if self.sync:
            if self.complete < len(self.actors):
                return len(ready), None
            # fragment index, then actor (env ranks in order: the envs' global order): repeatable
            # whatever the arrival order, and the same columns in the same order on layouts with
            # other env-rank counts (k fragments per version of every env, either way)
            self.batch = [self.have[p][i] for i in range(self.per_actor) for p in range(len(self.actors))]
            self.have.clear()
            self.complete = 0
        else:
            if len(self.queue) < self.batch_fragments:
                return len(ready), None
            self.batch = [self.queue.popleft() for _ in range(self.batch_fragments)]
        return len(ready), [self.stream.slots[s] for s in self.batch]

    def save(self, run_dir: str, version: int) -> None:
        """With a checkpoint: nothing to save (queued fragments are not worth a resume's while)."""

    def resume(self, run_dir: str, version: int | None) -> None:
        """At start (`version`: the checkpoint's, or None for a new run): nothing to restore."""

    def counted(self, batch: list[Message]) -> list[Message]:
        """The records an update accounts for (frames, episodes, timings): the batch's fragments."""
        return batch

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
        slots = self.have.setdefault(position, [])
        if len(slots) == self.per_actor:
            raise RuntimeError(f"trainer: {self.per_actor + 1} fragments of policy version {version} from actor rank "
                               f"{fragment.get('env_rank')} (sync mode collects {self.per_actor} per version)")
        slots.append(slot)
        # one actor's records arrive in the order sent, but one call to ready() lists them by slot
        slots.sort(key=lambda s: self.stream.slots[s].get("index"))
        self.complete += len(slots) == self.per_actor

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

    def owes_updates(self) -> bool:
        return False  # an update comes with each batch; the actors never wait for one in serial mode

    def holds_records(self) -> bool:
        """Fragments arrived that no update has taken yet."""
        return bool(self.queue) or any(self.have.values())

    # --- shutdown --------------------------------------------------------------------------------
    def drain(self) -> int:
        """After the stop word: discard fragments (their slots grant credits for the actors' last
        sends) until every actor's goodbye is in."""
        for slot in list(self.queue) + [s for slots in self.have.values() for s in slots] + self.batch:
            self.stream.release(slot)
        self.queue.clear()
        self.have.clear()
        self.complete = 0
        self.batch = []
        return self.stream.discard_arrivals()

    def all_gone(self) -> bool:
        return self.stream.all_closed()

    def waiting_for(self, version: int) -> str:
        """What the trainer waits for (the watchdog's message, if it fires)."""
        if not self.sync:
            return (f"waiting for fragments: {len(self.queue)} of {self.batch_fragments} queued "
                    f"for policy version {version}")
        missing = [r for r in self.actors if len(self.have.get(self.position[r], ())) < self.per_actor]
        shown = ", ".join(str(r) for r in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        each = f" ({self.per_actor} from each)" if self.per_actor > 1 else ""
        return f"waiting for fragments of policy version {version}{each} from env ranks {shown}"
