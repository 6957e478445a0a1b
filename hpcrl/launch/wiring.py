"""The whole topology, wired in one place: the streams an algorithm declares (core/dataflow.py),
then this rank's workers, each built by its role's class (launch/registry.py).

A worker only knows its stream endpoints, never who is on the other side; the layout (which
ranks, how many, on which node and device) comes from the config through `plan_layout`, and the
sizes both imply (batches, sample slots, replay shards) through `Sizes.of`, so the same
algorithm runs serially, on 4 ranks or on 4,000 with only the roles table different.
Building the streams is collective over the run's world (a communicator: the job's, or a
population member's block of it): every rank takes part in the same order, whatever its roles.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hpcrl.core.config import Config
from hpcrl.core.dataflow import ALGORITHMS, INFERENCE, PARAMETER, SAMPLE, Algorithm, inference_messages
from hpcrl.core.layout import Layout
from hpcrl.core.messages import MessageSpec, weights_spec
from hpcrl.core.policies import policy_spaces
from hpcrl.core.sizing import FRAGMENT_BUFFERS, Sizes
from hpcrl.io.rundir import RunStart
from hpcrl.launch.registry import Parts, parts_of
from hpcrl.runtime import comm
from hpcrl.runtime.control import ControlStream
from hpcrl.runtime.params import ParameterPublisher, build_parameter_stream
from hpcrl.runtime.streams import SampleReceiver, SampleSender

@dataclass
class InferenceStream:
    """Request/reply endpoints between actors and policy servers, one channel per env group."""

    comm: object
    request: MessageSpec
    reply: MessageSpec

    def client(self, server: int, group: int) -> comm.RequestClient:
        return comm.RequestClient(self.comm, server, self.request.allocate(), self.reply.allocate(), group=group)

    def server(self, clients: list[tuple[int, int]]) -> comm.RequestServer:
        """`clients`: (actor rank, group) pairs."""
        return comm.RequestServer(self.comm, [r for r, _ in clients], [g for _, g in clients],
                                  [self.request.allocate() for _ in clients], [self.reply.allocate() for _ in clients])


@dataclass
class SampleStream:
    """Many-to-one records in the algorithm's layout, credit flow control (runtime/streams.py)."""

    comm: object
    record: MessageSpec

    def sender(self, receiver: int) -> SampleSender:
        return SampleSender(self.comm, receiver, [self.record.allocate() for _ in range(FRAGMENT_BUFFERS)])

    def receiver(self, senders: list[int], slots: int) -> SampleReceiver:
        return SampleReceiver(self.comm, senders, [self.record.allocate() for _ in range(slots)],
                              per_sender=FRAGMENT_BUFFERS)


@dataclass
class Wiring:
    """What a worker's `build` may use: the config, the layout, the sizes they imply (derived once
    by launch: a worker reads its batch, slots and shard there, never works them out again), this
    rank, its stream endpoints. Lists run over the policies (core/policies.py; one entry in a run
    of one policy)."""

    cfg: Config
    spaces: object  # hpcrl.envs.EnvSpaces (not imported: the runtime needs no gymnasium here)
    layout: Layout
    sizes: Sizes
    world: object  # the run's communicator
    rank: int
    start: RunStart
    algorithm: Algorithm
    parts: Parts  # the algorithm's classes: record writer, batch source, trainer step
    control: ControlStream
    weights: list[MessageSpec]  # per policy: its weights message
    policy_spaces: list = None  # per policy: the env as that policy sees it (its agents)
    trainer_comm: object = None  # every trainer, on trainer ranks (statistics and the stop decision)
    policy_comm: object = None  # the trainers of this trainer's policy (all of them in a run of one)
    inference: InferenceStream | None = None
    sample: list[SampleStream] | None = None  # per policy: actors -> the trainers of that policy
    params: list | None = None  # per policy, this rank's parameter-stream end: publisher (the root of the
    #                             policy's trainers; in serial mode read in place), subscriber (policy holders)
    #                             or None
    preempt_requested: Callable[[], bool] = lambda: False
    heartbeat: Callable[[], None] = lambda: None
    member_label: str = ""  # a population member's name (' member03'; launch/population.py), for its lines
    member_takes_turns: bool = False  # a packed member's turn (launch/packed.py): its stop is no preemption to say
    league: bool = False  # a league member: its pool's slots come from the population root (workers/league.py)

    @property
    def groups(self) -> int:
        return self.sizes.env_groups


