"""Models: heads against torch.distributions, the Nature CNN, the observation normaliser (its math,
the weights message, checkpoints, and its synchronisation across learners in real mpirun jobs)."""
import numpy as np
import pytest
import torch

from hpcrl.io.checkpoint import load_checkpoint, save_checkpoint
from hpcrl.core.config import ConfigError, ModelConfig, parse_config
from hpcrl.envs import EnvSpaces
from hpcrl.io.metrics import read_metrics
from hpcrl.models import (PolicyRunner, build_model, copy_params_to, load_params_from, num_params, policy_digest,
                          policy_tensors)
from hpcrl.models.layers import SpatialPolicy
from tests.conftest import mpirun, run_dir, small_config, write_config

DISCRETE = EnvSpaces((3,), "float32", 4)
BOX = EnvSpaces((5,), "float32", 0, action_shape=(3,), action_dtype="float32",
                action_low=(-0.1,) * 3, action_high=(0.1,) * 3)
FRAMES = EnvSpaces((4, 84, 84), "uint8", 6)


def gaussian_model(**cfg):
    torch.manual_seed(0)
    model = build_model(BOX, ModelConfig(hidden_sizes=[8], **cfg))
    with torch.no_grad():
        model.log_std.copy_(torch.tensor([-0.5, 0.0, 0.7]))  # distinct per dimension
    return model


# --- heads ---------------------------------------------------------------------------------------------

def test_gaussian_log_prob_and_entropy_match_torch_normal():
    model = gaussian_model()
    obs, actions = torch.randn(10, 5), torch.randn(10, 3)
    logp, entropy, values = model.evaluate(obs, actions)
    reference = torch.distributions.Normal(model.mode(obs), model.log_std.exp())
    torch.testing.assert_close(logp, reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))
    assert values.shape == (10,)
    sampled, sampled_logp, sampled_values = model.sample(obs)
    assert sampled.shape == (10, 3) and sampled.dtype == torch.float32
    torch.testing.assert_close(sampled_logp, reference.log_prob(sampled).sum(-1))
    torch.testing.assert_close(sampled_values, values)


def test_gaussian_starts_at_std_one_and_samples_are_not_clipped():
    torch.manual_seed(0)
    model = build_model(BOX, ModelConfig())
    assert torch.equal(model.log_std, torch.zeros(3))  # CleanRL's init: std 1
    actions, _, _ = model.sample(torch.randn(1000, 5), torch.Generator().manual_seed(1))
    assert actions.abs().max() > 1.0  # far outside the +-0.1 bounds: env ranks clip, the fragment does not
    assert actions.std().item() == pytest.approx(1.0, abs=0.1)


def test_gaussian_log_std_gets_a_gradient_from_the_entropy():
    model = gaussian_model()
    _, entropy, _ = model.evaluate(torch.randn(4, 5), torch.randn(4, 3))
    entropy.mean().backward()
    torch.testing.assert_close(model.log_std.grad, torch.ones(3))


def test_categorical_log_prob_and_entropy_match_torch_categorical():
    torch.manual_seed(1)
    model = build_model(DISCRETE, ModelConfig(hidden_sizes=[8]))
    obs, actions = torch.randn(10, 3), torch.randint(0, 4, (10,))
    logp, entropy, _ = model.evaluate(obs, actions)
    reference = torch.distributions.Categorical(logits=model.actor(obs))
    torch.testing.assert_close(logp, reference.log_prob(actions))
    torch.testing.assert_close(entropy, reference.entropy())
    sampled, sampled_logp, _ = model.sample(obs)
    assert sampled.dtype == torch.int64
    torch.testing.assert_close(sampled_logp, reference.log_prob(sampled))


def test_mode_is_the_argmax_or_the_mean():
    torch.manual_seed(2)
    model = build_model(DISCRETE, ModelConfig(hidden_sizes=[8]))
    obs = torch.randn(20, 3)
    assert torch.equal(model.mode(obs), model.log_probs(obs).argmax(-1))
    gaussian = gaussian_model()
    obs = torch.randn(20, 5)
    mean = gaussian.actor(obs)
    assert torch.equal(gaussian.mode(obs), mean)
    best, _, _ = gaussian.evaluate(obs, gaussian.mode(obs))
    sampled, sampled_logp, _ = gaussian.sample(obs)
    assert (best > sampled_logp).all()  # no sample is more likely than the mode


