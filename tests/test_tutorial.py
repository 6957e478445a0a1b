"""docs/tutorial.md as a newcomer follows it: its commands run as the page gives them, and what it
shows is what they print.

The page marks what this module reads with an HTML comment (invisible on the site and on a code
host) on the line before a fenced block:

- `<!-- tutorial: file PATH -->`: the block is the whole text of PATH, a file of the repository;
- `<!-- tutorial: run -->`: the block's `$ ` lines are commands, run in page order; the lines after
  each are its output as the page shows it, shortened with `...` lines.

The commands run in a temporary directory holding the tutorial's files (jobs/tutorial/), so the
run directory, the plot and the video land there; `bash scripts/mpirun.sh -n N .venv/bin/python
-m hpcrl ARGS` becomes conftest's `mpirun(N, ARGS)` and `.venv/bin/hpcrl ARGS` its `run_hpcrl`.
Every output line the page shows must be one the command printed, its numbers aside (speeds,
times and returns vary from run to run)."""
from __future__ import annotations

import re
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO, mpirun, run_hpcrl

PAGE = REPO / "docs" / "tutorial.md"
MARKED_BLOCK = re.compile(r"^<!-- tutorial: (run|file (\S+)) -->\n(?:[ \t]*\n)*(`{3,})[^\n]*\n(.*?)^\3[ \t]*$",
                          re.M | re.S)
MPIRUN_PREFIX = ["bash", "scripts/mpirun.sh", "-n"]
PYTHON_M_HPCRL = [".venv/bin/python", "-m", "hpcrl"]
NUMBER = re.compile(r"-?\d[\d,.:]*(?:[hm]\d+)*s?")  # 1,091 -0.5 03:21:00; durations: 5s 1m02s


@dataclass
class Command:
    line: str
    shown: list[str] = field(default_factory=list)  # the output lines the page shows ("..." lines left out)


def marked_blocks(text: str) -> list[tuple[str, str | None, str]]:
    """(kind, path, body) of every marked block, in page order: kind 'run' or 'file'."""
    return [("run" if kind == "run" else "file", path, body) for kind, path, _, body in MARKED_BLOCK.findall(text)]


def commands(text: str) -> list[Command]:
    """The `$ ` commands of the page's run blocks, in order, each with the output shown after it."""
    found: list[Command] = []
    for kind, _, body in marked_blocks(text):
        if kind != "run":
            continue
        lines = body.splitlines()
        assert lines and lines[0].startswith("$ "), f"a run block must open with a `$ ` command: {lines[:1]}"
        for line in lines:
            if line.startswith("$ "):
                found.append(Command(line[2:]))
            elif line.strip() != "...":
                found[-1].shown.append(line)
    return found


def launch(line: str, cwd: Path):
    """Run a page command the way the page gives it, through conftest's helpers."""
    args = shlex.split(line)
    if args[:3] == MPIRUN_PREFIX and args[4:7] == PYTHON_M_HPCRL:
        return mpirun(int(args[3]), *args[7:], cwd=cwd, timeout=120)
    if args[0] == ".venv/bin/hpcrl":
        return run_hpcrl(*args[1:], cwd=cwd, timeout=60)
    raise AssertionError(f"docs/tutorial.md: a command this test cannot run as written: {line}")


def normalised(line: str) -> str:
    """A line with every number as '#' and its spaces collapsed: what stays from run to run."""
    return " ".join(NUMBER.sub("#", line).split())


def test_the_page_shows_the_tutorial_files_as_they_are():
    """The env module and the config are shipped files; the page shows each whole, so that what a
    reader copies is what the commands run."""
    shown = {path: body for kind, path, body in marked_blocks(PAGE.read_text(encoding="utf-8")) if kind == "file"}
    assert set(shown) == {"jobs/tutorial/gridworld.py", "jobs/tutorial/gridworld.yaml"}
    for path, body in shown.items():
        assert body == (REPO / path).read_text(encoding="utf-8"), f"docs/tutorial.md shows {path} other than it is"


def test_the_page_runs_every_step_in_order():
    """The run blocks are the tutorial's steps: a launch, inspect, plot, eval, a resume, plan and a
    launch on another layout, and no command the test could not run."""
    steps = [c.line for c in commands(PAGE.read_text(encoding="utf-8"))]
    assert [shlex.split(s)[7 if s.startswith("bash") else 1] for s in steps] == \
        ["run", "inspect", "plot", "eval", "run", "plan", "run"]
    assert [shlex.split(s)[3] for s in steps if s.startswith("bash")] == ["4", "4", "6"]


def test_the_tutorial_runs_as_written(tmp_path):
    """Every command of the page, in a temporary directory: a 4-rank run with its metrics and
    checkpoint, inspect naming it, the plot, eval's returns and video, a resume that says so, and
    the same run going on on 6 ranks."""
    shutil.copytree(REPO / "jobs" / "tutorial", tmp_path / "jobs" / "tutorial",
                    ignore=shutil.ignore_patterns("__pycache__"))
    run_dir = tmp_path / "runs" / "gridworld"
    launches = 0
    for command in commands(PAGE.read_text(encoding="utf-8")):
        started = time.monotonic()
        result = launch(command.line, tmp_path)
        out = result.stdout + result.stderr
        seconds = time.monotonic() - started
        assert result.returncode == 0, f"$ {command.line}\n{out}"
        printed = {normalised(line) for line in out.splitlines()}
        missing = [line for line in command.shown if normalised(line) not in printed]
        assert not missing, f"$ {command.line}\nshown on the page, not printed ({seconds:.1f} s):\n" + \
            "\n".join(missing) + f"\n--- printed:\n{out}"

        args = shlex.split(command.line)
        verb = args[7] if args[0] == "bash" else args[1]
        if verb == "run":
            launches += 1
            assert "[hpcrl] done: runs/gridworld" in out
            assert (run_dir / "metrics.h5").stat().st_size > 0 and (run_dir / "checkpoint.h5").stat().st_size > 0
            if launches > 1:  # the resume, then the new layout: the same run goes on
                assert "[hpcrl] resuming from runs/gridworld/checkpoint.h5" in out
            if args[3] == "6":
                assert "[hpcrl] 6 ranks on 1 node: 1 learner, 1 inference, 4 env x 4" in out
        elif verb == "inspect":
            assert result.stdout.startswith("run          runs/gridworld\n")
        elif verb == "plot":
            assert (tmp_path / args[args.index("-o") + 1]).stat().st_size > 10_000
        elif verb == "eval":
            assert re.search(r"^return -?\d+\.\d\d \+- \d+\.\d\d", result.stdout, re.M), result.stdout
            video = tmp_path / args[args.index("--video") + 1]
            frames = int(re.search(rf"wrote {video.name}: (\d+) frames", result.stdout).group(1))
            assert frames > 10 and video.stat().st_size > 1_000
    assert launches == 3
