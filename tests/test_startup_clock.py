"""The start-up clock (core/startup.py): marks in seconds since exec, each phase once, printed once."""

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