@pytest.mark.parametrize("core", ["none", "gru"])
def test_a_playing_runner_answers_with_the_holders_samples_or_the_mode(core):
    """hpcrl eval's runners (`play`): "sample" draws the actions a holder's runner draws from the
    same seed, "greedy" takes the mode under the mask; a recurrent one advances the rows' states
    as the model's own step does."""
    torch.manual_seed(4)
    model = build_model(DISCRETE, ModelConfig(hidden_sizes=[8], core=core, core_size=6))
    obs = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    mask = np.ones((6, 4), np.uint8)
    mask[:3, 1:] = 0  # rows 0-2 may only take action 0
    state = np.random.default_rng(1).normal(size=(6, 6)).astype(np.float32) if model.recurrent else None
    held = {"actions": np.zeros(6, np.int64), "logp": np.zeros(6, np.float32), "values": np.zeros(6, np.float32)}
    PolicyRunner(model, "cpu", seed=3).act(obs, held, mask, None if state is None else state.copy())
    sampler = PolicyRunner(model, "cpu", seed=3, play="sample")
    assert sampler.outputs == ("actions",)
    played = {"actions": np.zeros(6, np.int64)}
    sampler.act(obs, played, mask, None if state is None else state.copy())
    np.testing.assert_array_equal(played["actions"], held["actions"])
    greedy = {"actions": np.zeros(6, np.int64)}
    advanced = None if state is None else state.copy()
    PolicyRunner(model, "cpu", seed=3, play="greedy").act(obs, greedy, mask, advanced)
    with torch.no_grad():
        extra = () if state is None else (torch.as_tensor(state),)
        mode = model.mode(torch.as_tensor(obs), torch.as_tensor(mask).bool(), *extra)
    if model.recurrent:
        mode, after = mode
        np.testing.assert_array_equal(advanced, after.numpy())
    np.testing.assert_array_equal(greedy["actions"], mode.numpy())
    assert (greedy["actions"][:3] == 0).all()
    with pytest.raises(ValueError, match="play: expected None or one of"):
        PolicyRunner(model, "cpu", seed=3, play="best")


# --- encoders ------------------------------------------------------------------------------------------

def test_nature_cnn_shapes_and_one_trunk_for_both_heads():
    torch.manual_seed(0)
    model = build_model(FRAMES, ModelConfig())  # auto: 3-D observations -> cnn
    convs = [m for m in model.trunk if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (4, 32, (8, 8), (4, 4)), (32, 64, (4, 4), (2, 2)), (64, 64, (3, 3), (1, 1))]
    fc = [m for m in model.trunk if isinstance(m, torch.nn.Linear)]
    assert [(f.in_features, f.out_features) for f in fc] == [(64 * 7 * 7, 512)]
    assert (model.actor.in_features, model.actor.out_features) == (512, 6)
    assert (model.critic.in_features, model.critic.out_features) == (512, 1)
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    actions, logp, values = model.sample(obs)
    assert actions.shape == logp.shape == values.shape == (5,)
    assert model.mode(obs).shape == (5,)
    # the critic's loss trains the shared trunk too
    model.value(obs).sum().backward()
    assert convs[0].weight.grad.abs().sum() > 0 and model.actor.weight.grad is None


