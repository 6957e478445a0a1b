"""Serial-mode env state as data (hpcrl/envs/state.py, issue 25): a checkpoint is never code.
Captured state continues bit-identically in envs built fresh; a checkpoint holding the old pickle
runs nothing; state that is not plain data is refused with a warning; nothing under hpcrl/ reads
data with a loader that can run code. And the env ranks' state files of an exact resume on
several ranks (hpcrl/io/env_states.py)."""
import ast
import json
import os
import pickle
import threading
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import pytest

from hpcrl.core.config import parse_config
from hpcrl.envs import make_vector_env, state
from hpcrl.io.checkpoint import _digest
from tests.conftest import REPO, mpirun, run_dir, small_config, write_config


def twins(yaml_text: str, warm_up: int = 30):
    """A vector stepped `warm_up` random steps, and one built fresh with other seeds into which its
    captured state is restored; also the actions' generator."""
    cfg = parse_config(yaml_text).env
    envs, _ = make_vector_env(cfg, seed=3)
    rng = np.random.default_rng(0)
    for _ in range(warm_up):
        envs.step(valid_actions(envs, rng))
    copy, _ = make_vector_env(cfg, seed=1000)
    state.restore(copy, *state.capture(envs))
    return envs, copy, rng


def valid_actions(envs, rng: np.random.Generator) -> np.ndarray:
    mask = getattr(envs.unwrapped, "action_mask", None)
    if mask is not None:
        return np.array([rng.choice(np.flatnonzero(row)) for row in mask])
    return rng.integers(0, envs.single_action_space.n, envs.num_envs)


def assert_same_steps(a, b, rng, steps: int) -> None:
    for _ in range(steps):  # through episode ends, their autoresets and the generators they draw from
        actions = valid_actions(a, rng)
        (obs_a, r_a, term_a, trunc_a, info_a), (obs_b, r_b, term_b, trunc_b, info_b) = a.step(actions), b.step(actions)
        for x, y in ((obs_a, obs_b), (r_a, r_b), (term_a, term_b), (trunc_a, trunc_b)):
            np.testing.assert_array_equal(x, y)
        for key in ("active", "action_mask", "raw_reward"):
            if key in info_a:
                np.testing.assert_array_equal(info_a[key], info_b[key])


def test_cartpole_through_hpcrls_wrappers_continues_bit_identically():
    envs, copy, rng = twins("env: {id: CartPole-v1, num_envs: 3, normalize_reward: true}")
    np.testing.assert_array_equal(envs.unwrapped.envs[1].unwrapped.state, copy.unwrapped.envs[1].unwrapped.state)
    assert copy.unwrapped.envs[0].spec.max_episode_steps == 500  # config stays as built
    assert_same_steps(envs, copy, rng, 400)
    # the return statistics hpcrl's DiscountedReturns wrapper keeps came along too
    np.testing.assert_array_equal(envs.take_moments(), copy.take_moments())


def test_a_pettingzoo_vector_with_masks_continues_bit_identically():
    envs, copy, rng = twins("env: {id: 'tests.ma_envs:MaskedRelay', num_envs: 2}", warm_up=4)
    np.testing.assert_array_equal(envs.unwrapped.action_mask, copy.unwrapped.action_mask)
    np.testing.assert_array_equal(envs.unwrapped.active, copy.unwrapped.active)  # mid-episode: an agent has left
    assert_same_steps(envs, copy, rng, 40)


def test_a_pettingzoo_board_game_continues_bit_identically():
    """PettingZoo's connect four (an AEC game behind its wrappers): the board, whose turn it is and
    the agent selector come back, so a serial resume goes on with the games in progress."""
    envs, copy, rng = twins("env: {id: 'pettingzoo:classic/connect_four-v3', num_envs: 3}", warm_up=9)
    assert_same_steps(envs, copy, rng, 60)


def test_a_state_that_does_not_fit_the_fresh_envs_is_refused_before_anything_is_written():
    cfg = parse_config("env: {id: CartPole-v1, num_envs: 3}").env
    saved = state.capture(make_vector_env(cfg, seed=3)[0])
    fresh, untouched = (make_vector_env(parse_config("env: {id: CartPole-v1, num_envs: 2}").env, seed=5)[0]
                        for _ in range(2))
    with pytest.raises(state.StateMismatch, match=r"state\.env\.envs: the checkpoint holds 3 items that are not "
                                                  r"all plain data, this run's env 2 items"):
        state.restore(fresh, *saved)
    rng = np.random.default_rng(0)
    assert_same_steps(fresh, untouched, rng, 50)  # the sub-envs it walked first are still as built


