"""The trainer's batch source for DQN: records from the sample stream go into this trainer's
prioritized replay shard (hpcrl.algos.replay), and an update samples from it. A shard's rows are
n-step transitions, or with a recurrent Q-network (R2D2) whole sequences with their stored states:
the record's layout names the fields.

Each learner owns one shard of algo.replay.capacity / learners transitions (as in SRL's Ape-X:
the replay lives in the trainer, so sampling and priority write-back never cross the network;
docs/algorithms.md says why). A record's slot goes back to its actor as a credit as soon as its
transitions are in the shard, so the stream's memory bound holds and the shard's is fixed.

With algo.replay.replay_ratio set, the learner keeps to it: after warm-up it trains while it owes
samples (ratio x transitions inserted since warm-up > transitions sampled), and it takes in a new
record only when it owes less than one update's samples. Records it does not take stay in their
slots, so actors run out of credits and wait: flow control is what holds the ratio.

Sync mode (algo.mode sync) goes in rounds instead, which repeat: each env rank sends one record per
policy version; once the round's records are all in, they enter the shard in env-rank order, and
the update trains the gradient steps the replay ratio owes, counted over every learner of the
policy (one sum over them per round), so all take the same steps. Until every shard is warm a
round trains none, and only publishes the next version.
"""
from __future__ import annotations

import json
import math
import os
from collections import deque
from dataclasses import dataclass

import numpy as np

from hpcrl.algos.replay import PrioritizedReplay
from hpcrl.io.checkpoint import CheckpointError, load_arrays, save_arrays
from hpcrl.core.config_sac import replay_settings
from hpcrl.core.messages import STOP, Message, MessageSpec, replay_fields
from hpcrl.core.seeds import seed_for
from hpcrl.runtime.streams import SampleReceiver
from hpcrl.core.say import say

HEADER_KEPT = ("frames", "version", "rollout_us", "wait_us", "credit_wait_us")


def shard_for(record: MessageSpec, capacity: int, alpha: float) -> PrioritizedReplay:
    """An empty replay shard of `capacity` rows of `record`'s layout (its replayed fields)."""
    return PrioritizedReplay(capacity, {name: (record.field(name).dtype, record.field(name).shape[1:])
                                        for name in replay_fields(record)}, alpha=alpha)


class RecordHeader:
    """What the trainer's statistics read from a record (hpcrl.workers.trainer_stats), kept after
    its slot is released: the header words and the episode statistics."""

    def __init__(self, record: Message):
        self.words = {key: record.get(key) for key in HEADER_KEPT}
        self.episode_stats = record["episode_stats"].copy()

    def get(self, key: str) -> int:
        return self.words[key]

    def __getitem__(self, key: str) -> np.ndarray:
        if key != "episode_stats":  # the one field kept
            raise KeyError(key)
        return self.episode_stats


@dataclass(frozen=True)
class ReplaySchedule:
    """When and how much a replay shard trains. `batch_size` and `warmup`: this shard's
    (core/sizing.py ReplayShard); `gradient_steps` per update; `replay_ratio`: samples owed per
    transition inserted (None: train freely); `beta`: the importance weights' exponent at the
    start, annealed to 1 over `total_frames`; `learners`: the shards of the run; `sync`: in
    rounds (algo.mode sync, with a replay ratio); `save_shard`: algo.replay.checkpoint."""

    batch_size: int
    warmup: int
    gradient_steps: int = 1
    replay_ratio: float | None = None
    beta: float = 0.4
    total_frames: int = 1
    learners: int = 1
    sync: bool = False
    save_shard: bool = False


