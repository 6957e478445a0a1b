"""Trainer (learner rank): records from its batch source -> the algorithm's trainer step ->
statistics, the stop decision, outputs and the next policy version. Its averaging
(workers/averaging.py: Horovod, where a policy has several trainers) averages gradients.

The pieces are separate: the batch source (workers/batch_source.py,
the on-policy queue; workers/replay_source.py, a prioritized replay shard) hands over batches;
the algorithm's step (algos/ppo.py: PPOStep; algos/dqn.py: DQNStep; named by the algorithm's
declaration in core/dataflow.py) turns one into an update; statistics are summed
over trainers (workers/trainer_stats.py); the root writes metrics and checkpoints
(io/learner_outputs.py), publishes weights and, when the run ends, sends the stop word on the control
stream. Every trainer takes the same optimizer steps on the same averaged gradients, so their
weights stay bit-identical.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from hpcrl.core.config import Config
from hpcrl.core.config_schedule import scheduled
from hpcrl.core.contracts import Part, TrainerStep
from hpcrl.core.faults import pause_point
from hpcrl.core.messages import KEEP_ENV_STATE
from hpcrl.core.policies import policy_names
from hpcrl.core.reproducible import changed_packages, provenance
from hpcrl.core.seeds import seed_for
from hpcrl.core.startup import CLOCK
from hpcrl.core.stop import StopReason
from hpcrl.io import env_states
from hpcrl.io.checkpoint import load_checkpoint, restore_rng_states, save_checkpoint
from hpcrl.io.learner_outputs import LearnerOutputs
from hpcrl.models import build_optimizer, build_policy, copy_params_to, policy_digest
from hpcrl.runtime import comm
from hpcrl.runtime.params import END
from hpcrl.workers.averaging import start_averaging
from hpcrl.workers.evaluator import Evaluator
from hpcrl.workers.trainer_member import MemberSide
from hpcrl.workers.trainer_parts import LearnerLinks, LearnerSettings, LiveValues, SerialActor
from hpcrl.workers.trainer_stats import TrainerStats
from hpcrl.core.say import say

# the parts every trainer keeps alike, which a resume hands from the root to all of them (the
# others, a population member's link, a league member's snapshots, a serial actor, live on the root)
SHARED_PARTS = ("step", "stats", "hyperparameters")
MEMBER_WAIT_SLEEP_S = 1e-4  # a population member's learners, waiting for their root's word after an update


class LearnerRole:
    name = "learner"

    @classmethod
    def build(cls, w) -> "LearnerRole":
        """From the wiring (hpcrl.launch.wiring.Wiring): its sample-stream receiver and the
        algorithm's batch source over it; on the root, the parameter publisher and the run files."""
        cfg, layout = w.cfg, w.layout
        policy = layout.policy_of_learner(w.rank)
        actors = layout.envs_of_learner(w.rank)
        sizes = w.sizes.learner(w.rank)
        stream = w.sample[policy].receiver(actors, sizes.sample_slots)
        source = w.parts.batch_source().from_config(cfg, layout, sizes, stream, actors)
        root = w.rank == layout.learner_root
        publishes = w.rank == int(layout.learners_of_policy(policy)[0])  # its policy's first learner
        files = (LearnerOutputs(w.start, cfg.run, progress=w.parts.step().progress, label=w.member_label,
                                provenance=provenance(cfg, layout), turns=w.member_takes_turns) if root else None)
        source.resume(w.start.run_dir, w.start.start_version if w.start.resume_file else None)
        evaluator = (Evaluator(cfg, w.spaces, w.start.start_frames, w.heartbeat)
                     if root and cfg.run.eval.every_frames else None)
        links = LearnerLinks(w.trainer_comm, w.policy_comm, source, w.params[policy] if publishes else None, files,
                             w.control, evaluator)
        settings = LearnerSettings(policy, sizes.batch_share, w.start.run_dir, w.start.resume_file,
                                   live=w.algorithm.live if w.member_label else (),
                                   keeps_env_state=env_states.wanted(cfg, layout.serial, w.member_label),
                                   preempt_requested=w.preempt_requested, heartbeat=w.heartbeat)
        return cls(cfg, w.policy_spaces[policy], w.parts.step(), links, settings)

    def __init__(self, cfg: Config, spaces, step: Callable[..., TrainerStep], links: LearnerLinks,
                 settings: LearnerSettings):
        """`step`: the algorithm's trainer step class; `links`: what the learner is connected to;
        `settings`: its place and duties in the run. (A member's learner root gets its
        `population` link, workers/population.py, once built.)"""
        trainer_comm, policy, live = links.trainer_comm, settings.policy, settings.live
        self.cfg = cfg
        self.comm = trainer_comm
        self.policy = policy
        self.policy_names = policy_names(cfg.policies)
        self.policy_comm = links.policy_comm if links.policy_comm is not None else trainer_comm
        self.control = links.control  # the root (the controller) sends the stop word on it
        self.source = links.source
        self.publisher = links.publisher
        self.files = links.files
        self.evaluator = links.evaluator
        self.batch_share = settings.batch_share
        self.run_dir = settings.run_dir  # where the batch source saves what it holds (replay shards) with a checkpoint
        self.preempt_requested = settings.preempt_requested
        self.heartbeat = settings.heartbeat  # called per minibatch: a long update is work, not a hang
        self.local_env = None  # serial mode: the actor in this process, saved with the checkpoint
        self._other_policies = None  # several policies: the others' states for the next checkpoint (root)
        self.root = trainer_comm.Get_rank() == 0
        self.population, self.live = None, live
        self._in_effect = cfg.algo  # the algo section of the last update: algo.schedule's steps applied
        self.spaces = spaces
        self.publish_extra = None  # a league member's: its slot in each weights message (workers/league.py)
        self.member = MemberSide(self)  # what a population member's link calls (workers/trainer_member.py)
        # a sync run of several ranks with run.deterministic: a checkpoint of version v waits until
        # every env rank has written its state at v's start (asked for with v - 1's weights), so a
        # resume continues exactly (hpcrl/io/env_states.py; serial runs hold the actor instead)
        self.keeps_env_state = settings.keeps_env_state
        self.env_state_next = False  # the env ranks were asked for their state at the next version's start
        # only the trainers, never the whole world; with several policies, each policy's block of
        # trainers averages that policy's gradients (none at all where a block is one trainer)
        self.averaging = start_averaging(trainer_comm, len(self.policy_names), self.policy_comm.Get_size(), policy)
        device = cfg.roles.learner.device
        if device == "cuda":  # pinned by the rank among this node's trainers
            torch.cuda.set_device(comm.local_rank(trainer_comm) % torch.cuda.device_count())
        self.device = torch.device(device)
        # initial weights repeat per seed (the root's; Horovod copies them); each policy its own
        torch.manual_seed(cfg.run.seed if policy == 0 else seed_for(cfg.run.seed, "policy_init", policy))
        self.model = build_policy(spaces, cfg).to(self.device)
        self.stop_flags = 0  # the stop word's flags once the run stops
        self.version = 0
        if settings.resume_path is None:
            # A fresh run's first weights go out before the optimizer is built, so the actors
            # collect the first batch meanwhile.
            self.averaging.same_start(self.model)
            self.publish()
        optimizer = build_optimizer(self.model, cfg)
        self.rng = np.random.default_rng(seed_for(cfg.run.seed, "learner", trainer_comm.Get_rank()))  # minibatch order
        self.optimizer = self.averaging.wrap(self.model, optimizer)
        self.step = step(cfg, self.model, self.optimizer, self.device, self.rng, spaces.obs_dtype,
                         spaces.action_dtype)
        counters = self._start_from(settings.resume_path)
        self.version = int(counters.get("policy_version", 0))
        self.updates = int(counters.get("updates", 0))
        self.stats = TrainerStats(trainer_comm, frames=int(counters.get("frames", 0)),
                                  fragments_dropped=int(counters.get("fragments_dropped", 0)),
                                  policy=policy, policy_names=self.policy_names, selfplay=cfg.algo.selfplay)
        # the parts whose state checkpoints keep, each under its own name; a population member's
        # link, a league member's snapshots and a serial run's actor join them once built (`keep`)
        self.parts: dict[str, Part] = {"step": self.step, "stats": self.stats}
        if self.live:
            self.parts["hyperparameters"] = LiveValues(cfg.algo, self.live)
        for name, part in self.parts.items():
            if name in self.saved:
                part.restore(self.saved[name])
        self.start = time.perf_counter() - float(counters.get("wall_time", 0.0))  # wall time continues
        self.stopped_by = ""
        self.draining = False
        self.done = False
        self._set_waiting_status()
        if settings.resume_path is not None:
            self.publish()

    @property
    def frames(self) -> int:
        return self.stats.frames

    def _start_from(self, resume_path: str | None) -> dict:
        """Same weights and optimizer state on every trainer, and the checkpoint's parts in
        `self.saved` (on the root all of them; on the others those every trainer keeps alike: the
        step's, the statistics', the live hyperparameters'); returns the counters. The root
        reads the checkpoint; the others receive it."""
        self.saved: dict = {}
        if not resume_path:
            # The weights are everywhere the same already (published in __init__). A fresh optimizer
            # is identical everywhere too; hvd.broadcast_optimizer_state would take a zero-gradient
            # step to create Adam's state, putting bias correction one step off.
            return {}
        checkpoint = load_checkpoint(resume_path) if self.root else None
        if checkpoint is not None and (changed := changed_packages(checkpoint["provenance"])):
            say(f"warning: resuming with other package versions than the checkpoint was written with "
                f"({', '.join(changed)}): the run goes on, but its bits may differ from an uninterrupted run's")
        if len(self.policy_names) == 1:
            if checkpoint is not None:
                self.model.load_state_dict(checkpoint["model"])
            self.averaging.same_start(self.model)
        # (several policies: each block's trainers seeded alike start alike; a resume's weights
        # come with the optimizer state below)
        # MPI: the root's optimizer state, counters and shared parts (with several policies, every
        # policy's weights and step too), pickled once at start, loaded as saved
        policies, shared = None, None
        if checkpoint is not None:
            parts = checkpoint["parts"]
            policies = {self.policy_names[0]: {"model": checkpoint["model"], "optimizer": checkpoint["optimizer"],
                                               "step": parts.get("step", {})},
                        **checkpoint["policies"]} if len(self.policy_names) > 1 else None
            shared = {name: parts[name] for name in SHARED_PARTS if name in parts}
        state, counters, policies, shared = comm.broadcast_object_on(
            self.comm, (checkpoint["optimizer"], checkpoint["counters"], policies, shared) if self.root else None)
        self.saved = checkpoint["parts"] if checkpoint is not None else shared
        if policies is not None:
            mine = policies[self.policy_names[self.policy]]
            self.model.load_state_dict(mine["model"])
            state, self.saved["step"] = mine["optimizer"], mine["step"]
        self.optimizer.load_state_dict(state)
        if checkpoint is not None:
            restore_rng_states(checkpoint["rng"], self.rng)
        return counters

    def keep(self, name: str, part: Part) -> None:
        """From now on checkpoints keep `part`'s state under `name` (what a resume gave it: `saved`)."""
        self.parts[name] = part

    def join_population(self, link, weights_slot=None) -> None:
        """(A member's learner root) its population link, which after every update reports and
        serves the population's orders (workers/population.py), and whose state its checkpoints
        keep; in a league, `weights_slot(message)` fills each weights message's league slot."""
        self.population = link
        self.keep("population", link)
        if weights_slot is not None:
            self.publish_extra = weights_slot

    def keep_local_actor(self, actor) -> None:
        """Serial mode: the actor in this process, whose state checkpoints keep (where it can be
        saved), restored from the checkpoint resumed from."""
        self.local_env = actor
        part = SerialActor(actor, self.cfg.env.id)
        if "env" in self.saved:
            part.restore(self.saved["env"])
        self.keep("env", part)

    # --- the poll loop ----------------------------------------------------------------------------
    def poll(self) -> int:
        if self.publisher is not None:
            self.publisher.poll()
        if self.draining:
            work = self.source.drain()
            if self.source.all_gone() and (self.publisher is None or self.publisher.flushed()):
                self._finish()
            return work
        arrived, batch = self.source.poll(self.version, self.frames)
        if batch is None:
            if arrived:
                self._set_waiting_status()
            return arrived
        self._update(batch)
        self.source.release_batch()  # the slots go back to the actors as credits
        self._after_update()
        return arrived + 1

    def _update(self, batch: list) -> None:
        self.status = f"training policy version {self.version}"
        a = self.cfg.algo  # the base: a population's copy and explore change it; the schedule scales it
        self._in_effect = scheduled(a, self.frames)
        decay = max(0.0, 1.0 - self.frames / self.cfg.run.total_frames) if a.lr_schedule == "linear" else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = self._in_effect.lr * decay
        # the headers are read now: the slots are released after the update
        self._local = self.stats.local(self.source.counted(batch), self.source.take_dropped(),
                                       self.source.stream.held_max)
        # MPI: after the update, every trainer folds the moments of all trainers' batches into its
        # observation normaliser (a no-op without model.obs_norm), so all hold identical stats
        pause_point("update")  # tests: a learner stopped here holds the others inside the gradient average
        self._losses = self.step(batch, reduce_moments=lambda moments: comm.allreduce_sum(self.policy_comm, moments),
                                 **self.averaging.hooks(self.optimizer, self.heartbeat), loss_scale=self.batch_share,
                                 algo=self._in_effect)
        self.version += 1
        self.updates += 1
        CLOCK.mark("first_update")
        cost = self.averaging.update_done()
        if cost is not None and self.root:  # once: what averaging costs against what it saves
            say(f"{'' if cost.pays else 'warning: '}{cost.describe(len(self.policy_names))}")

    def _after_update(self) -> None:
        """After each update, in order: the metrics row; the root's stop decision; the other
        policies' states (several policies); the population's turn (a member's root); the report
        (metrics and checkpoint, on the root); what every trainer then agrees on; and the next
        weights or the stop word."""
        row = self._row()
        at_rest = self._between_records()
        code = self._stop_decision(row, at_rest) if self.root else StopReason.GOING_ON
        code, due = self._gather_other_policies(code, at_rest)
        code, adoption = self._population_turn(row, code)
        if self.root:
            code = self._report(row, code, due, at_rest)
        self._agree_and_go_on(code, adoption)

    def _row(self) -> dict:
        """This update's metrics row: statistics summed over the trainers, the scheduled values in
        effect, a member's pauses for copies, an evaluation's results (run.eval), and
        (run.replica_digests) every learner's digest."""
        row = self.stats.row(self._local, self._losses, self.version, time.perf_counter() - self.start,
                             self.optimizer.param_groups[0]["lr"])
        for key in self.cfg.algo.schedule:  # the values in effect (lr is in the row already)
            if key != "lr":
                row[f"algo.{key}"] = float(getattr(self._in_effect, key))
        if self.population is not None:  # the learner root's time in copies so far (its member's pauses)
            row["exploit_pause_s"] = self.population.pause_s
        if self.evaluator is not None:  # (the root) its current weights played, where an evaluation is due
            row.update(self.evaluator.after_update(row["frames"], self.model))
        if self.cfg.run.replica_digests:
            row["replica_digest"] = comm.gather_to_root(self.comm, np.array([policy_digest(self.model)],
                                                                           dtype=np.int64))
        return row

    def _stop_decision(self, row: dict, at_rest: bool) -> StopReason:
        """(Root) whether the run stops after this update, and why."""
        code = StopReason.GOING_ON
        if self.preempt_requested():
            code = StopReason.PREEMPTED
        elif row["frames"] >= self.cfg.run.total_frames:
            code = StopReason.TOTAL_FRAMES
        elif self.stats.target_reached(self.cfg.run.target_return):
            code = StopReason.TARGET_RETURN
        if code and not at_rest:
            code = StopReason.GOING_ON  # serial mode: the stop waits for the actor's next record
        self.stopped_by = code.text
        return code

    def _gather_other_policies(self, code: int, at_rest: bool) -> tuple[int, int | None]:
        """Several policies: MPI over the trainers, the root's stop code and whether this update
        checkpoints (decided before the other policies' states travel), and those states at the
        root when it does. (code, due: None with one policy, where the report decides)."""
        if len(self.policy_names) == 1:
            return code, None
        code, due = comm.broadcast_ints(self.comm, [code, int(self.root and at_rest and self._checkpoint_due(code))])
        self._other_policies = self._gather_policies() if due else None
        return code, due

    def _population_turn(self, row: dict, code: int) -> tuple[int, object]:
        """(A member's root) report to the population when due and serve its orders, before the
        checkpoint, so that it holds a copy taken now (or, preempted while waiting for a round, says
        so). (code, the adoption of another member's state or None)."""
        if not self.root or self.population is None:
            return code, None
        adoption, preempted = self.population.between_updates(self, row["frames"], self.stats.fitness(), int(code))
        if preempted:  # (in a round: its checkpoint says which)
            code = StopReason.PREEMPTED
            self.stopped_by = code.text
        if adoption is not None:
            self.member.adopt(adoption)
        return code, adoption

    def _report(self, row: dict, code: int, due: int | None, at_rest: bool) -> int:
        """(Root) the metrics row, and a checkpoint where one is due; the stop code, or
        OUTPUT_FAILED when an output could not be written."""
        if due is None and not at_rest and not code:
            due = 0  # serial mode: a checkpoint due waits for the actor's next record too
        if due is None and self.keeps_env_state:
            due = self._checkpoint_due(code)
        return self.files.report(row, code, self.save, checkpoint=None if due is None else bool(due))

    def _agree_and_go_on(self, code: int, adoption) -> None:
        """MPI: all trainers stop after the same update, the same way, save with the root's
        checkpoint, and take the state the root received from another member (a population
        member's root may wait long for its round: the others sleep meanwhile); then the next
        weights, or the stop word and draining."""
        code, saved, copied, ask = comm.broadcast_ints(self.comm, [code, self.files.saved if self.root else 0,
                                                                   int(adoption is not None),
                                                                   int(self.root and self.env_state_next)],
                                                       sleep_s=MEMBER_WAIT_SLEEP_S if self.live else None)
        self.env_state_next = bool(ask)  # (the publishers of other policies ask with their weights too)
        if saved:
            self.source.save(self.run_dir, self.version)
        if copied:
            self.member.share_adoption(adoption)
        reason = StopReason(code)
        self.stopped_by, self.stop_flags = reason.text, reason.flags
        if code and self.control.is_controller:
            self.control.stop(self.stop_flags, self.version)  # every rank hears why the run ends
        self.publish()
        if code:  # take (and discard) records until every actor's goodbye is in
            self.draining = True
            self.status = "stopping: waiting for the env ranks' last messages"
        else:
            self._set_waiting_status()

    def _checkpoint_due(self, code: int) -> bool:
        """(Root) whether this update writes a checkpoint. Where env ranks keep their state, one
        that falls due is announced with this version's weights and written at the next update, by
        when every env rank has written its state at that version's start; a stop's is written at
        once (the env ranks, at that version's start still, write theirs as they stop)."""
        due = self.files.checkpoint_due(code)
        if not self.keeps_env_state or code:
            return due
        if self.env_state_next:
            self.env_state_next = False
            return True
        self.env_state_next = due
        return False

    def _between_records(self) -> bool:
        """Serial mode: whether the actor in this process is between records, and every record it
        sent is in. Only such a point is one an uninterrupted run passes through alike, so only
        there may a checkpoint (with the actor's state) be taken or the run stop. With a replay
        ratio every update is one (the actor waits while updates are owed); free-running, the
        update after each record's arrival. Always true in runs of several ranks."""
        return self.local_env is None or (self.local_env.between_records() and not self.source.holds_records())

    def _set_waiting_status(self) -> None:
        """From now on the status names what is missing (the watchdog's message, if it fires). It
        is worked out only when read: a scan of every actor on each arrival would cost O(fan-in)
        per record."""
        self._status = None

    @property
    def status(self) -> str:
        return self._status if self._status is not None else self.source.waiting_for(self.version)

    @status.setter
    def status(self, text: str) -> None:
        self._status = text

    def publish(self) -> None:
        """This version's weights to the policy's holders (the stream's end once the run stops)."""
        if self.publisher is not None:  # after the stop word, the last version closes the stream
            flags = END if self.stop_flags else KEEP_ENV_STATE if self.env_state_next else 0
            self.publisher.publish(self.version, lambda flat: copy_params_to(self.model, flat),
                                   flags=flags, extra=self.publish_extra or _no_slot)

    # --- learner root only --------------------------------------------------------------------------
    def save(self, path: str) -> None:
        counters = {"frames": self.frames, "updates": self.updates, "policy_version": self.version,
                    "wall_time": time.perf_counter() - self.start, "stopped_by": self.stopped_by,
                    "fragments_dropped": self.stats.fragments_dropped,
                    "target_return": self.cfg.run.target_return}
        parts = {name: state for name, part in self.parts.items() if (state := part.state()) is not None}
        save_checkpoint(path, self.model, self.optimizer, counters, self.rng, self.files.config_text, parts=parts,
                        policies=self._other_policies, provenance=self.files.provenance)

    def _gather_policies(self) -> dict | None:
        """MPI over the trainers: each other policy's state (its first trainer's), at the root."""
        mine = (self.policy_names[self.policy], {"model": self.model.state_dict(),
                                                 "optimizer": self.optimizer.state_dict(), "step": self.step.state()})
        first = self.policy > 0 and self.policy_comm.Get_rank() == 0
        states = comm.gather_objects_to_root(self.comm, mine if first else None)
        return dict(s for s in states if s is not None) if states is not None else None

    def _finish(self) -> None:
        self.source.stream.close()
        if self.files is not None:
            self.files.close()
        self.done = True
        self.status = "finished"


def _no_slot(message) -> None:
    """A league member's weights before its league part is built (a fresh run's first version, sent
    while the optimizer is built) carry no slot: snapshot id -1, which holders never load. Left at
    the buffer's zeros, they said "slot 0 holds snapshot 0" with zero weights, and every holder took
    that uniform player for member 0's first snapshot until slot 0 was given another."""
    if "slot_id" in message.spec.header:
        message.set(slot=-1, slot_id=-1)