@pytest.mark.parametrize("tree", [
    '{"$object": "os.system", "vars": {}}',  # a class the fresh graph does not hold there: never made
    '{"$dict": [["x", {"$hook": "builtins.eval", "state": "1"}]]}',
    '{"$array": "0000"}',  # an array the checkpoint does not hold
])
def test_restore_builds_nothing_the_data_names(tree):
    fresh = {"x": None}
    with pytest.raises(state.StateMismatch):
        state.restore(fresh, tree, {})
    assert fresh == {"x": None}


class CartPoleWithALock(gym.Wrapper):
    """CartPole holding a lock: state that is not plain data, as a C object (MjData, a Box2D world) is."""

    def __init__(self, **kwargs):
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.lock = threading.Lock()


def test_state_that_is_not_plain_data_is_named_where_it_sits():
    envs, _ = make_vector_env(parse_config("env: {id: 'tests.test_env_state:CartPoleWithALock'}").env, seed=0)
    with pytest.raises(state.NotCapturable, match=r"state\.env\.envs\[0\]\.env\.env\.lock: a _thread\.lock holds state"):
        state.capture(envs)


def test_a_serial_run_of_an_env_that_cannot_be_captured_warns_and_finishes(tmp_path):
    cfg = small_config(tmp_path, env={"id": "tests.test_env_state:CartPoleWithALock"}, run={"total_frames": 256})
    result = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("cannot be saved as data (state['groups'][0]['envs'].env.envs[0].env.env.lock") == 1
    assert "a resumed serial run starts new episodes" in result.stdout


class RunsACommand:
    """What a crafted pickle does when loaded: here, create a file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def put_env_state(checkpoint: Path, blob: np.ndarray) -> None:
    """Replace the checkpoint's parts/env by `blob`, checksum and all (an attacker can)."""
    with h5py.File(checkpoint, "r+") as f:
        parts = f["parts"]
        keys = [key for _, key in json.loads(parts.attrs["_keys"])]
        name = f"{keys.index('env'):04d}"
        del parts[name]
        parts.create_dataset(name, data=blob)
        f.attrs["sha256"] = _digest(f)


def test_a_checkpoint_holding_a_pickled_env_state_resumes_without_running_it(tmp_path):
    marker = tmp_path / "MARKER"
    cfg = small_config(tmp_path, run={"total_frames": 640})
    path = str(write_config(tmp_path, cfg))
    assert mpirun(1, "run", path).returncode == 0
    put_env_state(run_dir(cfg) / "checkpoint.h5", np.frombuffer(pickle.dumps(RunsACommand(marker)), dtype=np.uint8))
    result = mpirun(1, "run", path, "--set", "run.total_frames=1280")
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    assert "the checkpoint's env state was not restored: it is in the old pickled format, which runs code " \
           "when loaded" in result.stdout
    assert "policy version 10, 640 frames" in result.stdout  # the rest of the checkpoint was used


# --- no loader that runs code reads data under hpcrl/ ----------------------------------------------

CODE_RUNNING_CALLS = {
    "pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads", "_pickle.Unpickler",
    "marshal.load", "marshal.loads", "shelve.open", "joblib.load",
    "yaml.load", "yaml.load_all", "yaml.unsafe_load", "yaml.unsafe_load_all", "yaml.full_load", "yaml.full_load_all",
}
CODE_RUNNING_MODULES = {"dill", "cloudpickle", "jsonpickle"}


def _keyword_is(call: ast.Call, name: str, value) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is value for k in call.keywords)