class ReplaySource:
    def __init__(self, stream: SampleReceiver, actors: list[int], replay: PrioritizedReplay,
                 schedule: ReplaySchedule, rng: np.random.Generator, index: int = 0):
        """`index`: the learner's index among the learners."""
        self.stream, self.actors = stream, list(actors)
        self.replay = replay
        self.batch_size, self.warmup = schedule.batch_size, schedule.warmup
        self.gradient_steps = schedule.gradient_steps
        self.replay_ratio = schedule.replay_ratio
        self.beta0, self.total_frames = schedule.beta, schedule.total_frames
        self.learners = schedule.learners
        self.rng = rng
        self.waiting: deque[int] = deque()  # slots that arrived and are not in the shard yet
        self.arrivals: list[RecordHeader] = []  # records taken in since the last update
        self.inserted_at_warm: int | None = None  # the shard's insert count when warm-up ended (or at a resume)
        self.sampled_at_warm = 0  # and its sample count then
        self.frames = 0  # the run's frames (all env ranks), for beta's annealing
        self.index, self.save_shard = index, schedule.save_shard
        self.unit = "sequences" if "state0" in replay.fields else "transitions"  # what a shard's rows are
        self.sync = schedule.sync
        self.round: dict[int, int] = {}  # sync: this round's records so far, slot by env rank
        # sync: (all shards' insert count, this shard's sample count) when every shard was first warm
        # (None: not yet), where the replay ratio counts from
        self.round_origin: tuple[int, int] | None = None

    @classmethod
    def from_config(cls, cfg, layout, sizes, stream: SampleReceiver, actors: list[int]) -> "ReplaySource":
        """The algorithm's batch source for one trainer (named in core/dataflow.py); `sizes`: the
        trainer's (hpcrl.core.sizing.LearnerSizes), which hold its shard's."""
        learners = len(layout.learners)
        capacity, warmup, batch = sizes.replay.capacity, sizes.replay.warmup, sizes.replay.batch
        r, (d, _) = cfg.algo.replay, replay_settings(cfg.algo)
        index = layout.index_in("learner", stream.comm.Get_rank())  # the stream's communicator is a copy of the run's world
        schedule = ReplaySchedule(batch, warmup, d.gradient_steps, r.replay_ratio, r.beta, cfg.run.total_frames,
                                  learners, sync=cfg.algo.mode == "sync", save_shard=r.checkpoint)
        return cls(stream, actors, shard_for(stream.slots[0].spec, capacity, r.alpha), schedule,
                   np.random.default_rng(seed_for(cfg.run.seed, "replay", index)), index=index)

    # --- the trainer's calls -------------------------------------------------------------------------
    def poll(self, version: int, frames: int = 0) -> tuple[int, "ReplaySource | None"]:
        """(records that arrived, this source as the batch when an update is due, else None). The
        step samples from it (`sample`) and writes priorities back (`update_priorities`)."""
        self.frames = frames
        ready = self.stream.ready()
        for slot in ready:
            if self.stream.slots[slot].get("flags") & STOP:
                raise RuntimeError(f"trainer: actor rank {self.stream.slots[slot].get('env_rank')} said goodbye "
                                   f"before the run ended")
            if self.sync:
                self.round[self.stream.slots[slot].get("env_rank")] = slot
            else:
                self.waiting.append(slot)
        if self.sync:
            if len(self.round) < len(self.actors):
                return len(ready), None
            for rank in self.actors:  # the round's records in env-rank order, whatever their arrival
                self._take_in(self.round.pop(rank))
            return len(ready), self
        while self.waiting and self._may_take_in():
            self._take_in(self.waiting.popleft())
        return len(ready), (self if self._update_due() else None)

    def steps_due(self, sum_over_learners) -> int:
        """The gradient steps of this update: algo's gradient_steps, or in sync mode those the
        replay ratio owes after the round (0 until every shard is warm), the same on every learner
        of the policy: `sum_over_learners` sums an array over them."""
        if not self.sync:
            return self.gradient_steps
        inserted, warm, batch = sum_over_learners(np.array([self.replay.inserted, self._warm(), self.batch_size],
                                                           dtype=np.float64))
        if self.round_origin is None:
            if warm < self.learners:
                return 0
            self.round_origin = int(inserted), self.replay.sampled  # from the first round every shard is warm
        inserted_at, sampled_at = self.round_origin
        taken = (self.replay.sampled - sampled_at) // self.batch_size  # gradient steps since
        return int(self.replay_ratio * (int(inserted) - inserted_at) // int(batch)) - taken

    def counted(self, batch) -> list[RecordHeader]:
        """The records this update accounts for: those taken in since the last one."""
        return self.arrivals

    def release_batch(self) -> None:
        self.arrivals = []

    def take_dropped(self) -> list:
        return []  # a replay never drops records (it overwrites its oldest transitions)

    # --- what the step uses ----------------------------------------------------------------------------
    @property
    def beta(self) -> float:
        """Importance-sampling exponent, annealed linearly from algo.replay.beta to 1 at run.total_frames."""
        return self.beta0 + (1.0 - self.beta0) * min(1.0, self.frames / self.total_frames)

    def sample(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(shard indices, importance weights, transitions) of one gradient step."""
        return self.replay.sample(self.batch_size, self.beta, self.rng)

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        self.replay.update_priorities(indices, td_errors)

    def metrics(self) -> dict[str, float]:
        """This shard's part of the metrics row (the trainer averages them over learners)."""
        r = self.replay
        return {"replay_size": float(r.size * self.learners),  # the mean shard x learners: all shards' total
                "replay_ratio": r.sampled / max(r.inserted, 1), "priority_mean": r.mean_priority(),
                "beta": self.beta}

    # --- with checkpoints (algo.replay.checkpoint) ------------------------------------------------------
    def shard_path(self, run_dir: str) -> str:
        return os.path.join(run_dir, f"replay-{self.index}.h5")

    def save(self, run_dir: str, version: int) -> None:
        """Beside the root's checkpoint of policy version `version`: this learner's shard."""
        if self.save_shard:
            origin = None if self.inserted_at_warm is None else [self.inserted_at_warm, self.sampled_at_warm]
            if self.sync:
                origin = None if self.round_origin is None else list(self.round_origin)
            save_arrays(self.shard_path(run_dir), self.replay.state(),
                        {"policy_version": version, "learners": self.learners,
                         "rng": json.dumps(self.rng.bit_generator.state), "ratio_origin": json.dumps(origin)})

    def resume(self, run_dir: str, version: int | None) -> None:
        """At start: a resume (checkpoint of policy `version`) takes its shard back when it was saved
        with that checkpoint and the same learner count; otherwise it fills the replay again."""
        if not self.save_shard or version is None:
            return
        path = self.shard_path(run_dir)
        why = None
        try:
            arrays, attrs = load_arrays(path)
        except CheckpointError as exc:
            why = "it has none" if not os.path.exists(path) else str(exc)
        else:
            if int(attrs["policy_version"]) != version or int(attrs["learners"]) != self.learners:
                why = (f"{path} holds policy version {int(attrs['policy_version'])} of {int(attrs['learners'])} "
                       f"learners, the checkpoint version {version} of {self.learners}")
            else:
                try:
                    self.replay.restore(arrays)
                    self.rng.bit_generator.state = json.loads(attrs["rng"])
                    origin = _ratio_origin(attrs.get("ratio_origin"))
                except ValueError as exc:  # another capacity or record layout
                    why = f"{path} does not fit this run's replay ({exc})"
        if why:
            say(f"warning: learner {self.index}: no saved replay shard to resume from ({why}); it fills "
                f"its replay again ({self.warmup:,} {self.unit}) before it trains")
        elif origin is not None and self.sync:
            self.round_origin = origin
        elif origin is not None:  # the updates owed at the checkpoint are owed still
            self.inserted_at_warm, self.sampled_at_warm = origin
        elif self._warm():  # (a shard saved before the origin was): the replay ratio counts on from here
            self.inserted_at_warm, self.sampled_at_warm = self.replay.inserted, self.replay.sampled

    # --- serial mode (launch/wiring.py) ----------------------------------------------------------------
    def owes_updates(self) -> bool:
        """An update is due by the replay ratio (never without one: then the learner trains freely;
        nor in sync mode, where the actor waits for each round's version anyway)."""
        return self.replay_ratio is not None and not self.sync and self._update_due()

    def holds_records(self) -> bool:
        """Records arrived that are not in the shard yet."""
        return bool(self.waiting or self.round)

    # --- taking records in -------------------------------------------------------------------------------
    def _warm(self) -> bool:
        return self.replay.size >= self.warmup

    def _owed(self) -> float:
        """Samples this learner owes the replay ratio (infinite without one)."""
        if self.replay_ratio is None:
            return math.inf
        return self.replay_ratio * (self.replay.inserted - self.inserted_at_warm) - (self.replay.sampled -
                                                                                    self.sampled_at_warm)

    def _may_take_in(self) -> bool:
        return not self._warm() or self.replay_ratio is None or \
            self._owed() < self.batch_size * self.gradient_steps

    def _update_due(self) -> bool:
        return self._warm() and self._owed() > 0

    def _take_in(self, slot: int) -> None:
        record = self.stream.slots[slot]
        count = record.get("count")
        priorities = record["priorities"][:count]
        # negative: the writer could not compute them (SAC's, TD3's need the critics): the shard's max, as PER gives
        self.replay.add({name: record[name][:count] for name in self.replay.fields},
                        None if count and priorities[0] < 0 else priorities)
        self.arrivals.append(RecordHeader(record))
        self.stream.release(slot)  # a credit for the actor again
        if self.inserted_at_warm is None and self._warm():  # the ratio counts from here
            self.inserted_at_warm, self.sampled_at_warm = self.replay.inserted, self.replay.sampled

    # --- shutdown --------------------------------------------------------------------------------------
    def drain(self) -> int:
        """After the stop word: discard records until every actor's goodbye is in."""
        while self.waiting:
            self.stream.release(self.waiting.popleft())
        while self.round:
            self.stream.release(self.round.popitem()[1])
        return self.stream.discard_arrivals()

    def all_gone(self) -> bool:
        return self.stream.all_closed()

    def waiting_for(self, version: int) -> str:
        """What the trainer waits for (the watchdog's message, if it fires)."""
        if self.sync:
            missing = [rank for rank in self.actors if rank not in self.round]
            return (f"waiting for the records of policy version {version} from env rank(s) "
                    f"{', '.join(map(str, missing[:8]))}{' ...' if len(missing) > 8 else ''} (a sync round)")
        if not self._warm():
            return (f"filling its replay shard before training: {self.replay.size:,} of {self.warmup:,} "
                    f"{self.unit} (algo.replay.warmup / learners)")
        return (f"waiting for {self.unit}: the replay ratio {self.replay_ratio} is met "
                f"({self.replay.sampled:,} sampled, {self.replay.inserted:,} inserted)")


def _ratio_origin(text) -> tuple[int, int] | None:
    """A saved shard's (inserted, sampled) where its replay ratio counts from; None when it was not
    warm yet, or saved without it. ValueError when it is not such a pair."""
    origin = json.loads(text) if text is not None else None
    if origin is None:
        return None
    if not (isinstance(origin, list) and len(origin) == 2 and all(isinstance(v, int) and v >= 0 for v in origin)):
        raise ValueError(f"its ratio_origin {text!r} is not a pair of counts")
    return origin[0], origin[1]
