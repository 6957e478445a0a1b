"""The learner root's progress line: the share of run.total_frames done, the speed, and the time
left at that speed; the first update's line at once (issue 46, item 11: the first line came after
about 5 s, with neither a percentage nor an ETA)."""

from hpcrl.core.config import RunConfig
from hpcrl.core.say import duration
from hpcrl.io.learner_outputs import LearnerOutputs, progress_of
from hpcrl.io.rundir import RunStart


def test_the_progress_names_the_share_of_the_budget_and_the_time_left():
    assert progress_of(23_040, 50_000, 3_857.2) == " 46% |    3,857 fps | ETA 7s"
    assert progress_of(50_000, 50_000, 100.0) == "100% |      100 fps"  # nothing left: no ETA
    assert progress_of(0, 10**9, 0.0) == "  0% |        0 fps"  # no speed yet: no ETA
    assert [duration(s) for s in (0, 42, 185, 3_720, 90_000)] == ["0s", "42s", "3m05s", "1h02m", "1d01h"]


def test_the_first_update_prints_its_line_at_once_then_every_interval(tmp_path, capsys):
    run = RunConfig(log_interval_s=3600.0, checkpoint_interval_s=3600.0, tensorboard=False, total_frames=1_000)
    outputs = LearnerOutputs(RunStart(run_dir=str(tmp_path), config_text="{}"), run, progress="loss {loss:.2f}")
    row = {"frames": 100, "return_window_mean": 9.5, "policy_version": 1, "loss": 0.25}
    outputs.report(dict(row), 0, save=lambda path: None, checkpoint=False)
    outputs.report(dict(row, frames=200, policy_version=2), 0, save=lambda path: None, checkpoint=False)
    outputs.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[hpcrl] frames        100  10% | ") and "| ETA " in lines[0]
    assert lines[0].endswith("| return     9.5 | version     1 | loss 0.25")
