"""The start-up clock (core/startup.py): marks in seconds since exec, each phase once, printed once;
and the working directory on the import path at the cost of one listing."""

import math
import os
import subprocess
import sys

import pytest

from hpcrl.core.startup import FIRST_WORK, MARKS, StartupClock
from tests.conftest import REPO


def test_phases_are_the_gaps_between_marks_in_order(monkeypatch):
    clock = StartupClock()
    now = iter([1.0, 1.5, 3.0])
    monkeypatch.setattr("hpcrl.core.startup._now", lambda: clock.created + next(now))
    clock.mark("interpreter")
    clock.mark("mpi_init")
    clock.mark("interpreter")  # a phase ends once: a repeat changes nothing
    clock.mark("imports")
    assert clock.phases() == [("interpreter", 1.0), ("mpi_init", 0.5), ("imports", 1.5)]
    row = clock.row()
    assert row[:3] == [1.0, 1.5, 3.0] and all(math.isnan(x) for x in row[3:]) and len(row) == len(MARKS)


def test_an_unknown_mark_is_refused():
    with pytest.raises(ValueError, match="unknown start-up mark 'startup'"):
        StartupClock().mark("startup")


def test_verbose_prints_once_when_every_role_did_its_first_work(capsys):
    clock = StartupClock()
    clock.verbose = True
    clock.set_roles("rank 0 (learner/env)", ("learner", "env"))
    clock.mark("roles")
    clock.mark(FIRST_WORK["env"])
    assert capsys.readouterr().out == ""  # the learner has not updated yet
    clock.mark(FIRST_WORK["learner"])
    clock.mark(FIRST_WORK["learner"])
    out = capsys.readouterr().out
    assert out.count("[hpcrl] start-up of rank 0 (learner/env): ") == 1
    assert "roles " in out and "first_update " in out and "after exec" in out


def test_marks_count_from_the_exec_of_the_process():
    """A fresh interpreter that sleeps 0.3 s before its first mark: the mark holds the
    interpreter's start and the sleep (the clock counts from the exec, not from its import)."""
    code = ("import time; time.sleep(0.3); from hpcrl.core.startup import StartupClock; c = StartupClock(); "
            "c.mark('interpreter'); print(c.marks['interpreter'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert 0.3 <= float(out.stdout) < 60


HPCRL_ENTRY = "from hpcrl.core.startup import find_modules_in_working_directory\nfind_modules_in_working_directory()"
PYTHONS_OWN = "import os, sys\nsys.path.append(os.getcwd())"


def working_directory_calls(cwd, misses: int, append: str = HPCRL_ENTRY) -> list[str]:
    """The system calls naming `cwd` of a `python -P` (a staged rank's start) that puts it on the
    import path (`append`: as hpcrl's entry does), fails `misses` imports, then imports a module
    from it."""
    code = "\n".join([append,
                      *(f"try:\n    import missing_{i}\nexcept ImportError:\n    pass" for i in range(misses)),
                      "import my_envs", "print(my_envs.X)"])
    trace = cwd.parent / f"trace{misses}{len(append)}"
    done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=%file,getdents64", "-o", str(trace), sys.executable,
                           "-P", "-c", code], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "7\n", done.stderr
    return [line for line in trace.read_text().splitlines() if str(cwd) in line]


def test_the_working_directory_is_listed_once_not_looked_up_by_every_import_that_misses(tmp_path):
    """Appended to the import path, the working directory (on a cluster, the shared file system)
    is listed once; imports found nowhere cost it nothing more (Python's own finder stats it for
    each), and a module there is still found."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    (cwd / "my_envs.py").write_text("X = 7\n")
    none, many = working_directory_calls(cwd, 0), working_directory_calls(cwd, 40)
    assert len(many) == len(none) <= 8, many  # its listing; my_envs' lookup and load
    assert len(working_directory_calls(cwd, 40, PYTHONS_OWN)) >= len(none) + 40  # a stat of it per miss