def test_uint8_frames_are_scaled_by_1_over_255_inside_the_model():
    torch.manual_seed(0)
    model = build_model(FRAMES, ModelConfig())
    as_floats = build_model(EnvSpaces((4, 84, 84), "float32", 6), ModelConfig())
    as_floats.load_state_dict(model.state_dict())
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    scaled = frames.float() / 255.0
    torch.testing.assert_close(model.features(frames), as_floats.features(scaled))
    # what inference ranks and learners pass: float32 tensors of byte values, or the bytes themselves
    torch.testing.assert_close(model.features(frames.float()), model.features(frames))
    runner = PolicyRunner(model, "cpu", seed=0)
    values = np.zeros(3, dtype=np.float32)
    runner.value(frames.numpy(), values)
    np.testing.assert_allclose(values, as_floats.value(scaled).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_mlp_encoder_on_frames_flattens_them():
    torch.manual_seed(0)
    small = EnvSpaces((2, 6, 6), "uint8", 3)
    model = build_model(small, ModelConfig(encoder="mlp", hidden_sizes=[8]))
    assert model.actor[0].in_features == 72
    actions, _, _ = model.sample(torch.randint(0, 256, (4, 2, 6, 6), dtype=torch.uint8))
    assert actions.shape == (4,)


def test_grid_encoder_keeps_the_board_reads_planes_channel_last_and_is_one_trunk():
    """Connect four's observations: a 6 x 7 board of 2 planes, channel-last (PettingZoo classic)."""
    torch.manual_seed(0)
    board = EnvSpaces((6, 7, 2), "int8", 7)
    model = build_model(board, ModelConfig(encoder="grid", hidden_sizes=[32], activation="relu"))
    convs = [m for m in model.trunk if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (2, 32, (3, 3), (1, 1)), (32, 32, (3, 3), (1, 1))]
    assert (model.actor.in_features, model.critic.in_features) == (32, 32)
    obs = torch.zeros((1, 6, 7, 2))
    obs[0, 5, 3, 1] = 1.0  # the opponent's piece at the bottom of column 3
    first = model.trunk[1](model.trunk[0](obs))  # after the first convolution: [N, 32, 6, 7]
    assert first.shape == (1, 32, 6, 7)
    torch.testing.assert_close(first[0, :, 5, 3], convs[0].weight[:, 1, 1, 1] + convs[0].bias)  # its centre tap
    torch.testing.assert_close(first[0, :, 0, 0], convs[0].bias)  # far from the piece: nothing but the bias
    actions, logp, values = model.sample(torch.randint(0, 2, (5, 6, 7, 2)).to(torch.int8))
    assert actions.shape == logp.shape == values.shape == (5,)
    model.value(obs).sum().backward()  # the critic's loss trains the shared convolutions too
    assert convs[0].weight.grad.abs().sum() > 0 and model.actor.weight.grad is None


def test_grid_convs_set_the_grid_encoders_convolutions_and_valid_ones_shrink_the_board():
    """model.grid_convs: [channels, kernel] keeps the 6 x 7 board (an even kernel padded one more
    after than before), [channels, kernel, valid] reads each kernel x kernel window once; a stack
    that leaves nothing of the board, or a malformed entry, is a config error."""
    board = EnvSpaces((6, 7, 2), "int8", 7)
    cfg = parse_config("model: {encoder: grid, hidden_sizes: [16], grid_convs: [[8, 4, valid], [4, 1]]}").model
    model = build_model(board, cfg)
    convs = [m for m in model.trunk if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.padding) for c in convs] == [(8, (4, 4), (0, 0)), (4, (1, 1), (0, 0))]
    assert model.actor.in_features == 16 and model.trunk[-2][0].in_features == 4 * 3 * 4  # 3 x 4 windows of 4 x 4
    obs = torch.zeros((1, 6, 7, 2))
    obs[0, 5, 6, 0] = 1.0  # the bottom right cell: only the last window reads it
    windows = model.trunk[2](model.trunk[1](model.trunk[0](obs)))[0]  # after the first convolution and ReLU
    torch.testing.assert_close(windows[:, 2, 3], torch.relu(convs[0].weight[:, 0, 3, 3] + convs[0].bias))
    torch.testing.assert_close(windows[:, 0, 0], torch.relu(convs[0].bias))
    even = build_model(board, parse_config("model: {encoder: grid, hidden_sizes: [16], grid_convs: [[8, 4]]}").model)
    assert even.trunk[1].padding == (1, 2, 1, 2) and even.trunk[3](even.trunk[2](even.trunk[1](
        even.trunk[0](obs)))).shape == (1, 8, 6, 7)
    with pytest.raises(ConfigError, match=r"model.grid_convs: the 'valid' convolutions of \[\[8, 4, 'valid'\], "
                                          r"\[8, 4, 'valid'\]\] leave nothing of the 6 x 7 board"):
        build_model(board, parse_config("model: {encoder: grid, grid_convs: [[8, 4, valid], [8, 4, valid]]}").model)
    for bad in ("[[8, 4, full]]", "[[0, 3]]", "[[8]]", "[]", "[[8, 3.5]]"):
        with pytest.raises(ConfigError, match=r"model.grid_convs: expected a list of 1 to 64 convolutions, each "
                                              r"\[channels, kernel\] or \[channels, kernel, valid\]"):
            parse_config(f"model: {{grid_convs: {bad}}}")


