"""A run directory is data, never code (issue 25): `hpcrl eval`, `inspect` and `plot` on a run
directory someone handed over, whose config, metrics and checkpoint hold whatever its author put
there. Each run directory here is written directly, as such an author could (no training), and
the commands run in this process through the command line's `main`."""
import hashlib
import json

import numpy as np
import pytest
import torch
import yaml

from hpcrl.core.config import parse_config, to_yaml
from hpcrl.envs import imports_of_env_id, env_spaces
from hpcrl.io.checkpoint import save_checkpoint
from hpcrl.io.metrics import MetricsWriter
from hpcrl.models import build_policy
from hpcrl.tools.cli import main

COUNTERS = {"frames": 300, "updates": 3, "policy_version": 3, "wall_time": 3.0, "stopped_by": "total_frames"}


def handed_run(root, env=None, counters=None, weights=None, hidden=(8,)):
    """A CartPole run directory as a stranger hands it over: config.yaml, metrics.h5 and a
    checkpoint whose config says `env` (default CartPole) and `model.hidden_sizes: hidden`, holding
    `weights(model)`'s weights of a CartPole network with 8 hidden units."""
    root.mkdir(parents=True)
    cartpole = parse_config("env: {id: CartPole-v1}\nmodel: {hidden_sizes: [8]}")
    model = build_policy(env_spaces(cartpole.env), cartpole)
    if weights:
        with torch.no_grad():
            weights(model)
    text = to_yaml(parse_config(yaml.safe_dump({"env": env or {"id": "CartPole-v1"},
                                                "model": {"hidden_sizes": list(hidden)}})))
    (root / "config.yaml").write_text(text)
    save_checkpoint(str(root / "checkpoint.h5"), model, torch.optim.Adam(model.parameters()),
                    counters or COUNTERS, np.random.default_rng(0), text)
    writer = MetricsWriter(str(root / "metrics.h5"))
    for row in range(3):
        writer.append({"frames": 100 * (row + 1), "wall_time": row + 1.0, "policy_version": row + 1,
                       "episodes": 2, "return_window_mean": 10.0 * row, "return_mean": 10.0 * row})
    writer.close()
    return root


def hpcrl(capsys, *args) -> tuple[int, str, str]:
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


# --- 1. eval imports and calls nothing a run directory names, unless trusted ----------------------

@pytest.fixture
def payload(tmp_path, monkeypatch):
    """A module on the import path that leaves a marker file when it is imported, as code a run
    directory names would; returns the marker."""
    marker = tmp_path / "payload_ran"
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "hpcrl_test_payload.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    return marker


@pytest.mark.parametrize("env_id, module", [
    ("os:system", "os"),                                             # a callable, called with env.kwargs
    ("hpcrl_test_payload:CartPole-v1", "hpcrl_test_payload"),        # gymnasium's 'module:EnvId'
    ("hpcrl_test_payload:classic/connect_four-v3", "hpcrl_test_payload"),  # PettingZoo's form, not pettingzoo
    ("pettingzoo.utils:all_modules_v1", "pettingzoo.utils"),         # a known package, but not an env family
    ("tests.ma_envs:Relay", "tests.ma_envs"),                        # hpcrl's own test envs are code too
])
def test_eval_refuses_an_env_id_that_imports_a_module_and_nothing_runs(tmp_path, capsys, payload, env_id, module):
    command = f"touch {tmp_path / 'command_ran'}"
    run = handed_run(tmp_path / "run", env={"id": env_id, "kwargs": {"command": command}})
    status, out, err = hpcrl(capsys, "eval", run, "--episodes", "1")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert (f"env.id {env_id!r} would import module {module!r} and make the env from its "
            f"{env_id.split(':', 1)[1]!r} with env.kwargs {{'command': '{command}'}}") in err
    assert "If you trust the run's author, pass --trust-code" in err
    assert not payload.exists() and not (tmp_path / "command_ran").exists()


