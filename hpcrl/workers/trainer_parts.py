"""What a learner (workers/trainer.py) is built from and the parts its checkpoints keep besides its
step and statistics: its links and settings, a population member's live hyperparameters, and a
serial run's actor. Each part has `state()` and `restore()` (core/contracts.py Part).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hpcrl.core.contracts import BatchSource
from hpcrl.core.say import say
from hpcrl.envs.state import NotCapturable
from hpcrl.io.learner_outputs import LearnerOutputs
from hpcrl.runtime.control import ControlStream
from hpcrl.runtime.params import ParameterPublisher
from hpcrl.workers.evaluator import Evaluator


@dataclass
class LearnerLinks:
    """What a learner is connected to: the trainers' communicator (statistics, the stop decision)
    and its policy's (a run of one policy: None, the same), its batch source, the parameter
    publisher (its policy's first learner only), the run files and the evaluator (run.eval; the
    learner root only) and the control stream (the root sends the stop word on it)."""

    trainer_comm: object
    policy_comm: object
    source: BatchSource
    publisher: ParameterPublisher | None
    files: LearnerOutputs | None
    control: ControlStream
    evaluator: Evaluator | None = None


@dataclass
class LearnerSettings:
    """A learner's place and duties. `policy`: the policy it trains (core/policies.py).
    `batch_share`: its fraction of the global batch times the number of trainers (1.0 when every
    trainer's batch is as large as the others'; core/sizing.py LearnerSizes.batch_share), so
    unequal batches average to the mean over all samples. `run_dir`: where the batch source saves
    what it holds with a checkpoint. `resume_path`: the checkpoint to continue from (every trainer
    is told; the root reads it). `live`: on every learner of a population member, the algo keys a
    copy may change, which checkpoints keep. `keeps_env_state`: the env ranks write their state
    where checkpoints fall (a sync run of several ranks with run.deterministic). `preempt_requested`:
    polled by the root after every update; True stops the run with a checkpoint, marked preempted.
    `heartbeat`: called per minibatch, so a long update counts as work, not a hang."""

    policy: int = 0
    batch_share: float = 1.0
    run_dir: str = "."
    resume_path: str | None = None
    live: tuple[str, ...] = ()
    keeps_env_state: bool = False
    preempt_requested: Callable[[], bool] = lambda: False
    heartbeat: Callable[[], None] = lambda: None


class LiveValues:
    """A population member's live algo keys (`live`), as its copies and explore left them: a part
    of its learners' checkpoints (the part 'hyperparameters'), so a resume trains on with them."""

    def __init__(self, algo, live: tuple[str, ...]):
        self.algo, self.live = algo, live

    def state(self) -> dict[str, float]:
        return {k: float(getattr(self.algo, k)) for k in self.live}

    def restore(self, state: dict) -> None:
        for key, value in state.items():
            if key in self.live:
                setattr(self.algo, key, float(value))


class SerialActor:
    """Serial mode: the actor in this process, as a part of its trainer's checkpoints (the part
    'env'), for an exact continuation. None where it is mid-record (a population's preemption stops
    a member wherever it finds it) or its env cannot be saved as data (said once)."""

    def __init__(self, actor, env_id: str):
        self.actor, self.env_id, self.warned = actor, env_id, False

    def state(self):
        if not self.actor.between_records():
            return None
        try:
            return self.actor.snapshot()
        except NotCapturable as exc:
            if not self.warned:
                say(f"warning: the state of {self.env_id} cannot be saved as data ({exc}); "
                    f"checkpoints hold no env state, so a resumed serial run starts new episodes")
                self.warned = True
            return None

    def restore(self, state) -> None:
        self.actor.restore(state)
