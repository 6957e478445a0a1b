"""The package's layer order, as docs/architecture.md draws it: every `hpcrl.*` import of every
module (function-level imports too: a lazy import is still a dependency of design) goes to a
lower layer, or stays inside the module's own package. test_packaging.py guards the third-party
rules (mpi4py, horovod, torch); this guards hpcrl's own order."""
import ast
import re
from pathlib import Path

from tests.conftest import REPO

# layer of each package; higher layers may import lower ones, never the reverse, and packages of
# one layer do not import each other (siblings stay independent)
LAYERS = {
    "core": 0,  # config, layout, sizing, messages, moments, stop: pure numpy + yaml
    "runtime": 1,  # the transport: comm, streams, params, control, liveness, watchdog, signals, traffic
    "envs": 1,
    "io": 1,
    "algos": 1,
    "models": 2,  # builds on the env spaces
    "workers": 3,
    "launch": 4,  # the launch and the wiring of workers into a topology
    "tools": 5,
    "__main__": 6,
}
# modules that sit in a package directory but belong to another layer: the package's root offers
# the Python API (hpcrl.run, hpcrl.Config...), looked up in tools/api.py only when first used
MODULE_LAYER: dict[str, str] = {"hpcrl": "__main__"}


def layer_of(module: str) -> str:
    if module in MODULE_LAYER:
        return MODULE_LAYER[module]
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__init__":
        return "core"  # hpcrl/__init__.py: the version, nothing imported
    if parts[1] == "_kernels":
        return "core"  # the C kernels (src_ext/): they import nothing
    return parts[1]


def hpcrl_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute hpcrl import in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("hpcrl.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("hpcrl"):
            if node.module == "hpcrl" or node.module.count(".") == 1 and node.module.split(".")[1] in LAYERS:
                # `from hpcrl.runtime import comm`: the imported names are modules
                found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def test_every_import_goes_down_the_layers_or_stays_in_its_package():
    wrong = []
    for path in sorted((REPO / "hpcrl").rglob("*.py")):
        here = module_name(path)
        mine = layer_of(here)
        assert mine in LAYERS, f"{path}: package {mine!r} has no layer in this test (and docs/architecture.md)"
        for line, target in hpcrl_imports(path):
            theirs = layer_of(target)
            if theirs == mine:
                continue
            if LAYERS[theirs] >= LAYERS[mine]:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {here} ({mine}, layer {LAYERS[mine]}) imports "
                             f"{target} ({theirs}, layer {LAYERS[theirs]})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_the_guard_sees_a_wrong_import(tmp_path):
    """The walk finds imports inside functions and `from hpcrl.x import module` forms."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from hpcrl.tools import plan\n    import hpcrl.workers.env_rank\n")
    assert hpcrl_imports(source) == [(2, "hpcrl.tools.plan"), (3, "hpcrl.workers.env_rank")]
    assert layer_of("hpcrl.launch.wiring") == "launch" and layer_of("hpcrl.core.sizing") == "core"
    assert layer_of("hpcrl.runtime.comm") == "runtime" and layer_of("hpcrl") == "__main__"  # (its API, lazily)


IMPORT_PATH = re.compile(r"""["'](hpcrl(?:\.\w+)+):\w+["']""")  # 'hpcrl.workers.trainer:LearnerRole'


def named_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every 'hpcrl.module:Name' string in the file: a class imported by name
    later (launch/registry.py) is a dependency too, one the import walk cannot see."""
    return [(n, m.group(1)) for n, text in enumerate(path.read_text().splitlines(), 1)
            for m in IMPORT_PATH.finditer(text)]


def test_classes_named_by_import_path_are_named_from_above_them():
    wrong = []
    for path in sorted((REPO / "hpcrl").rglob("*.py")):
        here = module_name(path)
        for line, target in named_imports(path):
            if LAYERS[layer_of(target)] > LAYERS[layer_of(here)]:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {here} names {target}")
    assert not wrong, "import paths against the layer order:\n" + "\n".join(wrong)
    assert named_imports(REPO / "hpcrl" / "launch" / "registry.py")  # the guard reads the real form


# a comparison of an algorithm's name: `algo.name == "td3"`, `a.name in ("dqn", "sac")`
NAME_TEST = re.compile(r"""(name["')\]]*\s*(==|!=|\bin\b|\bnot in\b)\s*[("']|["'](ppo|mappo|ippo|dqn|sac|td3)["']\s*(==|!=))""")


def test_no_code_outside_the_registry_compares_an_algorithm_name():
    """What an algorithm is lives in its declaration (core/dataflow.py: replay, continuous,
    action_noise, multiagent, policy, ...); code asks those facts, never the name."""
    wrong = []
    for path in sorted((REPO / "hpcrl").rglob("*.py")):
        if path.name == "dataflow.py":
            continue
        for n, text in enumerate(path.read_text().splitlines(), 1):
            code = text.split("#")[0]
            if NAME_TEST.search(code) and re.search(r"\balgo\b|\ba\.name\b|algo\.get", code):
                wrong.append(f"{path.relative_to(REPO)}:{n}: {text.strip()}")
    assert not wrong, "algorithm names compared outside core/dataflow.py:\n" + "\n".join(wrong)
    assert NAME_TEST.search('if cfg.algo.name == "td3":') and NAME_TEST.search('a.name in ("dqn", "sac")')
    assert NAME_TEST.search('if algo.get("name") in ("dqn", "sac", "td3"):')


MAX_INIT_PARAMETERS = 8


def test_every_class_is_built_from_at_most_eight_parameters():
    """A constructor of more takes concerns that belong in a part or a settings object of their own
    (as LearnerRole's LearnerLinks and LearnerSettings)."""
    wide = []
    for path in sorted((REPO / "hpcrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for f in node.body:
                    if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                        count = len(f.args.args) - 1 + len(f.args.kwonlyargs)
                        if count > MAX_INIT_PARAMETERS:
                            wide.append(f"{path.relative_to(REPO)}: {node.name}.__init__ takes {count}")
    assert not wide, wide