def code_running_loads(source: str, filename: str) -> list[str]:
    """file:line of each call under `source` that can run code from the data it reads."""
    tree = ast.parse(source, filename)
    names: dict[str, str] = {}  # local name -> what it was imported as ("np" -> "numpy")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
                if alias.name.split(".")[0] in CODE_RUNNING_MODULES:
                    found.append(f"{filename}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            if node.module.split(".")[0] in CODE_RUNNING_MODULES:
                found.append(f"{filename}:{node.lineno}: from {node.module} import ...")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func, parts = node.func, []
        while isinstance(func, ast.Attribute):
            parts.insert(0, func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            continue
        called = ".".join([names.get(func.id, func.id), *parts])
        if called in CODE_RUNNING_CALLS \
                or called == "torch.load" and not _keyword_is(node, "weights_only", True) \
                or called == "numpy.load" and _keyword_is(node, "allow_pickle", True):
            found.append(f"{filename}:{node.lineno}: {called}(...)")
    return found


def test_the_guard_finds_each_kind_of_code_running_load():
    source = ("import pickle as p\nimport numpy as np\nimport torch, yaml, marshal, shelve\nfrom pickle import loads\n"
              "import dill\np.loads(b'')\nnp.load('a', allow_pickle=True)\nnp.load('a')\ntorch.load('m')\n"
              "torch.load('m', weights_only=True)\nyaml.load(t)\nyaml.safe_load(t)\nmarshal.loads(b'')\n"
              "shelve.open('s')\nloads(b'')\np.Unpickler(f).load()\n")
    assert sorted(int(hit.split(":")[1]) for hit in code_running_loads(source, "x.py")) == [5, 6, 7, 9, 11, 13, 14, 15, 16]


def test_nothing_under_hpcrl_reads_data_with_a_loader_that_runs_code():
    found = [hit for path in sorted((REPO / "hpcrl").rglob("*.py"))
             for hit in code_running_loads(path.read_text(), str(path.relative_to(REPO)))]
    assert not found, "loaders that can run code from the data they read (issue 25):\n" + "\n".join(found)


def test_env_ranks_states_keep_two_per_rank_fit_one_layout_and_never_follow_a_planted_link(tmp_path):
    """io/env_states.py, what an exact resume of several ranks reads: each env rank keeps its two
    newest files; a file is used only by the same env-rank count and version; a link planted as
    env-state/ is replaced, its target untouched; killed writers' temporaries go at a resume."""
    from hpcrl.io import env_states
    run = tmp_path / "run"
    run.mkdir()
    snapshot = {"tree": np.frombuffer(b'{"x": 1}', dtype=np.uint8), "arrays": {"0000": np.arange(3.0)}}
    for version in (4, 6, 8):
        env_states.keep(str(run), 1, version, snapshot, env_ranks=2)
    assert sorted(os.listdir(run / "env-state")) == ["env-00001-v00000006.h5", "env-00001-v00000008.h5"]
    assert env_states.kept_at(str(run), 8) == [1] and env_states.kept_at(str(run), 4) == []
    kind, saved, why = env_states.load(str(run), 8, 1, first_env=3, num_envs=3, env_ranks=2, saved_layout=(2, 6))
    assert (kind, why) == (env_states.WHOLE, "") and saved["tree"].tobytes() == b'{"x": 1}'
    np.testing.assert_array_equal(saved["arrays"]["0000"], np.arange(3.0))
    assert env_states.load(str(run), 8, 2, first_env=4, num_envs=2, env_ranks=3, saved_layout=(2, 6))[2] == (
        f"{run}/env-state/env-00001-v00000008.h5 holds an env rank's state whole (its envs could not be saved one "
        f"by one), written by a layout of 2 env ranks: only a resume on that layout continues it")
    assert "does not exist" in env_states.load(str(run), 8, 0, 0, 3, 2, saved_layout=(2, 6))[2]
    assert env_states.load(str(run), 8, 0, 0, 4, 2, saved_layout=(2, 6))[2] == (
        "the checkpoint's run had 6 envs on 2 env ranks, this one has 8: only the same envs in all continue exactly")
    (run / "env-state" / "env-00001-v00000010.h5.tmp.123").write_bytes(b"half")
    env_states.remove_temporaries(str(run))
    assert not list((run / "env-state").glob("*.tmp.*"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "env-00001-v00000001.h5").write_bytes(b"someone's file")
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "env-state").symlink_to(elsewhere)
    env_states.remove_temporaries(str(planted))  # reads nothing through the link
    env_states.keep(str(planted), 1, 12, snapshot, env_ranks=2)
    assert not (planted / "env-state").is_symlink() and os.listdir(planted / "env-state") == [
        "env-00001-v00000012.h5"]
    assert os.listdir(elsewhere) == ["env-00001-v00000001.h5"]  # the link's target untouched


def test_env_ranks_states_kept_env_by_env_are_dealt_to_another_env_rank_count(tmp_path):
    """Two env ranks of 3 envs (2 rows each) write their states env by env; a layout of 3 env ranks
    of 2 envs takes its envs from them by global index: its second rank's from both files."""
    from hpcrl.io import env_states
    run = str(tmp_path)

    def snapshot(first: int) -> dict:
        envs = [{"tree": np.frombuffer(f'{{"env": {first + j}}}'.encode(), dtype=np.uint8),
                 "arrays": {"0000": np.full(2, first + j)}} for j in range(3)]
        return {"envs": envs, "rows": {"obs": np.arange(2 * first, 2 * first + 6, dtype=np.float32)[:, None]},
                "steps": 96}
    for index in (0, 1):
        env_states.keep_envs(run, index, 7, snapshot(3 * index), first_env=3 * index, env_ranks=2, fragments_sent=7)
    assert env_states.kept_at(run, 7) == [0, 1]
    kind, dealt, why = env_states.load(run, 7, 1, first_env=2, num_envs=2, env_ranks=3, saved_layout=(2, 6))
    assert (kind, why) == (env_states.PER_ENV, "")
    assert [bytes(e["tree"]) for e in dealt["envs"]] == [b'{"env": 2}', b'{"env": 3}']
    assert [e["arrays"]["0000"].tolist() for e in dealt["envs"]] == [[2, 2], [3, 3]]
    assert dealt["rows"]["obs"][:, 0].tolist() == [4, 5, 6, 7]  # envs 2 and 3's two rows each
    assert (dealt["steps"], dealt["fragments_sent"]) == (96, 7)
    same = env_states.load(run, 7, 1, first_env=3, num_envs=3, env_ranks=2, saved_layout=(2, 6))[1]
    assert same["rows"]["obs"][:, 0].tolist() == list(range(6, 12))
    moved = tmp_path / "env-state" / "env-00001-v00000007.h5"
    moved.rename(tmp_path / "env-state" / "env-00000-v00000007.h5")  # a file where another rank's belongs
    assert "holds envs from 3 (3 of them), not the 3 from 0" in env_states.load(
        run, 7, 0, first_env=0, num_envs=2, env_ranks=3, saved_layout=(2, 6))[2]


def dealt_in_two(yaml_text: str, warm_up: int):
    """A vector of 4 envs stepped `warm_up` random steps, and two fresh vectors of 2 (other seeds)
    into which its envs are dealt one by one with their rows (hpcrl/envs/per_env.py)."""
    from hpcrl.envs import per_env
    cfg = parse_config(yaml_text).env
    whole, _ = make_vector_env(cfg, seed=3, num_envs=4)
    rng = np.random.default_rng(0)
    for _ in range(warm_up):
        whole.step(valid_actions(whole, rng))
    envs, rows = per_env.split(whole)
    rows = per_env.row_arrays(rows)
    per_row = len(next(iter(rows.values()))) // 4
    halves = []
    for h in range(2):
        half, _ = make_vector_env(cfg, seed=1000 + h, num_envs=2)
        half_envs, half_rows = per_env.split(half)
        for fresh, env in zip(half_envs, envs[2 * h:2 * h + 2]):
            state.restore(fresh, *state.capture(env))
        for name, live in per_env.row_arrays(half_rows).items():
            np.copyto(live, rows[name][2 * h * per_row:(2 * h + 2) * per_row])
        halves.append(half)
    return whole, halves, rng


@pytest.mark.parametrize("yaml_text, warm_up", [
    ("env: {id: CartPole-v1, normalize_reward: true}", 30),  # gymnasium envs through hpcrl's wrappers
    ("env: {id: 'tests.ma_envs:MaskedRelay'}", 4),  # PettingZoo rows with masks, an agent gone
    ("env: {id: 'pettingzoo:classic/connect_four-v3'}", 9),  # turns
])
def test_a_vector_dealt_env_by_env_to_two_vectors_steps_on_as_one(yaml_text, warm_up):
    whole, halves, rng = dealt_in_two(yaml_text, warm_up)
    for _ in range(60):
        actions = valid_actions(whole, rng)
        a = whole.step(actions)
        b = [half.step(part) for half, part in zip(halves, np.split(actions, 2))]
        for i in range(4):  # obs, rewards, terminated, truncated
            np.testing.assert_array_equal(a[i], np.concatenate([b[0][i], b[1][i]]))
        for key in ("active", "action_mask"):
            if key in a[4]:
                np.testing.assert_array_equal(a[4][key], np.concatenate([b[0][4][key], b[1][4][key]]))
        if hasattr(whole, "returns"):  # env.normalize_reward's discounted returns, which scale the rewards
            np.testing.assert_array_equal(whole.returns, np.concatenate([h.returns for h in halves]))


def test_a_vector_that_keeps_state_across_its_envs_is_not_split():
    """gymnasium's numpy CartPole draws every env's resets from one generator."""
    from hpcrl.envs import per_env
    envs, _ = make_vector_env(parse_config("env: {id: CartPole-v1, backend: numpy}").env, seed=3)
    with pytest.raises(per_env.NotSplittable, match="SameStepAutoreset keeps state across its envs"):
        per_env.split(envs)
