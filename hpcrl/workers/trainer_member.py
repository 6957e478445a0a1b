"""What a population member's learner offers its population link (workers/population.py, and in a
league workers/league.py): its state as the arrays a copy moves in place, the adoption of another
member's state, and, in a league, its weights for a snapshot and an exploiter's start again.

A `MemberSide` belongs to one learner (workers/trainer.py `LearnerRole.member`) and works on that
learner's model, optimizer, step and parts; the population calls it on the learner root, and
`share_adoption` reaches the member's other learners.
"""
from __future__ import annotations

import numpy as np
import torch

from hpcrl.models import build_policy, copy_params_to, load_params_from, num_params
from hpcrl.models.member import member_arrays, member_layout
from hpcrl.runtime import comm
from hpcrl.runtime.member_copy import MemberState, broadcast_state
from hpcrl.core.say import say


class MemberSide:
    """The member-facing side of `learner` (workers/trainer.py `LearnerRole`, which builds it with
    itself; not imported here, as trainer.py imports this module): used only in a population."""

    def __init__(self, learner):
        self.learner = learner
        self._state: MemberState | None = None  # built at the member's first copy

    def member_state(self) -> MemberState:
        """The learner's weights, normalisers and Adam state as the arrays a copy moves in place."""
        if self._state is None:
            t = self.learner
            self._state = MemberState(member_arrays(t.model, t.optimizer), member_layout(t.model))
        return self._state

    def share_adoption(self, adoption) -> None:
        """MPI over the member's learners: the state its root received (the root's arrays) and the
        adoption, taken by the others as the root took it."""
        t = self.learner
        broadcast_state(t.comm, self.member_state())
        adoption = comm.broadcast_object_on(t.comm, adoption)
        if not t.root:
            self.adopt(adoption)

    def adopt_before_training(self, adoption) -> None:
        """A copy taken at start-up (a member resumed in the round it was preempted in). Serial
        mode: the actor reads the weights in place and has not read them yet, so the version
        published at start-up is published again, with the copy (elsewhere holders may have that
        version already, and the copy reaches them with the next)."""
        self.adopt(adoption)
        if self.learner.local_env is not None:
            self.learner.publish()

    @property
    def num_params(self) -> int:
        return num_params(self.learner.model)

    def copy_params(self, flat: np.ndarray) -> None:
        """The weights into a float32 vector (a league snapshot: workers/league.py)."""
        copy_params_to(self.learner.model, flat)

    def reset_to(self, weights: np.ndarray | None = None, owner: int = -1):
        """(root) A league exploiter starts again: the weights and normalisers it was built with
        (the same seed, so the same ones), or those of main agent `owner`'s snapshot `weights`
        (a policy vector, as copy_params gives), and a fresh optimizer and step state. The
        adoption that tells its other learners (they take the root's arrays, as a copy's)."""
        t = self.learner
        with torch.random.fork_rng():  # the run's own random streams go on untouched
            torch.manual_seed(t.cfg.run.seed)
            fresh = build_policy(t.spaces, t.cfg)
        t.model.load_state_dict(fresh.state_dict())
        if weights is not None:
            load_params_from(t.model, weights)
        for arena in t.optimizer.ensure_state():
            arena.zero_()
        # a fresh step's state (a reward scale that has seen nothing), built only when a reset comes
        new_step = type(t.step)(t.cfg, t.model, t.optimizer, t.device, np.random.default_rng(0),
                                t.spaces.obs_dtype, t.spaces.action_dtype)
        from hpcrl.workers.population import Adoption
        return Adoption(owner, new_step.state(), t.parts["hyperparameters"].state())

    def adopt(self, adoption) -> None:
        """A copy's state is in the learner's arrays already: the parent's step state and the new
        hyperparameters. Its fitness starts again, so the next judgement is of the copy (parent
        -1: a league exploiter's start again from its initial state; in a league, any other parent
        is the main agent whose snapshot it started again from)."""
        t = self.learner
        t.step.restore(adoption.step_state)
        before = {k: getattr(t.cfg.algo, k) for k in t.live}
        t.parts["hyperparameters"].restore(adoption.hyperparameters)
        t.stats.reset_fitness()
        if not t.root:
            return
        label = t.files.label
        if adoption.parent < 0:
            say(f"league: started again from its initial weights at {t.frames:,} frames, after its snapshot",
                label=label)
        elif t.population is not None and t.population.league is not None:
            say(f"league: started again from main agent {adoption.parent}'s newest snapshot at {t.frames:,} "
                f"frames, after its snapshot", label=label)
        else:
            for parent in adoption.replaced:  # (each copy taken is said, as the lineage counts it)
                say(f"exploit: took member {parent}'s state at {t.frames:,} frames; replaced by the next copy "
                    f"before training on it", label=label)
            changed = [f"algo.{k} {before[k]:.4g} -> {v:.4g}" for k, v in adoption.hyperparameters.items()
                       if v != before[k]]
            say(f"exploit: took member {adoption.parent}'s state at {t.frames:,} "
                f"frames{'; ' + ', '.join(changed) if changed else ''}", label=label)
