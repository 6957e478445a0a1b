"""Gradient averaging between the trainers of a policy: the only importer of horovod.

A policy with several trainers averages every minibatch's gradient over them with Horovod (an
allreduce in its background thread), so their weights stay bit-identical. A run whose policies
have one trainer each averages nothing, so it neither imports Horovod nor starts it (its
import, init and background thread would cost a lone learner start-up time and a share of a
core, for nothing). Either way the trainer asks the same three things of its `Averaging`: wrap the
optimizer, the step's hooks, and the same start on every trainer.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import torch


def start_horovod(trainer_comm, process_sets: list[list[int]] | None = None) -> list | None:
    """Horovod on the trainers' communicator (never the whole world), with a process set per list
    of trainer ranks in `process_sets` (several policies); those sets, or None."""
    import horovod.torch as hvd
    # Each minibatch's allreduce waits for the background thread's next cycle; with 0.1 ms instead
    # of 1 ms a 2-learner CartPole job took 14.0/17.4 s instead of 17.2/21.7 s (seeds 1/3, same
    # frames). A user's HOROVOD_CYCLE_TIME wins.
    os.environ.setdefault("HOROVOD_CYCLE_TIME", "0.1")
    sets = [hvd.ProcessSet(ranks) for ranks in process_sets] if process_sets else None
    hvd.init(comm=trainer_comm, process_sets=sets)
    return sets


def averaging_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, process_set=None,
                        grouped: bool = True) -> torch.optim.Optimizer:
    """`optimizer` averaging its gradients over the trainers of `process_set` (default: all) at
    each step. `grouped`: one group holding every parameter, so the whole gradient goes out as one
    fused allreduce once backward has produced all of it, instead of one per tensor as each
    becomes ready (bench/allreduce.py). (Several policies: no group. Horovod 0.28 forms groups by
    broadcasting the parameter order from global rank 0, which only the first policy's process set
    holds; the others fail.)"""
    import horovod.torch as hvd
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                    groups=[list(model.parameters())] if grouped else None,
                                    process_set=process_set or hvd.global_process_set)


def averaging_hooks(optimizer: torch.optim.Optimizer, after_step: Callable[[], None] = lambda: None) -> dict:
    """A trainer step's hooks with an averaging optimizer: average the gradients (before the step
    clips them), then apply the step without averaging again, then `after_step`."""
    def apply_step() -> None:
        with optimizer.skip_synchronize():  # Horovod: gradients were averaged before clipping
            optimizer.step()
        after_step()
    return {"average_gradients": optimizer.synchronize, "apply_step": apply_step}


JUDGED_UPDATES = 3  # updates timed (after the first, which warms up) before the cost is reported


@dataclass
class AveragingCost:
    """What averaging cost the trainers of a policy, per gradient step, over the updates timed:
    the wait in the averaging (the allreduce, and the slowest trainer's lateness) against the
    rest of the step (loss, backward, optimizer) on this trainer's share of the batch."""
    trainers: int
    averaging_s: float  # per gradient step
    computing_s: float  # per gradient step, this trainer's rows

    @property
    def most_saved_s(self) -> float:
        """The most that splitting the batch over the trainers can save per gradient step: one
        trainer would compute `trainers` times the rows (at best `trainers` times as long)."""
        return (self.trainers - 1) * self.computing_s

    @property
    def pays(self) -> bool:
        return self.averaging_s < self.most_saved_s

    def describe(self, policies: int) -> str:
        text = (f"gradient averaging over {self.trainers} learners: {1e3 * self.averaging_s:.2f} ms per gradient "
                f"step against {1e3 * self.computing_s:.2f} ms of computing it; splitting the batch saves at most "
                f"{1e3 * self.most_saved_s:.2f} ms")
        if self.pays:
            return text
        return (f"{text}, less than averaging costs: roles.learner.ranks: {policies} (one learner per policy, no "
                f"averaging) would train faster, with the freed ranks as env or inference ranks "
                f"(hpcrl tune predicts the best layout)")


class HorovodAveraging:
    """Several trainers per policy: Horovod on the trainers' communicator, with a process set per
    policy (its block of trainers, in trainer-rank order) when there are several policies. It
    times its waits in the averaging over the first updates (`cost`)."""

    def __init__(self, trainer_comm, policies: int, block: int, policy: int):
        sets = start_horovod(trainer_comm, [list(range(p * block, (p + 1) * block)) for p in range(policies)]
                             if policies > 1 else None)
        import horovod.torch as hvd
        self.hvd = hvd
        self.grouped = sets is None
        self.process_set = sets[policy] if sets else hvd.global_process_set
        self.one_policy = policies == 1
        self.trainers = block
        self.updates = 0  # updates begun
        self.steps = 0  # gradient steps timed
        self.averaging_s = 0.0  # in the averaging, over the steps timed
        self.update_s = 0.0  # in whole updates, over the updates timed
        self._update_start = None

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        # The wrapper is a new optimizer over the same parameter groups: saved state is loaded into
        # it, after wrapping.
        return averaging_optimizer(model, optimizer, self.process_set, grouped=self.grouped)

    def hooks(self, optimizer: torch.optim.Optimizer, after_step: Callable[[], None]) -> dict:
        hooks = averaging_hooks(optimizer, after_step)
        self.updates += 1
        if not 1 < self.updates <= 1 + JUDGED_UPDATES:
            return hooks
        synchronize = hooks["average_gradients"]

        def timed_average() -> None:
            start = time.perf_counter()
            synchronize()
            self.averaging_s += time.perf_counter() - start
            self.steps += 1
        self._update_start = time.perf_counter()
        return {**hooks, "average_gradients": timed_average}

    def update_done(self) -> AveragingCost | None:
        """After an update: the cost, once, after the last update timed; None otherwise."""
        if self._update_start is None:
            return None
        self.update_s += time.perf_counter() - self._update_start
        self._update_start = None
        if self.updates != 1 + JUDGED_UPDATES or not self.steps:
            return None
        return AveragingCost(self.trainers, self.averaging_s / self.steps,
                             max(self.update_s - self.averaging_s, 0.0) / self.steps)

    def same_start(self, model: torch.nn.Module) -> None:
        """The root's weights on every trainer. (Several policies: each block's trainers, seeded
        alike, start alike already; a resume's weights come with the optimizer state.)"""
        if self.one_policy:
            self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)


class NoAveraging:
    """One trainer per policy: its gradients are its own; nothing to import, start or copy."""

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    def hooks(self, optimizer: torch.optim.Optimizer, after_step: Callable[[], None]) -> dict:
        def apply_step() -> None:
            optimizer.step()
            after_step()
        return {"apply_step": apply_step}

    def same_start(self, model: torch.nn.Module) -> None:
        pass

    def update_done(self) -> None:
        return None


def start_averaging(trainer_comm, policies: int, block: int, policy: int) -> HorovodAveraging | NoAveraging:
    """The averaging of `policy`'s trainers: `policies` blocks of `block` trainers each on
    `trainer_comm`. Collective over the trainers (all of them take the same branch)."""
    if block == 1:
        return NoAveraging()
    return HorovodAveraging(trainer_comm, policies, block, policy)
