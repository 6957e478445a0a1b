"""Checkpoint round trip: model, optimizer, counters, RNG states and config text, atomically."""
import os

import h5py
import numpy as np
import pytest
import torch

from hpcrl.io.checkpoint import (CheckpointError, _digest, _write_tree, adopt_into, load_checkpoint, load_latest,
                                 restore_rng_states, save_checkpoint)
from hpcrl.core.config import ModelConfig
from hpcrl.envs import EnvSpaces
from hpcrl.models import build_model
from hpcrl.models.adam import Adam


def trained():
    torch.manual_seed(0)
    model = build_model(EnvSpaces((4,), "float32", 2), ModelConfig(hidden_sizes=[8]))
    opt = Adam(model.parameters(), lr=1e-3)  # as the learner builds it
    for _ in range(3):
        opt.zero_grad()
        obs = torch.randn(5, 4)
        logp, entropy, value = model.evaluate(obs, torch.zeros(5, dtype=torch.int64))
        (value.sum() + logp.sum() + entropy.sum()).backward()  # every parameter gets Adam state
        opt.step()
    return model, opt


def test_round_trip_restores_everything(tmp_path):
    model, opt = trained()
    rng = np.random.default_rng(42)
    rng.normal(size=3)
    path = str(tmp_path / "checkpoint.h5")
    save_checkpoint(path, model, opt, {"frames": 1234, "policy_version": 7, "wall_time": 1.5}, rng, "run: {}\n")
    expected_np, expected_torch = rng.normal(size=2), torch.rand(2)

    ck = load_checkpoint(path)
    assert ck["counters"] == {"frames": 1234, "policy_version": 7, "wall_time": 1.5}
    assert ck["config"] == "run: {}\n"
    fresh = build_model(EnvSpaces((4,), "float32", 2), ModelConfig(hidden_sizes=[8]))
    fresh.load_state_dict(ck["model"])
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    fresh_opt = Adam(fresh.parameters(), lr=1e-3)
    fresh_opt.load_state_dict(ck["optimizer"])
    saved, restored = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert len(saved) == len(list(model.parameters())) and saved.keys() == restored.keys()
    for key_a in saved:
        a, b = saved[key_a], restored[key_a]
        assert a.keys() == b.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key in a:
            assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), key
    assert fresh_opt.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    rng2 = np.random.default_rng(0)
    restore_rng_states(ck["rng"], rng2)
    np.testing.assert_array_equal(rng2.normal(size=2), expected_np)
    assert torch.equal(torch.rand(2), expected_torch)


def test_failed_write_keeps_the_previous_checkpoint(tmp_path):
    model, opt = trained()
    path = str(tmp_path / "checkpoint.h5")
    rng = np.random.default_rng(0)
    save_checkpoint(path, model, opt, {"frames": 1}, rng, "a")
    with pytest.raises(TypeError):
        save_checkpoint(path, model, opt, {"frames": object()}, rng, "b")  # not serialisable
    assert load_checkpoint(path)["counters"] == {"frames": 1}
    assert os.listdir(tmp_path) == ["checkpoint.h5"]  # no temp file left behind
    with h5py.File(path) as f:
        assert f.attrs["format_version"] == 1


