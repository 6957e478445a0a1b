"""environment.yml (conda, for clusters) and pyproject.toml (pip) name the same packages."""
import re
import tomllib

import yaml

from tests.conftest import REPO

CONDA_TO_PIP = {"pytorch": "torch", "matplotlib-base": "matplotlib"}  # conda-forge's matplotlib without Qt
BUILD_ONLY = {"python", "pip", "openmpi", "cmake", "cxx-compiler"}  # conda brings what pip cannot


def name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[]", requirement.strip(), maxsplit=1)[0].lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pip_names = {name(r) for r in project["dependencies"]} | {
        name(r) for r in project["optional-dependencies"]["test"]}
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    conda_names = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            conda_names |= {name(r) for r in dep["pip"] if not r.startswith("-e")}
        else:
            conda_names.add(CONDA_TO_PIP.get(name(dep), name(dep)))
    assert conda_names - BUILD_ONLY == pip_names
