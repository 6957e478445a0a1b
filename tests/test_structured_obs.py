"""Dict and Tuple observations: one message field per leaf (no pickling), per-key encoders and
normalisers, and whole runs on a nested Dict env and on MiniGrid."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.core.dataflow import fragment_record, inference_messages
from hpcrl.core.messages import request_spec
from hpcrl.core.observations import Leaf, ObsLeaves
from hpcrl.envs.obs_leaves import leaves_of
from hpcrl.envs import env_spaces
from hpcrl.io.metrics import read_metrics
from hpcrl.models import build_policy
from hpcrl.runtime import comm
from tests.conftest import mpirun, run_dir, small_config, write_config

DICT_ENV = "{id: 'tests.custom_envs:DictCartPole', num_envs: 4, kwargs: {max_episode_steps: 20}}"


def test_a_nested_dict_space_becomes_leaves_and_text_is_left_out_with_a_warning():
    space = gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (2, 3), np.float32), "b": gym.spaces.Discrete(5),
                             "c": gym.spaces.Tuple((gym.spaces.MultiBinary(4), gym.spaces.Text(8)))})
    said = []
    layout = leaves_of(space, warn=said.append)
    assert layout.leaves == (Leaf("a", (2, 3), "float32"), Leaf("b", (), "int64", categories=5),
                             Leaf("c.0", (4,), "int8"))
    assert layout.dropped == ("c.1",) and "c.1" in said[0]
    obs = space.sample()
    flat = layout.flatten(obs)
    assert set(flat) == {"a", "b", "c.0"} and np.array_equal(flat["c.0"], obs["c"][0])
    with pytest.raises(ValueError, match="observation key 'x' has space"):
        leaves_of(gym.spaces.Dict({"x": gym.spaces.Graph(gym.spaces.Box(0, 1, (1,)), None)}))


def test_dict_messages_have_a_field_per_leaf_and_round_trip_over_mpi():
    layout = ObsLeaves((Leaf("image", (3, 4), "uint8"), Leaf("dir", (), "int64", categories=4),
                        Leaf("pos.0", (2,), "float32")))
    spec = request_spec(5, layout, None)
    names = [f.name for f in spec.fields]
    assert names == ["obs.image", "obs.dir", "obs.pos.0", "final_obs.image", "final_obs.dir", "final_obs.pos.0"]
    sent, got = spec.allocate(), spec.allocate()
    rng = np.random.default_rng(0)
    for key, leaf in sent["obs"].items():
        leaf[...] = rng.integers(0, 4, size=leaf.shape)
    sent["final_obs"]["image"][:2] = 7
    sent.set(version=3, n_final=2)
    me = comm.JOB.Get_rank()
    nbytes = spec.prefix_nbytes("final_obs", 2)  # the last leaf's first 2 rows; the others whole
    assert nbytes == spec.offsets["final_obs.pos.0"] + 2 * 2 * 4
    request = comm.JOB.Irecv(got.buffer, source=me, tag=77)
    comm.JOB.Send([sent.buffer[:nbytes], comm.MPI.BYTE], dest=me, tag=77)
    request.Wait()
    assert got.get("version") == 3 and got.get("n_final") == 2
    for key in sent["obs"]:
        np.testing.assert_array_equal(got["obs"][key], sent["obs"][key])
    np.testing.assert_array_equal(got["final_obs"]["image"][:2], 7)


def test_each_key_gets_its_own_encoder_and_normaliser():
    cfg = parse_config(f"env: {DICT_ENV}\nmodel: {{hidden_sizes: [8], obs_norm: true}}")
    spaces = env_spaces(cfg.env)
    assert [leaf.key for leaf in spaces.obs_leaves.leaves] == ["cart", "parity", "pole.0", "pole.1"]  # Dict sorts
    model = build_policy(spaces, cfg)
    kinds = dict(zip(model.structured.keys, model.structured.kinds))
    assert kinds == {"cart": "numbers", "pole.0": "numbers", "pole.1": "numbers", "parity": "discrete"}
    assert model.structured.width == 2 + 16 + 1 + 1  # numbers as they are, an embedding of 16
    assert set(model.structured.norms) == {"leaf0", "leaf2", "leaf3"}  # not the Discrete leaf
    rng = np.random.default_rng(1)
    batch = {"cart": torch.as_tensor(rng.normal(3.0, 2.0, (500, 2)), dtype=torch.float32),
             "pole.0": torch.as_tensor(rng.normal(-1.0, 0.5, (500, 1)), dtype=torch.float32),
             "pole.1": torch.zeros(500, 1), "parity": torch.as_tensor(rng.integers(0, 2, 500))}
    model.update_obs_norm(batch)
    np.testing.assert_allclose(model.structured.norms["leaf0"].mean.numpy(), batch["cart"].double().mean(0), atol=1e-6)
    np.testing.assert_allclose(model.structured.norms["leaf2"].var.numpy(),
                               batch["pole.0"].double().var(0, unbiased=False), atol=1e-6)
    logp, entropy, values = model.evaluate(batch, torch.zeros(500, dtype=torch.long))
    assert logp.shape == values.shape == (500,)
    image = ObsLeaves((Leaf("frame", (4, 84, 84), "uint8"), Leaf("speed", (1,), "float32")))
    from hpcrl.models.structured import StructuredInput
    assert StructuredInput(image, obs_norm=False).kinds == ["image", "numbers"]  # the Nature CNN for frames


def test_dict_observations_refuse_what_cannot_take_them():
    for encoder, what in (("cnn", "image"), ("grid", "board")):
        with pytest.raises(ConfigError, match=f"model.encoder: {encoder} reads Box {what} observations"):
            cfg = parse_config(f"env: {DICT_ENV}\nmodel: {{encoder: {encoder}}}")
            build_policy(env_spaces(cfg.env), cfg)


@pytest.mark.parametrize("ranks, mode, core", [(1, "sync", "none"), (3, "async", "gru")])
def test_a_dict_env_trains_and_plays_through_every_path(tmp_path, ranks, mode, core):
    """Serial (inline policy), and 3 ranks with a policy server and a recurrent core: the leaves
    travel in requests and fragments, the trainer and `hpcrl eval` read them."""
    cfg = small_config(tmp_path, run={"total_frames": 1024}, env={"id": "tests.custom_envs:DictCartPole",
                                                                   "kwargs": {"max_episode_steps": 20}},
                       algo={"mode": mode}, model={"core": core, "core_size": 8, "obs_norm": True},
                       roles={"learner": {"ranks": 1}, "inference": {"ranks": 1 if ranks > 1 else 0},
                              "env": {"ranks": "rest"}})
    path = write_config(tmp_path, cfg)
    result = mpirun(ranks, "run", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "observation keys mission are text" in result.stderr
    metrics = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    assert metrics["frames"][-1] >= 1024 and metrics["episodes"].sum() > 0
    played = mpirun(1, "eval", str(run_dir(cfg)), "--episodes", "2", "--trust-code")
    assert played.returncode == 0 and "2 episodes" in played.stdout, played.stdout + played.stderr


@pytest.mark.parametrize("ranks, core", [(1, "none"), (3, "gru")])
def test_a_dict_env_trains_with_dqn_and_r2d2(tmp_path, ranks, core):
    """DQN's transitions (serial) and R2D2's sequences (3 ranks, a policy server) carry a field per
    leaf of s and s'; the replay stores them, the learner regroups them, and `hpcrl eval` plays."""
    cfg = small_config(tmp_path, run={"total_frames": 2048}, env={"id": "tests.custom_envs:DictCartPole",
                                                                   "kwargs": {"max_episode_steps": 20}},
                       model={"core": core, "core_size": 8},
                       roles={"learner": {"ranks": 1}, "inference": {"ranks": 1 if ranks > 1 else 0},
                              "env": {"ranks": "rest"}})
    cfg["algo"] = {"name": "dqn", "rollout_length": 8,
                   "dqn": {"batch_size": 16, "gradient_steps": 2, "sequence_length": 8, "burn_in": 2,
                           "sequence_period": 4, "eps_schedule": "linear", "eps_decay_frames": 1000},
                   "replay": {"capacity": 5000, "warmup": 64, "replay_ratio": 1}}
    result = mpirun(ranks, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    assert metrics["frames"][-1] >= 2048 and metrics["policy_version"][-1] > 5 and metrics["replay_size"][-1] >= 64
    played = mpirun(1, "eval", str(run_dir(cfg)), "--episodes", "2", "--trust-code")
    assert played.returncode == 0 and "2 episodes" in played.stdout, played.stdout + played.stderr


def test_minigrid_runs_with_its_dict_observations(tmp_path):
    cfg = small_config(tmp_path, run={"total_frames": 512}, env={"id": "minigrid:MiniGrid-DoorKey-5x5-v0"},
                       roles={"learner": {"ranks": 1}, "inference": {"ranks": 0}, "env": {"ranks": "rest"}})
    spaces = env_spaces(parse_config(f"env: {{id: 'minigrid:MiniGrid-DoorKey-5x5-v0'}}").env)
    assert [leaf.key for leaf in spaces.obs_leaves.leaves] == ["direction", "image"]
    assert spaces.obs_leaves.dropped == ("mission",)
    result = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_scalar_leaf_is_one_number_with_its_own_normaliser():
    from hpcrl.models.structured import StructuredInput
    encoder = StructuredInput(ObsLeaves((Leaf("speed", (), "float32"), Leaf("grid", (2, 3), "uint8"))), obs_norm=True)
    speed = torch.randn(64) * 3.0 + 1.0
    encoder.update_norms({"speed": speed, "grid": torch.zeros(64, 2, 3, dtype=torch.uint8)}, lambda m: m)
    assert float(encoder.norms["leaf0"].mean) == pytest.approx(float(speed.double().mean()))
    assert encoder({"speed": speed, "grid": torch.zeros(64, 2, 3, dtype=torch.uint8)}).shape == (64, 1 + 6)
