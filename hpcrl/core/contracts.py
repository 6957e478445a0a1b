"""The contracts between the runtime and an algorithm's parts, in code: what the wiring and the
poll loop call on a worker, what a trainer calls on its batch source, its step and the parts
its checkpoints keep. Every class the registry binds for an algorithm (launch/registry.py) must
meet them; tests/test_registry.py checks each one against these Protocols, member by member and
parameter by parameter.

A new algorithm (SAC, a population member) brings its classes under these names; nothing in
the runtime then changes.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np


class Worker(Protocol):
    """One role's work on a rank (an actor, a policy server, a trainer, a replay shard). Built from
    the wiring (`build(w)`, launch/wiring.py), then polled by `launch.run.poll_until_done` until done."""

    name: str  # the role, as in the config's roles: section
    done: bool  # finished: the poll loop stops polling it
    status: str  # what it is doing or waiting for, for the watchdog's and the abort hook's messages

    @classmethod
    def build(cls, w: Any) -> Worker: ...

    def poll(self) -> int:
        """Do what is ready without blocking; return how much work was done (0: idle)."""
        ...


class BatchSource(Protocol):
    """A trainer's supply of samples from its sample stream: fragments in arrival or version
    order (FragmentQueue), or a prioritized replay shard (ReplaySource)."""

    stream: Any  # its sample-stream receiver (runtime/streams.py): the trainer reads its slots held, and closes it

    @classmethod
    def from_config(cls, cfg: Any, layout: Any, sizes: Any, stream: Any, actors: list[int]) -> BatchSource:
        """`sizes`: this trainer's (core/sizing.py, LearnerSizes): its batch, or its replay shard."""
        ...

    def poll(self, version: int, frames: int = 0) -> tuple[int, Any]:
        """(work done, a batch for the trainer step or None)."""
        ...

    def counted(self, batch: Any) -> list:
        """The records of `batch` whose statistics (episodes, frames) the trainer counts."""
        ...

    def release_batch(self) -> None: ...

    def take_dropped(self) -> list: ...

    def save(self, run_dir: str, version: int) -> None:
        """Beside the learner root's checkpoint: what the source holds that a resume needs."""
        ...

    def resume(self, run_dir: str, version: int | None) -> None: ...

    def drain(self) -> int:
        """After the stop: take and discard records until every actor has said goodbye."""
        ...

    def all_gone(self) -> bool: ...

    def owes_updates(self) -> bool:
        """Serial mode: whether an update is due before the actor in this process may go on (a
        replay ratio's); the actor holds while it is."""
        ...

    def holds_records(self) -> bool:
        """Records arrived that no update has taken in yet (serial mode: no checkpoint between)."""
        ...

    def waiting_for(self, version: int) -> str:
        """What the trainer waits for, in words (the watchdog's message)."""
        ...


class TrainerStep(Protocol):
    """An algorithm's update on one batch: the losses, gradients (averaged through the hooks the
    trainer passes) and optimizer step. `progress`: its part of the progress line, a format
    string over the metrics row."""

    progress: str

    def __call__(self, batch: Any, reduce_moments: Callable[[np.ndarray], np.ndarray] = ...,
                 **hooks: Any) -> dict[str, float]: ...

    def state(self) -> dict:
        """What a checkpoint keeps of the step (normalisers' statistics, target networks' age)."""
        ...

    def restore(self, state: dict) -> None: ...


class Part(Protocol):
    """A piece of a learner's state that its checkpoints keep, each under its own name (the trainer
    step, the statistics, a population member's link...; workers/trainer.py `LearnerRole.keep`)."""

    def state(self) -> Any:
        """A tree of arrays, numbers and strings (io/checkpoint.py writes it); None: nothing to keep now."""
        ...

    def restore(self, state: Any) -> None:
        """Take up the state a checkpoint kept (as `state` gave it)."""
        ...
