"""status.json: how a run is going or how it ended, read back as data (bounded, JSON only, never
through a link); the first failure stays. The runs that write it: tests/test_failures.py (a rank
that raises), tests/test_run_tools.py (one that finished), tests/test_resume.py (a preempted one)."""
import os

from hpcrl.io import run_status


def test_states_round_trip_and_the_first_failure_stays(tmp_path):
    run_status.write(str(tmp_path), "running", ranks=4)
    assert run_status.read(str(tmp_path))["ranks"] == 4
    assert run_status.describe(run_status.read(str(tmp_path))).startswith("running since ")
    run_status.write(str(tmp_path), "failed", rank=3, doing="env: stepping envs", error="RuntimeError: boom")
    run_status.write(str(tmp_path), "failed", rank=1, doing="inference", error="MPI: the abort")  # taken down
    record = run_status.read(str(tmp_path))
    assert run_status.describe(record) == (f"FAILED at {record['time']}: rank 3 (env: stepping envs), "
                                           f"RuntimeError: boom")
    run_status.write(str(tmp_path), "done")  # a resumed run that finished
    assert run_status.read(str(tmp_path))["state"] == "done"
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temporary left


def test_what_is_not_a_status_reads_as_none(tmp_path):
    path = tmp_path / "status.json"
    for text in ("{", "[1]", '{"state": "exploded"}', '{"state": "done"}' + " " * 70_000):
        path.write_text(text)
        assert run_status.read(str(tmp_path)) is None, text
    path.unlink()
    (tmp_path / "elsewhere.json").write_text('{"state": "done"}')
    os.symlink(tmp_path / "elsewhere.json", path)
    assert run_status.read(str(tmp_path)) is None  # a link: not read
    path.unlink()
    assert run_status.read(str(tmp_path)) is None