def test_a_columns_policy_knows_a_pattern_in_every_column_and_cells_one_logit_per_cell():
    """model.grid_policy: columns reads the convolutions' map with one 1x1 convolution, so the same
    three-piece stack shifted one column over shifts its logit with it (away from the borders'
    padding); the critic has an MLP of its own; cells gives tic-tac-toe a logit per square."""
    torch.manual_seed(0)
    board = EnvSpaces((6, 7, 2), "int8", 7)
    cfg = parse_config("model: {encoder: grid, grid_policy: columns, hidden_sizes: [16], grid_convs: [[8, 3], [8, 3]]}")
    model = build_model(board, cfg.model)
    assert isinstance(model.actor, SpatialPolicy) and model.critic[1][0].in_features == 8 * 6 * 7
    torch.nn.init.normal_(model.actor.conv.weight)  # a policy that is not near-uniform, to compare logits
    stacks = torch.zeros((2, 6, 7, 2))
    stacks[0, 3:, 2, 0] = 1.0  # three of the agent's pieces in column 2
    stacks[1, 3:, 3, 0] = 1.0  # the same in column 3
    logits = model.actor(model.features(stacks))
    assert logits.shape == (2, 7)
    torch.testing.assert_close(logits[0, 2], logits[1, 3])
    assert not torch.allclose(logits[0, 2], logits[0, 5])
    model.value(stacks).sum().backward()
    assert model.trunk[1].weight.grad.abs().sum() > 0 and model.actor.conv.weight.grad is None
    squares = EnvSpaces((3, 3, 2), "int8", 9)  # tic-tac-toe: square 3 i + j is the observation's [i, j]
    cells = build_model(squares, parse_config("model: {encoder: grid, grid_policy: cells, grid_convs: [[4, 1]]}").model)
    torch.nn.init.normal_(cells.actor.conv.weight)
    piece = torch.zeros((1, 3, 3, 2))
    piece[0, 1, 2, 0] = 1.0  # 1x1 convolutions: only its own square's logit moves off the zero biases
    assert torch.nonzero(cells.actor(cells.features(piece))[0]).flatten().tolist() == [5]
    with pytest.raises(ConfigError, match=r"model.grid_policy: columns gives one action per column of the "
                                          r"convolutions' 3 x 4 map, 4 in all, and this env has 7 actions"):
        build_model(board, parse_config("model: {encoder: grid, grid_policy: columns, "
                                        "grid_convs: [[8, 4, valid]]}").model)
    with pytest.raises(ConfigError, match=r"model.grid_policy: cells reads the grid encoder's map, so it needs "
                                          r"model.encoder: grid and model.core: none"):
        parse_config("model: {encoder: grid, grid_policy: cells, core: lstm}")
    with pytest.raises(ConfigError, match=r"model.grid_policy: columns is an actor-critic's policy head, and dqn "
                                          r"trains a Q-network"):
        parse_config("algo: {name: dqn}\nmodel: {encoder: grid, grid_policy: columns}")
    with pytest.raises(ConfigError, match=r"model.grid_policy: expected one of mlp, columns, landing, cells, got 'rows'"):
        parse_config("model: {encoder: grid, grid_policy: rows}")