def test_corrupt_or_truncated_checkpoint_falls_back_to_the_previous_one(tmp_path):
    model, opt = trained()
    rng = np.random.default_rng(0)
    path = str(tmp_path / "checkpoint.h5")
    save_checkpoint(path, model, opt, {"frames": 1}, rng, "first")
    save_checkpoint(path, model, opt, {"frames": 2}, rng, "second")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.h5", "checkpoint.prev.h5"]
    ck, used, problems = load_latest(path)
    assert ck["counters"] == {"frames": 2} and used == path and problems == []

    with h5py.File(path, "r+") as f:  # silent corruption: one weight changes, the file stays valid HDF5
        ds = f["model/0000"]
        data = ds[()]
        data.flat[0] += 1.0
        ds[...] = data
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(path)
    ck, used, problems = load_latest(path)
    assert ck["counters"] == {"frames": 1} and used.endswith("checkpoint.prev.h5")
    assert len(problems) == 1 and "checksum mismatch" in problems[0]

    size = os.path.getsize(path)
    with open(path, "r+b") as fh:  # a write cut short
        fh.truncate(size // 2)
    ck, used, problems = load_latest(path)
    assert ck["counters"] == {"frames": 1} and "unreadable checkpoint" in problems[0]


def test_a_damaged_latest_checkpoint_never_replaces_the_good_previous_one(tmp_path):
    """The run resumed from checkpoint.prev.h5 because checkpoint.h5 was damaged: its next
    checkpoint sets the damaged file aside instead of rotating it over the good one."""
    model, opt = trained()
    rng = np.random.default_rng(0)
    path = str(tmp_path / "checkpoint.h5")
    save_checkpoint(path, model, opt, {"frames": 1}, rng, "first")
    save_checkpoint(path, model, opt, {"frames": 2}, rng, "second")
    with open(path, "r+b") as fh:  # a write cut short
        fh.truncate(os.path.getsize(path) // 2)
    save_checkpoint(path, model, opt, {"frames": 3}, rng, "third")
    assert load_checkpoint(str(tmp_path / "checkpoint.prev.h5"))["counters"] == {"frames": 1}
    assert load_checkpoint(path)["counters"] == {"frames": 3}
    damaged = [n for n in os.listdir(tmp_path) if n.startswith("checkpoint.damaged.")]
    assert len(damaged) == 1  # kept for a look, never deleted
    save_checkpoint(path, model, opt, {"frames": 4}, rng, "fourth")  # healthy again: the usual rotation
    assert load_checkpoint(str(tmp_path / "checkpoint.prev.h5"))["counters"] == {"frames": 3}


def test_damage_anywhere_in_the_file_is_a_checkpoint_error_and_the_previous_one_is_used(tmp_path):
    """Bytes overwritten at any place (data, HDF5 metadata, the superblock) make the checkpoint
    unusable, never crash the reader: load_latest reports it and falls back."""
    model, opt = trained()
    rng = np.random.default_rng(0)
    path = str(tmp_path / "checkpoint.h5")
    save_checkpoint(path, model, opt, {"frames": 1}, rng, "first")
    save_checkpoint(path, model, opt, {"frames": 2}, rng, "second", parts={"step": {}})
    intact = open(path, "rb").read()
    for offset in range(0, len(intact), max(1, len(intact) // 97)):
        with open(path, "wb") as fh:
            fh.write(intact[:offset] + b"\xff" * 64 + intact[offset + 64:])
        try:
            ck, used, problems = load_latest(path)
        except CheckpointError as exc:
            pytest.fail(f"the previous checkpoint was not used after damage at byte {offset}: {exc}")
        if used == path:  # the overwritten bytes were unused space: the checksum still holds
            assert ck["counters"] == {"frames": 2} and problems == []
        else:
            assert ck["counters"] == {"frames": 1} and len(problems) == 1, offset


def test_each_part_round_trips_under_its_own_group(tmp_path):
    model, opt = trained()
    path = str(tmp_path / "checkpoint.h5")
    blob = np.frombuffer(b"env state bytes", dtype=np.uint8)
    parts = {"env": blob, "stats": {"return_window": np.ones((2, 2))}, "population": {"waiting_round": 3}}
    save_checkpoint(path, model, opt, {"frames": 1}, np.random.default_rng(0), "c", parts=parts)
    loaded = load_checkpoint(path)["parts"]
    assert loaded["env"].tobytes() == b"env state bytes" and loaded["population"] == {"waiting_round": 3}
    assert loaded["stats"]["return_window"].tolist() == [[1, 1], [1, 1]]
    with h5py.File(path) as f:
        assert set(f["parts"]) == {"0000", "0001", "0002"} and "extra" not in f


def test_a_copy_through_the_checkpoints_takes_the_parents_state_and_keeps_the_members_own(tmp_path):
    """A packed population's exploit (io/checkpoint.adopt_into): the member's checkpoint takes the
    parent's weights, Adam state and step state, and the new hyperparameters; it keeps its own
    counters, random streams, env state and config; its fitness window starts again, no round is
    left marked, and the checkpoint it replaced is its previous one."""
    parent_model, parent_opt = trained()
    torch.manual_seed(1)
    model = build_model(EnvSpaces((4,), "float32", 2), ModelConfig(hidden_sizes=[8]))
    opt = Adam(model.parameters(), lr=1e-3)
    parent, child = str(tmp_path / "parent.h5"), str(tmp_path / "child.h5")
    save_checkpoint(parent, parent_model, parent_opt, {"frames": 512}, np.random.default_rng(1), "parent",
                    parts={"step": {"scale": np.array([2.0])}, "hyperparameters": {"lr": 0.01, "ent_coef": 0.1}})
    own = {"step": {"scale": np.array([5.0])}, "hyperparameters": {"lr": 0.5, "ent_coef": 0.3},
           "stats": {"return_window": np.ones((2, 2))}, "env": np.arange(3, dtype=np.uint8),
           "population": {"waiting_round": 0, "turn_round": 4, "turn_fitness": 1.5}}
    save_checkpoint(child, model, opt, {"frames": 520}, np.random.default_rng(2), "child", parts=own)
    before = load_checkpoint(child)
    adopt_into(child, parent, {"lr": 0.0125})
    after, source = load_checkpoint(child), load_checkpoint(parent)
    assert all(torch.equal(after["model"][k], source["model"][k]) for k in source["model"])
    state, parents = after["optimizer"]["state"], source["optimizer"]["state"]
    assert all(torch.equal(state[i][k], parents[i][k]) for i in parents for k in parents[i])
    assert after["counters"] == before["counters"] and after["config"] == "child"
    assert after["rng"]["numpy"] == before["rng"]["numpy"]
    parts = after["parts"]
    assert parts["step"]["scale"].tolist() == [2.0] and parts["hyperparameters"] == {"lr": 0.0125, "ent_coef": 0.3}
    assert parts["env"].tolist() == [0, 1, 2] and parts["stats"] == {} and parts["population"] == {"waiting_round": 0}
    assert load_checkpoint(child.replace(".h5", ".prev.h5"))["counters"] == before["counters"]


def test_a_checkpoint_of_a_flat_extra_group_resumes_with_its_parts_sorted_out(tmp_path):
    """Checkpoints written before parts had groups of their own hold one flat /extra group."""
    model, opt = trained()
    path = str(tmp_path / "checkpoint.h5")
    save_checkpoint(path, model, opt, {"frames": 1}, np.random.default_rng(0), "c")
    extra = {"step": {"updates": 4}, "return_window": np.zeros((1, 2)), "rating": np.ones(3),
             "hyperparameters": {"lr": 0.01}, "population_waiting_round": 2, "league_ring": np.zeros(4),
             "env_state": np.zeros(5, dtype=np.uint8), "no_longer_read": 1}
    with h5py.File(path, "r+") as f:
        del f["parts"]
        _write_tree(f.create_group("extra"), extra)
        f.attrs["sha256"] = _digest(f)
    parts = load_checkpoint(path)["parts"]
    assert sorted(parts) == ["env", "hyperparameters", "league", "population", "stats", "step"]
    assert parts["step"] == {"updates": 4} and parts["population"] == {"waiting_round": 2}
    assert sorted(parts["stats"]) == ["rating", "return_window"] and list(parts["league"]) == ["league_ring"]


def test_a_checkpoint_whose_config_predates_a_key_resumes_with_its_default(tmp_path):
    from hpcrl.io import rundir
    from hpcrl.core.config import ConfigError, parse_config
    text = f"run: {{output_dir: {tmp_path}, name: old}}\nmodel: {{hidden_sizes: [8]}}\n"  # no model.obs_norm
    model, opt = trained()
    (tmp_path / "old").mkdir()
    save_checkpoint(str(tmp_path / "old" / "checkpoint.h5"), model, opt, {"frames": 10, "policy_version": 1},
                    np.random.default_rng(0), text)
    start = rundir.prepare(parse_config(text), overwrite=False)  # obs_norm missing there = false here
    assert start.resume_file and start.start_version == 1
    with pytest.raises(ConfigError, match="model.obs_norm = False, the config now says True"):
        rundir.prepare(parse_config(text.replace("hidden_sizes: [8]", "hidden_sizes: [8], obs_norm: true")),
                       overwrite=False)
