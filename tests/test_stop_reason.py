"""One vocabulary for why a run stops (core/stop.py): the trainers' verdict, the stop word's
flags, the checkpoint's stopped_by, inspect's words and the exit status agree."""
from hpcrl.core.messages import STOP
from hpcrl.core.stop import EXIT_OUTPUT_FAILED, EXIT_PREEMPTED, StopReason


def test_every_reason_survives_the_stop_word_with_its_exit_status():
    for reason in StopReason:
        heard = StopReason.from_flags(reason.flags)  # what every other rank makes of the word
        assert heard.exit_status == reason.exit_status, reason
        assert bool(reason.flags & STOP) == (reason is not StopReason.GOING_ON)
        assert StopReason.from_text(reason.text) is reason  # the checkpoint's counter reads back
    assert StopReason.PREEMPTED.exit_status == EXIT_PREEMPTED == 3
    assert StopReason.OUTPUT_FAILED.exit_status == EXIT_OUTPUT_FAILED == 4
    assert StopReason.TOTAL_FRAMES.exit_status == StopReason.TARGET_RETURN.exit_status == 0


def test_the_texts_are_the_counters_checkpoints_already_hold():
    assert [r.text for r in StopReason] == ["", "total_frames", "target_return", "preempted", "output_failed"]
    assert StopReason.from_text("something else") is None
    assert StopReason.PREEMPTED.description.startswith("preempted: a checkpoint was written")
