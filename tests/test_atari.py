"""The Atari preset checked against the raw ALE emulator stepped by hand (same seed, no sticky
actions): frame skip with max-pooling, grey area resize, no-op and fire resets, frame stack order,
life loss as terminal while the game goes on, reward clipping against raw game scores."""
import gymnasium as gym
import numpy as np
import pytest

from hpcrl.envs import atari
from hpcrl.core.config import AtariConfig, ConfigError, EnvConfig, parse_config
from hpcrl.envs import make_env, make_vector_env, state

atari.import_ale()


def raw_game(game: str, seed: int):
    """The bare emulator as the preset makes it: one frame per step, grey, no sticky actions."""
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0, obs_type="grayscale")
    frame, _ = env.reset(seed=seed)
    return env, frame


def area_resize(frame: np.ndarray, size: int = 84) -> np.ndarray:
    """Area averaging done another way: repeat pixels up to a common multiple of both sizes, then
    sum equal blocks (210 -> 420 rows -> 84 blocks of 5; 160 -> 3360 columns -> 84 blocks of 40)
    and divide, rounding halves up."""
    (h, w), out, count = frame.shape, np.asarray(frame, np.int64), 1
    for axis, n in ((0, h), (1, w)):
        common = np.lcm(n, size)
        out = np.repeat(out, common // n, axis=axis)
        out = out.reshape(*out.shape[:axis], size, common // size, *out.shape[axis + 1:]).sum(axis=axis + 1)
        count *= common // size
    return ((2 * out + count) // (2 * count)).astype(np.uint8)


def preset(**atari_options) -> EnvConfig:
    """Breakout with the preset, no sticky actions unless asked."""
    return EnvConfig(id="ALE/Breakout-v5", preset="atari",
                     atari=AtariConfig(**{"repeat_action_probability": 0.0, **atari_options}))


def test_area_resize_matches_block_averaging():
    frame = np.random.default_rng(0).integers(0, 256, (210, 160)).astype(np.uint8)
    frames = atari.AtariFrames(raw_game("Breakout", 0)[0], noop_max=0, frame_skip=1, size=84)
    np.testing.assert_array_equal(frames.resize(frame), area_resize(frame))
    flat = np.full((210, 160), 77, np.uint8)
    assert (frames.resize(flat) == 77).all()


def test_frame_skip_max_pools_the_last_two_frames_and_sums_rewards():
    env, _ = raw_game("Breakout", seed=5)
    frames = atari.AtariFrames(env, noop_max=0, frame_skip=4, size=84)
    obs, _ = frames.reset(seed=5)
    by_hand, first = raw_game("Breakout", seed=5)
    np.testing.assert_array_equal(obs, area_resize(first))
    rng, pooled_differs = np.random.default_rng(1), 0
    for _ in range(60):
        action = int(rng.integers(4))
        obs, reward, terminated, _, _ = frames.step(action)
        steps = [by_hand.step(action) for _ in range(4)]
        last_two = np.maximum(steps[2][0], steps[3][0])
        np.testing.assert_array_equal(obs, area_resize(last_two))
        assert reward == sum(s[1] for s in steps) and terminated == steps[3][2]
        pooled_differs += not np.array_equal(area_resize(steps[3][0]), obs)
    assert pooled_differs > 0  # the max over two frames mattered (flickering ball and paddle)


def test_noop_reset_takes_1_to_noop_max_noops_from_the_env_generator():
    env, _ = raw_game("Breakout", seed=9)
    obs, _ = atari.AtariFrames(env, noop_max=30, frame_skip=4, size=84).reset(seed=9)
    by_hand, _ = raw_game("Breakout", seed=9)
    noops = by_hand.unwrapped.np_random.integers(1, 31)
    for _ in range(noops):
        frame = by_hand.step(0)[0]
    np.testing.assert_array_equal(obs, area_resize(frame))
    assert env.unwrapped.ale.getEpisodeFrameNumber() == noops


def test_fire_reset_presses_fire_then_2_and_the_stack_starts_with_copies():
    env = make_env(preset(noop_max=0))
    obs, info = env.reset(seed=4)
    assert info["episode_frame_number"] == 8  # FIRE and action 2, 4 frames each
    by_hand, _ = raw_game("Breakout", seed=4)
    steps = [by_hand.step(a) for a in (1, 1, 1, 1, 2, 2, 2, 2)]
    expected = area_resize(np.maximum(steps[6][0], steps[7][0]))
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    for k in range(4):
        np.testing.assert_array_equal(obs[k], expected)
    assert make_env(preset(noop_max=0, fire_reset=False)).reset(seed=4)[1]["episode_frame_number"] == 0


def test_frame_stack_order_oldest_first():
    env = make_env(preset())
    obs, _ = env.reset(seed=2)
    for action in (3, 3, 2, 0, 1):
        new, *_ = env.step(action)
        np.testing.assert_array_equal(new[:-1], obs[1:])
        obs = new
    assert not np.array_equal(obs[-1], obs[0])


def test_life_loss_is_terminal_but_the_game_goes_on_and_rewards_are_clipped():
    env = make_env(preset(noop_max=0))
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    lives_at_ends, raw_total, frame_numbers = [], 0.0, []
    for _ in range(5000):
        _, reward, terminated, truncated, info = env.step(int(rng.integers(4)))
        assert reward == np.sign(info["raw_reward"])
        raw_total += info["raw_reward"]
        if terminated or truncated:
            lives_at_ends.append(info["lives"])
            if info["game_over"]:
                break
            _, reset_info = env.reset()
            frame_numbers.append(reset_info["episode_frame_number"])
    assert lives_at_ends == [4, 3, 2, 1, 0]  # five training episodes, one game
    assert all(b > a for a, b in zip(frame_numbers, frame_numbers[1:]))  # the same game went on
    assert frame_numbers[0] > 8


def test_raw_game_scores_reach_the_vector_info_while_training_sees_signs():
    cfg = parse_config("env: {id: ALE/SpaceInvaders-v5, preset: atari, num_envs: 2, "
                       "atari: {repeat_action_probability: 0.0}}").env
    envs, _ = make_vector_env(cfg, seed=1)
    rng, raw, games = np.random.default_rng(0), [], 0
    for _ in range(1500):
        _, rewards, terminated, truncated, info = envs.step(rng.integers(0, 6, 2))
        np.testing.assert_array_equal(rewards, np.sign(info["raw_reward"]))
        raw.extend(info["raw_reward"][info["raw_reward"] != 0])
        games += info["game_over"].sum()
        assert not (info["game_over"] & ~(terminated | truncated)).any()
    assert max(raw) >= 5 and games >= 1  # Space Invaders scores 5..30 a hit


def test_serial_checkpoints_restore_the_games_exactly():
    cfg = parse_config("env: {id: ALE/Breakout-v5, preset: atari, num_envs: 2}").env
    envs, _ = make_vector_env(cfg, seed=3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        envs.step(rng.integers(0, 4, 2))
    copy, _ = make_vector_env(cfg, seed=4)  # another game: only the restored state makes it the same
    state.restore(copy, *state.capture(envs))
    for _ in range(300):  # through life losses and their resets, with sticky actions
        actions = rng.integers(0, 4, 2)
        a, b = envs.step(actions), copy.step(actions)
        for x, y in zip(a[:4], b[:4]):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("key, value", [("frameskip", 4), ("repeat_action_probability", 0.0)])
def test_the_preset_owns_frame_skip_and_sticky_actions(key, value):
    with pytest.raises(ConfigError, match=f"env.kwargs.{key}: the atari preset sets it"):
        parse_config(f"env: {{id: ALE/Breakout-v5, preset: atari, kwargs: {{{key}: {value}}}}}")
