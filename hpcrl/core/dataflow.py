"""An algorithm's dataflow, declared as data: the workers it needs, the streams that join them,
the record layout its samples travel in, and where its trainer step and batch source live.

The wiring (`hpcrl.runtime.launch.build_workers`) reads the declaration and builds exactly the
streams it names; the layout (ranks per role, per node, devices) comes from the config alone and
never changes an algorithm. PPO and APPO are one algorithm in two modes; Ape-X DQN and MAPPO are
meant to be further entries here (a replay worker, transition records, an agent axis), not new
wiring. Pure: numpy and the message layouts only (every rank and `hpcrl plan` read this).
Trainer steps and batch sources are named by import path, so actors never import torch.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from hpcrl.core.messages import MessageSpec, fragment_spec, reply_spec, request_spec

# The four stream kinds (runtime/): each has its own duplicated communicator.
INFERENCE = "inference"  # request/reply slots between actors and a batching policy server
SAMPLE = "sample"        # many-to-one records, credit flow control (runtime/streams.py)
PARAMETER = "parameter"  # newest-only, hierarchical weights (runtime/params.py)
CONTROL = "control"      # the run's stop word, independent of the weights (runtime/control.py)
STREAM_KINDS = (INFERENCE, SAMPLE, PARAMETER, CONTROL)


@dataclass(frozen=True)
class Stream:
    """One stream of the dataflow: `kind`, from the workers of role `source` to those of `sink`.
    `record` names the layout a sample stream carries."""

    kind: str
    source: str
    sink: str
    record: str = ""


@dataclass(frozen=True)
class Algorithm:
    """What an algorithm needs from the runtime. `record(cfg, spaces)` gives the sample-stream
    record layout; `batch_source` and `step` are 'module:Name' import paths, loaded on trainers."""

    name: str
    modes: tuple[str, ...]
    workers: tuple[str, ...]
    streams: tuple[Stream, ...]
    record: Callable[..., MessageSpec]
    batch_source: str
    step: str
    doc: str

    def stream(self, kind: str) -> Stream | None:
        return next((s for s in self.streams if s.kind == kind), None)

    def load(self, what: str):
        """The trainer step's or the batch source's class (imported on trainer ranks only)."""
        module, name = getattr(self, what).split(":")
        return getattr(importlib.import_module(module), name)


def inference_messages(cfg, spaces, groups: int) -> tuple[MessageSpec, MessageSpec]:
    """The inference stream's request and reply layouts: one channel per env group, so each
    carries num_envs / groups envs (core/messages.py)."""
    n = cfg.env.num_envs // groups
    return (request_spec(n, spaces.obs_shape, spaces.obs_dtype),
            reply_spec(n, spaces.action_shape, spaces.action_dtype))


def fragment_record(cfg, spaces) -> MessageSpec:
    """PPO/APPO's record: a fragment of T steps x N envs (core/messages.py)."""
    return fragment_spec(cfg.algo.rollout_length, cfg.env.num_envs, spaces.obs_shape, spaces.obs_dtype,
                         spaces.action_shape, spaces.action_dtype)


PPO = Algorithm(
    name="ppo",
    modes=("sync", "async"),
    workers=("learner", "inference", "env"),
    streams=(
        # actors ask a policy server (or, with inference ranks: 0, their inline policy) for actions
        Stream(INFERENCE, source="env", sink="inference"),
        # actors ship fragments to their trainer; it grants credits
        Stream(SAMPLE, source="env", sink="learner", record="fragment"),
        # the trainer root publishes each policy version to the policy holders
        Stream(PARAMETER, source="learner", sink="inference"),
        # the trainer root (the controller) stops every rank
        Stream(CONTROL, source="learner", sink="*"),
    ),
    record=fragment_record,
    batch_source="hpcrl.workers.batch_source:FragmentQueue",
    step="hpcrl.algos.ppo:PPOStep",
    doc="PPO (mode sync: GAE, on-policy batches) and APPO (mode async: V-trace, the newest weights)",
)

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (PPO,)}