def test_trust_env_code_lets_eval_import_the_module(tmp_path, capsys, payload):
    run = handed_run(tmp_path / "run", env={"id": "hpcrl_test_payload:CartPole-v1"})
    status, out, err = hpcrl(capsys, "eval", run, "--episodes", "1", "--trust-env-code")
    assert status == 0 and "1 episodes" in out, err
    assert payload.exists()


def test_the_env_families_hpcrl_supports_import_nothing_else():
    for env_id in ("CartPole-v1", "ALE/Breakout-v5", "HalfCheetah-v5", "hpcrl/CartPolePositions-v1",
                   "minigrid:MiniGrid-DoorKey-5x5-v0", "pettingzoo:classic/connect_four-v3",
                   "pettingzoo.classic:connect_four_v3", "mpe2:simple_spread_v3", "gymnasium:CartPole-v1"):
        assert imports_of_env_id(env_id) is None, env_id
    for env_id, module in (("minigrid:register_minigrid_envs", "minigrid"), ("mpe2:simple_spread_v3:x", "mpe2"),
                           ("pettingzoo:utils", "pettingzoo"), ("gymnasium:make", "gymnasium"),
                           ("tests.instrumented_envs:HpcrlTest/Slow-v0", "tests.instrumented_envs")):
        assert imports_of_env_id(env_id) == module, env_id


# --- 2. inspect and plot: one message for whatever the files hold, never a traceback -------------

@pytest.mark.parametrize("content, message", [
    (b"run: {name: [unclosed\n", "config.yaml' is not valid YAML (line 2, column 1: expected ',' or ']'"),
    (b"- run\n- env\n", "config.yaml' holds a YAML list, not a mapping of config sections"),
    (b"run: {name: caf\xe9}\n", "config.yaml' is not UTF-8 text (byte 15)"),
    # an alias bomb (10**9 values expanded) and a key given twice: refused as a config would be
    (b"a: &a [x,x,x,x,x,x,x,x,x,x]\n" + b"".join(b"%c: &%c [" % (98 + i, 98 + i) + b",".join([b"*%c" % (97 + i)] * 10) + b"]\n" for i in range(8)), "config.yaml: line 5: e: holds more than 100,000 values once its aliases"),
    (b"run: {name: a}\nrun: {name: b}\n", "config.yaml: run: given twice, at lines 1 and 2"),
])
@pytest.mark.parametrize("command", ["inspect", "plot"])
def test_a_config_yaml_that_is_no_config_is_one_message(tmp_path, capsys, content, message, command):
    """inspect exits 2: the config heads its report; plot exits 2: it groups runs by their configs."""
    run = handed_run(tmp_path / "run")
    (run / "config.yaml").write_bytes(content)
    status, out, err = hpcrl(capsys, command, run, *(["-o", tmp_path / "c.png"] if command == "plot" else []))
    assert status == 2 and out == "" and err.startswith(f"hpcrl: {command}: ") and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_config_values_of_any_type_are_reported_and_grouped(tmp_path, capsys):
    """YAML's dates, a count that is text, keys of mixed types: inspect shows them as they are
    (--json as text), and plot groups runs by comparing their configs."""
    runs = [handed_run(tmp_path / "runs" / f"r_s{seed}") for seed in (1, 2)]
    for run in runs:
        (run / "config.yaml").write_text("run: {started: 2024-05-01, total_frames: many}\n1: one\n"
                                         "env: {id: CartPole-v1}\n")
    status, out, err = hpcrl(capsys, "inspect", runs[0])
    assert status == 0 and "total_frames many" in out and "progress     300 frames, 3 updates" in out, err
    status, out, err = hpcrl(capsys, "inspect", runs[0], "--json")
    assert status == 0 and json.loads(out)["config"]["run"]["started"] == "2024-05-01", err
    status, out, err = hpcrl(capsys, "plot", tmp_path / "runs", "-o", tmp_path / "c.png")
    assert status == 0 and "2 runs in 1 curve (r (2 runs))" in out, err


