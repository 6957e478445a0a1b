"""Where the parts an algorithm names live: the one binding of core/dataflow.py's names to classes.

An `Algorithm` (core/) says which record writer, batch source and trainer step it uses by name;
this module, above the workers, maps those names to 'module:Class' paths and imports a class only
when a rank asks for it. So core/ names nothing above it, actors with remote inference never
import torch (the trainer step's module), and a new algorithm adds its classes here and its
facts there.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from hpcrl.core.dataflow import ALGORITHMS, Algorithm

# The roles' worker classes, which every algorithm shares: its record writer and its trainer
# step make the difference.
WORKERS = {
    "learner": "hpcrl.workers.trainer:LearnerRole",
    "inference": "hpcrl.workers.policy_server:InferenceRole",
    "env": "hpcrl.workers.env_rank:EnvRank",
}
# The env ranks' record writers (strategies of EnvRank), by the records they write.
RECORD_WRITERS = {
    "fragments": "hpcrl.workers.fragment_writer:FragmentWriter",  # PPO, APPO, MAPPO, IPPO
    "transitions": "hpcrl.workers.transition_writer:TransitionWriter",  # Ape-X DQN
    "sequences": "hpcrl.workers.sequence_writer:SequenceWriter",  # R2D2 (DQN with model.core)
    "actions": "hpcrl.workers.action_writer:ActionWriter",  # SAC, TD3
    "teams": "hpcrl.workers.team_writer:TeamWriter",  # VDN, QMIX
}
# The learners' batch sources, by the records they take.
BATCH_SOURCES = {
    "fragments": "hpcrl.workers.batch_source:FragmentQueue",  # on-policy batches of whole fragments
    "replay": "hpcrl.workers.replay_source:ReplaySource",  # a prioritized replay shard
}
# The trainer steps (a loss and its optimizer step), imported on trainer ranks only.
STEPS = {
    "ppo": "hpcrl.algos.ppo:PPOStep",
    "dqn": "hpcrl.algos.dqn:DQNStep",
    "sac": "hpcrl.algos.sac:SACStep",
    "td3": "hpcrl.algos.sac:TD3Step",
    "team": "hpcrl.algos.team:TeamStep",
}


def imported(path: str):
    """The object a 'module:Name' path names, its module imported now."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Parts:
    """An algorithm's classes, each imported on first use (on the ranks that use it)."""

    algorithm: Algorithm

    def worker(self, role: str) -> type:
        return imported(WORKERS[role])

    def writer(self, cfg) -> type:
        """The env rank's record writer for `cfg` (imported on env ranks only)."""
        return imported(RECORD_WRITERS[self.algorithm.writer(cfg)])

    def batch_source(self) -> type:
        return imported(BATCH_SOURCES[self.algorithm.batch_source])

    def step(self) -> type:
        return imported(STEPS[self.algorithm.step])


def parts_of(cfg) -> Parts:
    """The parts of `cfg`'s algorithm (a validated config names one of ALGORITHMS)."""
    return Parts(ALGORITHMS[cfg.algo.name])
