"""The user's own encoder (model.encoder: "package.module:Class", docs/custom-models.md): counted as
it is built, trained on 4 ranks (its module imported by the learner and the policy server only)
and serially, refused at start-up with one message when broken, and played by `hpcrl eval` only
with --trust-code."""
import copy

import pytest
import yaml

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.core.network_shapes import policy_params
from hpcrl.envs import env_spaces
from hpcrl.io.metrics import read_metrics
from hpcrl.models import build_policy, num_params
from hpcrl.models.custom import custom_trunk
from tests.conftest import REPO, mpirun, run_dir, run_hpcrl, small_config, write_config

EXAMPLE = REPO / "jobs" / "custom_model" / "minigrid_residual.yaml"


def config(cfg: dict):
    return parse_config(yaml.safe_dump(cfg), source="test")


@pytest.mark.parametrize("algo, model", [
    ("ppo", {}),
    ("ppo", {"core": "lstm", "core_size": 16}),
    ("dqn", {}),
], ids=["actor-critic", "recurrent", "q-network"])
def test_the_users_encoder_is_counted_as_it_is_built(tmp_path, algo, model):
    """The weights message's length counted without allocating (the encoder on the meta device)
    equals the built network's, parameters and buffers, for each network that takes an encoder."""
    sections = {"algo": {"name": "dqn", "replay": {"capacity": 1000, "warmup": 64}}} if algo == "dqn" else {}
    cfg = small_config(tmp_path, **sections)
    cfg["model"] = {"encoder": "tests.custom_nets:TwoLayers", "encoder_kwargs": {"width": 24}, **model}
    c = config(cfg)
    spaces = env_spaces(c.env)
    built = build_policy(spaces, c)
    assert num_params(built) == policy_params(c, spaces, custom_trunk(c.model))
    assert any(name.endswith("scale") for name, _ in built.named_buffers())  # its buffer travels too


def test_the_worked_example_reads_minigrid_dict_leaves():
    """jobs/custom_model: the residual CNN gets MiniGrid's leaves by key (the grid as floats, the
    direction as ids), and hpcrl's heads sit on its 128 outputs."""
    c = config(yaml.safe_load(EXAMPLE.read_text()))
    spaces = env_spaces(c.env)
    model = build_policy(spaces, c)
    assert model.trunk.out_features == 128 and type(model.trunk).__name__ == "ResidualGridEncoder"
    assert num_params(model) == policy_params(c, spaces, custom_trunk(c.model))
    assert not any(name.startswith("structured.encoders") for name, _ in model.named_parameters())


@pytest.mark.parametrize("encoder, message", [
    ("tests.custom_nets:WrongWidth", "tests.custom_nets:WrongWidth's forward should return floats of shape "
                                     "[batch, out_features] = [2, 8] for a batch of 2 zero observations (float32 of "
                                     "shape [2, 4]); it returned a torch.float32 tensor of shape [2, 7]"),
    ("tests.custom_nets:NoWidth", "tests.custom_nets:NoWidth should set out_features, the width of its output, to a "
                                  "positive int; it has None"),
    ("tests.custom_nets:NotAModule", "'NotAModule' is a class, but not a subclass of torch.nn.Module"),
    ("tests.custom_nets:Missing", "module 'tests.custom_nets' has no 'Missing'"),
    ("no_such_module_here:Net", "cannot import module 'no_such_module_here' for 'no_such_module_here:Net': "
                                "ModuleNotFoundError"),
])
def test_a_broken_encoder_is_one_message_naming_the_key_and_the_class(tmp_path, encoder, message):
    cfg = small_config(tmp_path)
    cfg["model"] = {"encoder": encoder}
    c = config(cfg)
    with pytest.raises(ConfigError, match="^model.encoder: ") as caught:
        build_policy(env_spaces(c.env), c)
    assert message in str(caught.value)


def test_config_checks_of_the_encoder_key_import_nothing(tmp_path):
    cfg = small_config(tmp_path)
    for model, message in (({"encoder": "my nets:Net"}, "model.encoder: expected one of auto, mlp, cnn, grid, or "
                                                         "the import path of your own torch module"),
                           ({"encoder_kwargs": {"width": 3}}, "model.encoder_kwargs: auto is a built-in encoder"),
                           ({"encoder": "os:system"}, None)):  # a well-formed path: imported only to build
        bad = copy.deepcopy(cfg)
        bad["model"] = model
        if message is None:
            assert config(bad).model.encoder == "os:system"
            continue
        with pytest.raises(ConfigError, match=message):
            config(bad)
    sac = small_config(tmp_path, env={"id": "Pendulum-v1"}, algo={"name": "sac"})
    sac["model"] = {"encoder": "tests.custom_nets:TwoLayers"}
    with pytest.raises(ConfigError, match="model.encoder: sac reads its observations with MLPs"):
        config(sac)


def test_the_example_trains_on_4_ranks_where_only_the_learner_and_the_policy_server_import_it(tmp_path):
    """MiniGrid with the worked example's residual CNN on 4 ranks (learner, policy server, 2 env
    ranks): it trains, and its module is imported on ranks 0 and 1 only, never on the torch-free
    env ranks. Then `hpcrl eval` refuses the run directory without --trust-code, and plays it with."""
    marks = tmp_path / "marks"
    marks.mkdir()
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["run"].update(output_dir=str(tmp_path / "runs"), total_frames=2048, target_return=None)
    cfg["model"]["encoder"] = "tests.custom_nets:ResidualGridEncoder"  # the example, leaving a mark per rank
    cfg["model"]["encoder_kwargs"] = {"channels": 8, "blocks": 1, "out_features": 32}
    cfg["env"]["num_envs"] = 4
    cfg["algo"].update(rollout_length=32, epochs=2, num_minibatches=2)
    path = str(write_config(tmp_path, cfg))
    done = mpirun(4, "run", path, extra_env={"HPCRL_TEST_IMPORT_MARKS": str(marks)})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert "roles: learner ranks 0; inference ranks 1; env ranks 2-3" in done.stdout, done.stdout
    assert sorted(p.name for p in marks.iterdir()) == ["rank0", "rank1"]
    assert read_metrics(str(run_dir(cfg) / "metrics.h5"))["frames"][-1] >= 2048

    refused = run_hpcrl("eval", str(run_dir(cfg)), "--episodes", "1")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert ("model.encoder 'tests.custom_nets:ResidualGridEncoder' would import module 'tests.custom_nets'"
            in refused.stderr and "pass --trust-code" in refused.stderr), refused.stderr
    played = run_hpcrl("eval", str(run_dir(cfg)), "--episodes", "1", "--trust-code")
    assert played.returncode == 0 and "1 episodes" in played.stdout, played.stdout + played.stderr


def test_a_serial_run_trains_the_users_encoder_and_a_broken_one_writes_nothing(tmp_path):
    cfg = small_config(tmp_path, roles={"inference": {"ranks": 0}}, run={"total_frames": 512})
    cfg["model"] = {"encoder": "tests.custom_nets:TwoLayers"}
    done = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert read_metrics(str(run_dir(cfg) / "metrics.h5"))["frames"][-1] >= 512

    broken = small_config(tmp_path, name="broken", roles={"inference": {"ranks": 0}})
    broken["model"] = {"encoder": "tests.custom_nets:WrongWidth"}
    refused = mpirun(1, "run", str(write_config(tmp_path, broken, "broken.yaml")))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stdout + refused.stderr
    assert "hpcrl: config error: model.encoder: tests.custom_nets:WrongWidth's forward" in refused.stderr
    assert not run_dir(broken).exists()