def test_a_landing_policy_reads_the_cell_a_piece_lands_on_and_nothing_above_it():
    """model.grid_policy: landing gives each column the logit of its lowest empty cell (row 0 is
    the top): the 1x1 convolution's value there, whatever the cells above it hold, so a line that
    could be made one row higher is not yet a move; a full column reads row 0 (the mask drops it).
    The critic reads the taken cells too; 'valid' convolutions, which shrink the map, are refused."""
    torch.manual_seed(0)
    board = EnvSpaces((6, 7, 2), "int8", 7)
    model = build_model(board, parse_config("model: {encoder: grid, grid_policy: landing, hidden_sizes: [16], "
                                            "grid_convs: [[8, 3], [8, 3]]}").model)
    assert isinstance(model.actor, SpatialPolicy) and model.critic[1][0].in_features == (8 + 1) * 6 * 7
    torch.nn.init.normal_(model.actor.conv.weight)
    torch.nn.init.normal_(model.actor.conv.bias)
    boards = torch.zeros((1, 6, 7, 2))
    boards[0, 5, 0, 0] = boards[0, 4, 0, 1] = 1.0  # column 0: two pieces, lands on row 3
    boards[0, :, 1, 1] = 1.0                      # column 1: full
    boards[0, 5, 2, 1] = 1.0                      # column 2: one piece, lands on row 4
    x = model.features(boards)
    cells = model.actor.conv(x[:, :-1])[0, 0]     # every cell's logit, [6, 7]
    landing = [3, 0, 4, 5, 5, 5, 5]
    torch.testing.assert_close(model.actor(x)[0], cells[landing, torch.arange(7)])
    torch.testing.assert_close(x[0, -1], (boards[0].sum(-1) > 0).float())
    columns = SpatialPolicy(8, "columns")
    columns.conv = model.actor.conv  # the log-sum-exp head over the same cells reads every row
    assert not torch.allclose(columns(x[:, :-1])[0], model.actor(x)[0])
    with pytest.raises(ConfigError, match=r"model.grid_policy: landing reads the board's cells on the "
                                          r"convolutions' map, and 'valid' convolutions leave a 4 x 7 map of "
                                          r"the 6 x 9 board; use 'same' convolutions"):
        build_model(EnvSpaces((6, 9, 2), "int8", 7), parse_config("model: {encoder: grid, grid_policy: landing, "
                                                                  "grid_convs: [[8, 3, valid]]}").model)


@pytest.mark.parametrize("spaces,encoder,words", [
    (DISCRETE, "cnn", ["model.encoder: cnn", "[C, H, W]", "(3,)", "encoder: mlp"]),
    (DISCRETE, "grid", ["model.encoder: grid needs board observations of shape [H, W, C]", "(3,)"]),
    (EnvSpaces((3, 16, 16), "uint8", 2), "auto", ["model.encoder: auto chose cnn", ">= 36", "(3, 16, 16)"]),
    (EnvSpaces((210, 160, 3), "uint8", 2), "cnn", ["channel-first", "(210, 160, 3)"]),
])
def test_encoder_that_cannot_take_the_observations_is_a_config_error(spaces, encoder, words):
    with pytest.raises(ConfigError) as err:
        build_model(spaces, ModelConfig(encoder=encoder))
    for word in words:
        assert word in str(err.value)


def test_encoder_and_obs_norm_config_keys():
    cfg = parse_config("model: {encoder: cnn, obs_norm: true}")
    assert (cfg.model.encoder, cfg.model.obs_norm) == ("cnn", True)
    assert (parse_config("").model.encoder, parse_config("").model.obs_norm) == ("auto", False)
    with pytest.raises(ConfigError, match=r"model.encoder: expected one of auto, mlp, cnn, grid, or the import path "
                                          r"of your own torch module as 'package.module:Class', got 'resnet'"):
        parse_config("model: {encoder: resnet}")
    with pytest.raises(ConfigError, match=r"model.obs_norm: expected true/false"):
        parse_config("model: {obs_norm: 3}")


def test_config_error_for_the_encoder_reaches_the_user_as_exit_2(tmp_path):
    cfg = small_config(tmp_path, model={"encoder": "cnn"}, roles={"learner": {"ranks": 1}, "inference": {"ranks": 0}})
    result = mpirun(2, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 2
    assert "config error" in result.stderr and "model.encoder: cnn" in result.stderr
    assert "Traceback" not in result.stderr


# --- observation normaliser ----------------------------------------------------------------------------

def test_normaliser_stats_equal_numpy_over_the_concatenated_batches():
    torch.manual_seed(0)
    model = build_model(DISCRETE, ModelConfig(hidden_sizes=[8], obs_norm=True))
    assert model.obs_norm.count == 0 and torch.equal(model.obs_norm.var, torch.ones(3, dtype=torch.float64))
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=[100.0, -3.0, 0.0], scale=[5.0, 0.1, 2.0], size=(n, 3)).astype(np.float32)
               for n in (64, 7, 200)]
    for b in batches:
        model.update_obs_norm(torch.from_numpy(b))
    everything = np.concatenate(batches).astype(np.float64)
    assert model.obs_norm.count.item() == len(everything)
    np.testing.assert_allclose(model.obs_norm.mean.numpy(), everything.mean(0), rtol=1e-9)
    np.testing.assert_allclose(model.obs_norm.var.numpy(), everything.var(0), rtol=1e-6)
    # and the forward normalises with them, clipped at 10
    x = torch.tensor([[100.0, -3.0, 0.0], [1e4, -1e4, 0.0]])
    expected = (x.double() - torch.from_numpy(everything.mean(0))) / torch.from_numpy(np.sqrt(everything.var(0) + 1e-8))
    normalised = model.obs_norm(x)
    torch.testing.assert_close(normalised[0], expected[0].float(), rtol=1e-4, atol=1e-4)
    assert normalised[1].tolist()[:2] == [10.0, -10.0]


