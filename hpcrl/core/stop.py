"""Why a run stops, in one vocabulary: the learner root's verdict after an update (broadcast to
the trainers as an int), the control stream's stop word (its flags bits), the checkpoint's
`stopped_by` counter, what `hpcrl inspect` says about it, and the exit status every rank returns
(README, "Exit statuses")."""
from __future__ import annotations

import enum

from hpcrl.core.messages import OUTPUT_FAILED, PREEMPTED, STOP

EXIT_DONE = 0
EXIT_CONFIG_ERROR = 2  # a user mistake found at start-up: one message, nothing written
EXIT_PREEMPTED = 3  # stopped by a signal after writing a checkpoint: resubmit or requeue to go on
EXIT_OUTPUT_FAILED = 4  # an output could not be written (full disk): fix it, then run again to resume


class StopReason(enum.IntEnum):
    """An update's verdict; its value is what the trainers broadcast."""
    GOING_ON = 0
    TOTAL_FRAMES = 1
    TARGET_RETURN = 2
    PREEMPTED = 3
    OUTPUT_FAILED = 4

    @property
    def text(self) -> str:
        """The checkpoint's `stopped_by` counter ('' while the run goes on)."""
        return "" if self is StopReason.GOING_ON else self.name.lower()

    @property
    def flags(self) -> int:
        """The control stream's stop word (0: no word)."""
        return _FLAGS[self]

    @property
    def exit_status(self) -> int:
        return _EXIT_STATUS[self]

    @property
    def description(self) -> str:
        """What a run that stopped this way is, for `hpcrl inspect`."""
        return _DESCRIPTIONS[self]

    @classmethod
    def from_flags(cls, flags: int) -> StopReason:
        """The reason a stop word gives (every rank takes its exit status from it); a plain STOP is
        a finished run, whichever budget ended it."""
        if flags & OUTPUT_FAILED:
            return cls.OUTPUT_FAILED
        if flags & PREEMPTED:
            return cls.PREEMPTED
        return cls.TOTAL_FRAMES if flags & STOP else cls.GOING_ON

    @classmethod
    def from_text(cls, text: str) -> StopReason | None:
        """The reason a checkpoint's `stopped_by` names, or None for a text hpcrl never writes."""
        return next((reason for reason in cls if reason.text == text), None)


_FLAGS = {StopReason.GOING_ON: 0, StopReason.TOTAL_FRAMES: STOP, StopReason.TARGET_RETURN: STOP,
          StopReason.PREEMPTED: STOP | PREEMPTED, StopReason.OUTPUT_FAILED: STOP | OUTPUT_FAILED}
_EXIT_STATUS = {StopReason.GOING_ON: EXIT_DONE, StopReason.TOTAL_FRAMES: EXIT_DONE,
                StopReason.TARGET_RETURN: EXIT_DONE, StopReason.PREEMPTED: EXIT_PREEMPTED,
                StopReason.OUTPUT_FAILED: EXIT_OUTPUT_FAILED}
_DESCRIPTIONS = {
    StopReason.GOING_ON: "",
    StopReason.TOTAL_FRAMES: "finished: it reached run.total_frames",
    StopReason.TARGET_RETURN: "finished: it reached run.target_return",
    StopReason.PREEMPTED: "preempted: a checkpoint was written; run the same command again to resume",
    StopReason.OUTPUT_FAILED: "stopped: an output could not be written (a full disk?); free space, then run the "
                              "same command again to resume from this checkpoint",
}