@pytest.mark.parametrize("drop, message", [
    (("frames",), "has no series frames (it has: episodes, policy_version, return_mean, return_window_mean, "
                  "wall_time); every metrics file hpcrl writes has frames, wall_time, policy_version"),
    (("wall_time",), "has no series wall_time"),
    (("policy_version",), "has no series policy_version"),
    (("return_mean", "return_window_mean"), None),
])
def test_metrics_without_a_series_are_one_message(tmp_path, capsys, drop, message):
    """plot exits 2; inspect reports the rest (exit 0), its progress line saying why it has none."""
    import h5py
    run = handed_run(tmp_path / "run")
    with h5py.File(run / "metrics.h5", "a") as f:
        for key in drop:
            del f[key]
    status, out, err = hpcrl(capsys, "plot", run, "-o", tmp_path / "c.png")
    plot_says = message or ("metrics.h5 has no return_window_mean nor return_mean (it has: episodes, frames, "
                            "policy_version, wall_time); pick one with --metric")
    assert status == 2 and plot_says in err and len(err.strip().splitlines()) == 1, err
    status, out, err = hpcrl(capsys, "inspect", run)
    assert status == 0 and err == ""
    if message:
        assert f"progress     none: '{run}/metrics.h5' {message}" in out
    else:
        assert "3 updates, policy version 3" in out and "last return n/a" in out
    assert "checkpoint   checkpoint.h5" in out and "digest OK" in out


@pytest.mark.parametrize("counters, message", [
    ({**COUNTERS, "frames": "many"}, "counter 'frames' is 'many', not a whole number >= 0"),
    ({**COUNTERS, "policy_version": [3]}, "counter 'policy_version' is [3], not a whole number >= 0"),
    ({**COUNTERS, "stopped_by": 7}, "counter 'stopped_by' is 7, not text"),
])
def test_a_checkpoint_counter_that_is_no_number_is_one_message(tmp_path, capsys, counters, message):
    """inspect reports the rest (exit 0) and marks the checkpoint NOT USABLE; eval exits 2."""
    run = handed_run(tmp_path / "run", counters=counters)
    status, out, err = hpcrl(capsys, "inspect", run)
    assert status == 0 and err == "", err
    assert f", NOT USABLE: {run}/checkpoint.h5: {message} (the file was written by something else, or edited)" in out
    assert "progress     300 frames" in out and "status       not finished" in out
    status, out, err = hpcrl(capsys, "eval", run, "--episodes", "1")
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert f"holds no usable checkpoint (skipping {run}/checkpoint.h5: {message}" in err


# --- 3. eval refuses weights that are not finite or do not fit ----------------------------------

@pytest.mark.parametrize("case, message", [
    ("nan", "holds NaN or infinite values"),
    ("shape", "in the checkpoint, the model this run builds has"),
])
def test_eval_refuses_weights_that_are_not_finite_or_do_not_fit(tmp_path, capsys, case, message):
    if case == "nan":
        run = handed_run(tmp_path / "run", weights=lambda model: next(iter(model.parameters())).fill_(float("nan")))
    else:  # the config says 16 hidden units, the weights have 8
        run = handed_run(tmp_path / "run", hidden=(16,))
    status, out, err = hpcrl(capsys, "eval", run, "--episodes", "1")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"hpcrl: eval: {run}/checkpoint.h5") and message in err


# --- 4. none of them writes into the run directory ----------------------------------------------

def test_eval_inspect_and_plot_leave_the_run_directory_as_it_was(tmp_path, capsys):
    run = handed_run(tmp_path / "run")

    def contents():
        return {p.name: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
                for p in sorted(run.rglob("*"))}

    before = contents()
    for args in (["inspect", run], ["inspect", run, "--json"], ["plot", run, "-o", tmp_path / "c.png"],
                 ["eval", run, "--episodes", "1"], ["eval", run, "--episodes", "1", "--json"]):
        status, _, err = hpcrl(capsys, *args)
        assert status == 0, (args, err)
    assert contents() == before