def test_summed_moments_of_several_learners_merge_like_one_batch():
    """What the learners' allreduce does: each contributes its batch's moments, all merge the sum."""
    torch.manual_seed(0)
    learners = [build_model(DISCRETE, ModelConfig(obs_norm=True)) for _ in range(3)]
    rng = np.random.default_rng(1)
    seen = []
    for _ in range(2):  # two updates
        batches = [torch.from_numpy(rng.normal(3.0, 2.0, size=(32 + i, 3)).astype(np.float32)) for i in range(3)]
        total = sum(m.obs_norm.moments(b) for m, b in zip(learners, batches))  # the allreduce's sum
        for m, b in zip(learners, batches):
            m.update_obs_norm(b, reduce=lambda mine: total)
        seen += batches
    for m in learners[1:]:
        for a, b in zip(m.obs_norm.buffers(), learners[0].obs_norm.buffers()):
            assert torch.equal(a, b)  # identical, bit for bit
    everything = torch.cat(seen).double().numpy()
    assert learners[0].obs_norm.count.item() == len(everything) == 2 * (32 + 33 + 34)
    np.testing.assert_allclose(learners[0].obs_norm.mean.numpy(), everything.mean(0), rtol=1e-9)
    np.testing.assert_allclose(learners[0].obs_norm.var.numpy(), everything.var(0), rtol=1e-6)


def test_normaliser_applies_in_every_forward_and_uint8_frames_are_scaled_first():
    torch.manual_seed(0)
    model = build_model(EnvSpaces((2, 6, 6), "uint8", 3), ModelConfig(encoder="mlp", obs_norm=True))
    frames = torch.randint(0, 256, (50, 2, 6, 6), dtype=torch.uint8)
    model.update_obs_norm(frames)
    scaled = frames.double() / 255
    np.testing.assert_allclose(model.obs_norm.mean.numpy(), scaled.mean(0).numpy(), rtol=1e-6)
    normalised = model.features(frames)
    assert normalised.shape == (50, 72)
    np.testing.assert_allclose(normalised.mean(0).detach().numpy(), 0.0, atol=1e-5)
    np.testing.assert_allclose(normalised.std(0, unbiased=False).detach().numpy(), 1.0, rtol=1e-3)


def test_weights_message_round_trip_carries_the_normaliser():
    torch.manual_seed(0)
    learner = build_model(DISCRETE, ModelConfig(hidden_sizes=[8], obs_norm=True))
    learner.update_obs_norm(torch.randn(100, 3) * 4 + 7)
    n_weights = sum(p.numel() for p in learner.parameters())
    assert num_params(learner) == n_weights + 1 + 3 + 3  # count, mean, var
    flat = np.zeros(num_params(learner), dtype=np.float32)
    copy_params_to(learner, flat)
    torch.manual_seed(99)
    holder = build_model(DISCRETE, ModelConfig(hidden_sizes=[8], obs_norm=True))  # an inference rank's copy
    load_params_from(holder, flat)
    for a, b in zip(policy_tensors(learner), policy_tensors(holder)):
        torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-6, atol=0)
    assert holder.obs_norm.count.item() == 100
    obs = torch.randn(16, 3) * 4 + 7
    # float32 in the message, float32 in the forward: the holder acts exactly as the learner
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for a, b in zip(learner.sample(obs, g1), holder.sample(obs, g2)):
        assert torch.equal(a, b)
    # without obs_norm the message is the parameters alone, as before
    plain = build_model(DISCRETE, ModelConfig(hidden_sizes=[8]))
    assert num_params(plain) == sum(p.numel() for p in plain.parameters()) and not list(plain.buffers())


