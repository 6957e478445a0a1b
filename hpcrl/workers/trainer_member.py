"""The parts of a trainer (workers/trainer.py) that only a population member uses: its state as
the arrays a copy moves in place, the adoption of another member's state, and, in a league, its
snapshots' weights and an exploiter's start again (workers/population.py
and workers/league.py call these on the learner root; `_share_adoption` reaches its other learners).
"""
from __future__ import annotations

import numpy as np
import torch

from hpcrl.models import build_policy, copy_params_to, load_params_from, num_params
from hpcrl.models.member import member_arrays, member_layout
from hpcrl.runtime import comm
from hpcrl.runtime.member_copy import MemberState, broadcast_state
from hpcrl.core.say import say


class MemberParts:
    """Mixed into LearnerRole, whose attributes these read (model, optimizer, step, cfg, comm...)."""

    def member_state(self) -> MemberState:
        """This member's weights, normalisers and Adam state as the arrays a copy moves in place."""
        if self._member_state is None:
            self._member_state = MemberState(member_arrays(self.model, self.optimizer), member_layout(self.model))
        return self._member_state

    def _share_adoption(self, adoption) -> None:
        """MPI over the member's learners: the state its root received (the root's arrays) and the
        adoption, taken by the others as the root took it."""
        broadcast_state(self.comm, self.member_state())
        adoption = comm.broadcast_object_on(self.comm, adoption)
        if not self.root:
            self._adopt(adoption)

    def adopt_before_training(self, adoption) -> None:
        """A copy taken at start-up (a member resumed in the round it was preempted in). Serial
        mode: the actor reads the weights in place and has not read them yet, so the version
        published at start-up is published again, with the copy (elsewhere holders may have that
        version already, and the copy reaches them with the next)."""
        self._adopt(adoption)
        if self.local_env is not None:
            self._publish()

    @property
    def num_params(self) -> int:
        return num_params(self.model)

    def copy_params(self, flat: np.ndarray) -> None:
        """The weights into a float32 vector (a league snapshot: workers/league.py)."""
        copy_params_to(self.model, flat)

    def reset_to(self, weights: np.ndarray | None = None, owner: int = -1):
        """(root) A league exploiter starts again: the weights and normalisers it was built with
        (the same seed, so the same ones), or those of main agent `owner`'s snapshot `weights`
        (a policy vector, as copy_params gives), and a fresh optimizer and step state. The
        adoption that tells its other learners (they take the root's arrays, as a copy's)."""
        with torch.random.fork_rng():  # the run's own random streams go on untouched
            torch.manual_seed(self.cfg.run.seed)
            fresh = build_policy(self.spaces, self.cfg)
        self.model.load_state_dict(fresh.state_dict())
        if weights is not None:
            load_params_from(self.model, weights)
        for arena in self.optimizer.ensure_state():
            arena.zero_()
        # a fresh step's state (a reward scale that has seen nothing), built only when a reset comes
        new_step = type(self.step)(self.cfg, self.model, self.optimizer, self.device, np.random.default_rng(0),
                                   self.spaces.obs_dtype, self.spaces.action_dtype)
        from hpcrl.workers.population import Adoption
        return Adoption(owner, new_step.state(), self.parts["hyperparameters"].state())

    def _adopt(self, adoption) -> None:
        """A copy's state is in this learner's arrays already: the parent's step state and the new
        hyperparameters. Its fitness starts again, so the next judgement is of the copy (parent
        -1: a league exploiter's start again from its initial state; in a league, any other parent
        is the main agent whose snapshot it started again from)."""
        self.step.restore(adoption.step_state)
        before = {k: getattr(self.cfg.algo, k) for k in self.live}
        self.parts["hyperparameters"].restore(adoption.hyperparameters)
        self.stats.reset_fitness()
        if self.root and adoption.parent < 0:
            say(f"league: started again from its initial weights at {self.frames:,} "
                f"frames, after its snapshot", label=self.files.label)
        elif self.root and self.population is not None and self.population.league is not None:
            say(f"league: started again from main agent {adoption.parent}'s newest "
                f"snapshot at {self.frames:,} frames, after its snapshot", label=self.files.label)
        elif self.root:
            changed = [f"algo.{k} {before[k]:.4g} -> {v:.4g}" for k, v in adoption.hyperparameters.items()
                       if v != before[k]]
            say(f"exploit: took member {adoption.parent}'s state at {self.frames:,} "
                f"frames{'; ' + ', '.join(changed) if changed else ''}", label=self.files.label)