@dataclass
class Hooks:
    """What the launch lends the workers: whether a signal asked for a preemption, and the
    watchdog's heartbeat."""

    preempt_requested: Callable[[], bool] = lambda: False
    heartbeat: Callable[[], None] = lambda: None


def build_workers(s, control: ControlStream, hooks: Hooks) -> list:
    """This rank's workers, connected by the streams the algorithm declares (a sample and a
    parameter stream per policy). Collective over the run's world. `s`: what the start-up phases
    found (launch/startup.py `StartUp`, not imported: it imports this module); its sizes are handed
    to every worker. A league member's weights messages carry its slots."""
    cfg, layout, rank = s.cfg, s.layout, s.rank
    algorithm, league = ALGORITHMS[cfg.algo.name], bool(s.member.league)
    w = Wiring(cfg, s.spaces, layout, s.sizes, s.world, rank, s.start, algorithm, parts_of(cfg), control,
               [weights_spec(n, league) for n in s.num_params], policy_spaces=policy_spaces(s.spaces, cfg.policies),
               preempt_requested=hooks.preempt_requested, heartbeat=hooks.heartbeat, member_label=s.member.label,
               member_takes_turns=s.member.takes_turns, league=league)
    # MPI: the trainers' communicator (Horovod among them), then each declared stream's own communicator
    learner = rank in set(layout.learners.tolist())
    w.trainer_comm = comm.sub_communicator(w.world, learner)
    # the trainers of this rank's policy: its normalisers' moments are summed over them
    w.policy_comm = w.trainer_comm.Split(layout.policy_of_learner(rank), rank) if learner else None
    if algorithm.stream(INFERENCE) is not None:
        w.inference = InferenceStream(comm.stream_communicator(w.world), *inference_messages(cfg, w.spaces, w.groups))
    if algorithm.stream(SAMPLE) is not None:
        w.sample = [SampleStream(comm.stream_communicator(w.world), algorithm.record(cfg, seen))
                    for seen in w.policy_spaces]
    if algorithm.stream(PARAMETER) is not None:
        # serial mode: the inline policy reads the publisher's newest version in place
        w.params = ([ParameterPublisher(None, w.weights[0])] if layout.serial else
                    [build_parameter_stream(w.world, rank, int(layout.learners_of_policy(p)[0]),
                                            layout.weight_subscribers(), layout.node_of_rank, w.weights[p])
                     for p in range(layout.policies)])
    if holds_a_policy(layout, rank):
        import torch  # remote-inference actors never import torch
        torch.set_num_threads(cfg.run.torch_threads)
    workers = [w.parts.worker(role).build(w) for role in layout.roles_of(rank)]
    return _link_serial(workers) if layout.serial else workers


def holds_a_policy(layout: Layout, rank: int) -> bool:
    """Whether `rank` runs a network (and so imports torch): learners, policy servers, and actors
    with inline inference; never an actor whose policy lives on an inference rank."""
    return any(role != "env" or layout.inline_inference for role in layout.roles_of(rank))


def _link_serial(workers: list) -> list:
    """Serial mode: the actor polls first, then the trainer, so a checkpoint (taken in the
    trainer's turn) ends a pass, and a resumed run's first pass is the one the uninterrupted run
    goes on with. Where the actor's state can be saved (sync mode; DQN's, SAC's and TD3's
    transitions), the trainer's checkpoints carry it, for exact resumes; with a replay ratio the
    actor waits while the trainer owes updates, so every update finds it between records."""
    trainer, actor = workers
    if actor.writer.serial_parts() is not None:
        trainer.keep_local_actor(actor)
        actor.hold = trainer.source.owes_updates
    return [actor, trainer]