def test_gaussian_weights_message_carries_the_log_std():
    model = gaussian_model()
    flat = np.zeros(num_params(model), dtype=np.float32)
    copy_params_to(model, flat)
    torch.manual_seed(5)
    other = build_model(BOX, ModelConfig(hidden_sizes=[8]))
    load_params_from(other, flat)
    assert torch.equal(other.log_std, model.log_std)


def test_digest_covers_the_normaliser_stats():
    torch.manual_seed(0)
    model = build_model(DISCRETE, ModelConfig(obs_norm=True))
    before = policy_digest(model)
    model.update_obs_norm(torch.randn(10, 3))
    assert policy_digest(model) != before


def test_checkpoint_restores_the_normaliser(tmp_path):
    torch.manual_seed(0)
    model = build_model(DISCRETE, ModelConfig(obs_norm=True))
    model.update_obs_norm(torch.randn(30, 3) + 2)
    opt = torch.optim.Adam(model.parameters())
    path = str(tmp_path / "checkpoint.h5")
    save_checkpoint(path, model, opt, {"frames": 30}, np.random.default_rng(0), "")
    fresh = build_model(DISCRETE, ModelConfig(obs_norm=True))
    fresh.load_state_dict(load_checkpoint(path)["model"])
    for a, b in zip(model.obs_norm.buffers(), fresh.obs_norm.buffers()):
        assert a.dtype == b.dtype == torch.float64 and torch.equal(a, b)


# --- real runs -----------------------------------------------------------------------------------------

def test_two_learners_hold_identical_normaliser_stats_in_a_real_run(tmp_path):
    cfg = small_config(tmp_path, run={"replica_digests": True, "total_frames": 1024}, model={"obs_norm": True},
                       roles={"learner": {"ranks": 2}, "inference": {"ranks": 0}, "env": {"ranks": "rest"}})
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stderr
    metrics = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    digests = metrics["replica_digest"]
    assert digests.shape == (len(metrics["frames"]), 2) and len(metrics["frames"]) > 1
    assert np.all(digests[:, 0] == digests[:, 1])  # weights AND normaliser stats, after every update
    stats = {k.split(".")[-1]: v.numpy() for k, v in load_checkpoint(str(run_dir(cfg) / "checkpoint.h5"))["model"].items()
             if k.startswith("obs_norm.")}
    # every frame of every update, from both learners' batches, went into the stats
    assert stats["count"] == metrics["frames"][-1] == 1024
    assert np.all(stats["var"] != 1.0) and np.all(stats["mean"] != 0.0)
    assert 0.0 < stats["var"].min() and stats["var"].max() < 10.0  # CartPole's observations, not junk


def test_serial_resume_with_obs_norm_continues_exactly(tmp_path):
    model = {"obs_norm": True}
    whole = small_config(tmp_path, name="whole", run={"total_frames": 640}, model=model)
    assert mpirun(1, "run", str(write_config(tmp_path, whole, "whole.yaml"))).returncode == 0
    halves = small_config(tmp_path, name="halves", run={"total_frames": 320}, model=model)
    path = str(write_config(tmp_path, halves, "halves.yaml"))
    assert mpirun(1, "run", path).returncode == 0
    halfway = load_checkpoint(str(run_dir(halves) / "checkpoint.h5"))["model"]["obs_norm.count"]
    assert halfway == 320
    second = mpirun(1, "run", path, "--set", "run.total_frames=640")
    assert second.returncode == 0, second.stderr
    a, b = read_metrics(str(run_dir(whole) / "metrics.h5")), read_metrics(str(run_dir(halves) / "metrics.h5"))
    for key in ("frames", "return_mean", "loss_policy", "loss_value", "entropy"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)  # the stats came back with the weights
    ca, cb = load_checkpoint(str(run_dir(whole) / "checkpoint.h5")), load_checkpoint(str(run_dir(halves) / "checkpoint.h5"))
    assert ca["model"]["obs_norm.count"] == cb["model"]["obs_norm.count"] == 640
    for key in ca["model"]:
        assert torch.equal(ca["model"][key], cb["model"][key]), key
