"""environment.yml (conda, for clusters) and pyproject.toml (pip) name the same packages; the
benchmarks' baseline (Stable-Baselines3) is an extra that hpcrl itself never imports."""
import ast
import importlib.util
import re
import subprocess
import sys
import tomllib

import pytest
import yaml

from tests.conftest import REPO

CONDA_TO_PIP = {"pytorch": "torch", "matplotlib-base": "matplotlib"}  # conda-forge's matplotlib without Qt
BUILD_ONLY = {"python", "pip", "openmpi", "cmake", "cxx-compiler"}  # conda brings what pip cannot


def name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[]", requirement.strip(), maxsplit=1)[0].lower()


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def pip_section() -> list[str]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    return next(dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict))


def test_environment_yml_matches_pyproject():
    pip_names = {name(r) for r in project()["dependencies"]} | {
        name(r) for r in project()["optional-dependencies"]["test"]}
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    conda_names = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            conda_names |= {name(r) for r in dep["pip"] if not r.startswith("-e")}
        else:
            conda_names.add(CONDA_TO_PIP.get(name(dep), name(dep)))
    assert conda_names - BUILD_ONLY == pip_names


def test_environment_yml_installs_hpcrl_with_every_extra():
    editable = [r for r in pip_section() if r.startswith("-e")]
    assert len(editable) == 1, editable
    match = re.fullmatch(r"-e \.\[([\w,-]+)\]", editable[0].strip())
    assert match, f"expected '-e .[extra,...]', got {editable[0]!r}"
    assert set(match.group(1).split(",")) == set(project()["optional-dependencies"])


def test_env_family_and_bench_extras_are_declared():
    extras = {key: {name(r) for r in reqs} for key, reqs in project()["optional-dependencies"].items()}
    assert extras["atari"] == {"ale-py"}
    assert extras["mujoco"] == {"mujoco", "imageio"}
    assert extras["box2d"] == {"box2d", "pygame-ce"}  # the pygame mpe2 needs: one distribution of the module
    assert extras["envpool"] == {"envpool"}
    assert extras["wandb"] == {"wandb"}  # run.wandb, imported only by io/wandb_log.py where a project is named
    assert extras["multiagent"] == {"pettingzoo", "mpe2", "openskill"}  # openskill: ratings against anchors
    assert project()["optional-dependencies"]["bench"] == ["stable-baselines3==2.9.2"]


def test_hpcrl_never_imports_stable_baselines3():
    assert "stable-baselines3" not in {name(r) for r in project()["dependencies"]}
    importers = []
    for path in sorted((REPO / "hpcrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(m.split(".")[0] == "stable_baselines3" for m in modules):
                importers.append(str(path.relative_to(REPO)))
    assert importers == []


def test_only_the_learners_rating_module_imports_openskill():
    """Env ranks and policy servers of self-play runs never load the rating library."""
    assert importers("openskill") == ["workers/ratings.py"]


def imports_of(path) -> set[str]:
    """Top-level names of every module a file imports (at any depth, lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module or "")
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def importers(module: str) -> list[str]:
    return sorted(str(p.relative_to(REPO / "hpcrl")) for p in (REPO / "hpcrl").rglob("*.py")
                  if any(m == module or m.startswith(module + ".") for m in imports_of(p)))


def test_only_the_runtime_imports_mpi4py():
    assert all(path.startswith("runtime/") for path in importers("mpi4py")), importers("mpi4py")


def test_only_the_trainers_averaging_imports_horovod():
    assert importers("horovod") == ["workers/averaging.py"]


def test_eval_holds_its_policies_without_mpi_or_horovod():
    """`hpcrl eval` runs in one process, without mpirun: the policy holders' code it plays through
    (workers/policy_holder.py) imports no transport."""
    code = ("import sys; import hpcrl.tools.cli, hpcrl.tools.evaluate, hpcrl.workers.policy_holder; "
            "loaded = sorted(m for m in ('mpi4py', 'horovod') if m in sys.modules); assert not loaded, loaded")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr


def test_every_hpcrl_line_goes_through_say():
    """One writer for the "[hpcrl] ..." lines (core/say.py writes each whole): no print of its own."""
    found = []
    for path in sorted((REPO / "hpcrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print" \
                    and node.args and "[hpcrl" in ast.unparse(node.args[0])[:12]:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found


def loaded_by(*args) -> set[str]:
    """The top-level packages `python -X importtime -m hpcrl ARGS` imports (every module it loads)."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "hpcrl", *map(str, args)],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    return {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines()
            if line.startswith("import time:")}


@pytest.mark.parametrize("command", ["plan", "plan-league", "inspect", "plot"])
def test_plan_inspect_and_plot_load_neither_mpi_nor_torch(command, tmp_path):
    """These run on a login node or a laptop: initialising MPI (mpi4py's import does) may fail or be
    forbidden there, and torch costs seconds. What each command loads holds none of mpi4py, horovod
    and torch: plan counts the policy in core/network_shapes.py, inspect and plot read HDF5 and the
    config."""
    from tests.test_untrusted_run_dirs import handed_run  # a run directory: config, metrics, checkpoint
    run = tmp_path / "run"
    args = {"plan": ("plan", "jobs/cartpole_pbt.yaml", "--world-size", 64, "--ranks-per-node", 8),
            "plan-league": ("plan", "jobs/connect_four_league.yaml", "--world-size", 66, "--ranks-per-node", 11),
            "inspect": ("inspect", run), "plot": ("plot", run, "-o", tmp_path / "curves.png")}[command]
    if command in ("inspect", "plot"):
        handed_run(run)
    loaded = loaded_by(*args)
    heavy = sorted(loaded & {"mpi4py", "horovod", "torch"})
    assert "hpcrl" in loaded and not heavy, heavy


def test_the_core_is_pure_and_envs_need_neither_mpi_nor_torch():
    """core/: numpy and yaml only (every rank and hpcrl plan use it); envs/: no MPI, no torch
    (actors with remote inference step them without either)."""
    for path in (REPO / "hpcrl" / "core").rglob("*.py"):
        outside = {m.split(".")[0] for m in imports_of(path)} - {"numpy", "yaml", "hpcrl", "__future__"}
        assert not {m for m in outside if m not in __import__("sys").stdlib_module_names}, (path, outside)
        assert not {m for m in imports_of(path) if m.startswith("hpcrl.") and not m.startswith("hpcrl.core")}, path
    for path in (REPO / "hpcrl" / "envs").rglob("*.py"):
        assert not {m.split(".")[0] for m in imports_of(path)} & {"torch", "mpi4py", "horovod"}, path


def test_every_hpcrl_name_the_benchmarks_import_exists():
    """bench/ runs outside the suite: a name moved in the package must not break a benchmark
    unseen (bench/update.py imported start_horovod from the trainer after it had moved)."""
    missing = []
    for path in sorted((REPO / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("hpcrl"):
                module = importlib.import_module(node.module)
                missing += [f"{path.name}:{node.lineno}: {node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name) and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert not missing, missing


def test_the_code_says_what_is_not_how_it_came_to_be():
    """Docstrings and comments describe the code as it is: no issue numbers, no "before issue N"
    (history lives in git and in the job READMEs)."""
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}" for path in sorted((REPO / "hpcrl").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bissues? \d+", line, re.IGNORECASE)]
    assert not found, "history in the code:\n" + "\n".join(found)
