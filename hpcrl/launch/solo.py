"""An env rank's actor alone in one process: the algorithm's own actor with an inline policy, and
the receiver of its records, both in this process (real MPI messages to itself). `hpcrl tune`
times an env rank's step with it, and tests drive an actor alone with it and read its records.
It wires parts as launch/wiring.py does, without the streams between ranks.
"""
from __future__ import annotations

from dataclasses import dataclass

from hpcrl.core.config import Config
from hpcrl.core.dataflow import algorithm_of, inference_messages
from hpcrl.core.messages import weights_spec
from hpcrl.launch.registry import parts_of
from hpcrl.runtime import comm
from hpcrl.runtime.params import ParameterPublisher
from hpcrl.runtime.streams import SampleReceiver, SampleSender
from hpcrl.workers.policy_holder import PolicySet
from hpcrl.workers.policy_server import InlinePolicy


@dataclass
class SoloActor:
    actor: object  # an env rank (workers/env_rank.py) with the algorithm's record writer
    receiver: SampleReceiver  # of its records
    model: object  # the network whose weights the inline policy acts with
    publisher: ParameterPublisher  # of those weights: `publish` a new version (sync mode waits for one)

    def publish(self, version: int) -> None:
        from hpcrl.models import copy_params_to
        self.publisher.publish(version, lambda flat: copy_params_to(self.model, flat))

    def records(self, count: int, polls: int, take=lambda record: None, version_due=None) -> int:
        """Step the actor until `count` records arrived or `polls` polls passed; `take(record)` reads
        each before its slot goes back to the actor. `version_due()`: true when sync mode's actor
        waits for the next version (it is published then). The records that arrived."""
        arrived = 0
        for _ in range(polls):
            self.actor.poll()
            for slot in self.receiver.ready():
                take(self.receiver.slots[slot])
                self.receiver.release(slot)
                arrived += 1
            if arrived >= count:
                break
            if version_due is not None and arrived and version_due(self.actor):
                self.publish(arrived)
        return arrived

    def close(self) -> None:
        self.receiver.close()  # cancels the receive of any credit the actor holds
        for group in self.actor.groups:
            group.envs.close()


def solo_actor(cfg: Config, spaces, model=None, sampler_seed: int = 0, receiver_slots: int = 1,
               sender_slots: int = 2) -> SoloActor:
    """An env rank of `cfg` (one env group) whose inline policy acts with `model`'s weights (default:
    a network built from the current torch seed) on the config's env device, drawing its actions
    with key `sampler_seed` (core/seeds.py keyed_uniforms). `receiver_slots`: the records that may
    wait in this process at once."""
    from hpcrl.models import build_policy, make_runner, num_params
    model = build_policy(spaces, cfg) if model is None else model
    publisher = ParameterPublisher(None, weights_spec(num_params(model)))
    runner = make_runner(build_policy(spaces, cfg), cfg.roles.env.device, seed=sampler_seed)
    request, reply = inference_messages(cfg, spaces, groups=1)
    policy = InlinePolicy(PolicySet([runner], [comm.LocalWeightSubscriber(publisher)]), request.allocate(),
                          reply.allocate(), sync=cfg.algo.mode == "sync")
    parts = parts_of(cfg)
    record = algorithm_of(cfg).record(cfg, spaces)
    me, stream = comm.JOB.Get_rank(), comm.stream_communicator(comm.JOB)  # one process: the job's world
    receiver = SampleReceiver(stream, [me], [record.allocate() for _ in range(receiver_slots)],
                              per_sender=receiver_slots)
    actor = parts.worker("env")(
        cfg, me, 0, [policy], [SampleSender(stream, me, [record.allocate() for _ in range(sender_slots)])],
        parts.writer(cfg)(cfg))
    solo = SoloActor(actor, receiver, model, publisher)
    solo.publish(0)
    return solo

