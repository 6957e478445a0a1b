"""Atari (ale-py, ALE/...-v5 ids) with the standard DeepMind preprocessing, as small gymnasium wrappers.

The emulator runs with its own frame skip off and grey frames; on top, innermost first:
AtariFrames (no-op reset, frame skip with a max over the last two frames, area resize to 84x84) ->
EpisodicLife (a lost life ends the training episode, the game goes on) -> FireReset -> ClipReward
-> FrameStackObservation ([4, 84, 84] uint8). Metrics count whole games of raw score: EpisodicLife
puts info[GAME_OVER] and ClipReward info[RAW_REWARD] (see hpcrl.envs.vector).

(gymnasium's AtariPreprocessing needs OpenCV; AtariFrames does the same with a numpy resize.)
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from hpcrl.core.config import AtariConfig, ConfigError
from hpcrl.envs.vector import GAME_OVER, RAW_REWARD


def import_ale():
    """ale_py with its ALE/ ids registered in gymnasium; a ConfigError naming the extra if missing."""
    try:
        import ale_py
    except ImportError as exc:
        raise ConfigError(f"env.id: Atari ids need the ale-py package ({exc}); "
                          f"install it with: pip install hpcrl[atari]") from None
    gym.register_envs(ale_py)
    return ale_py


def make_kwargs(at: AtariConfig) -> dict:
    """What gymnasium.make gets for the preset: one emulator frame per step, grey frames, sticky actions."""
    return {"frameskip": 1, "repeat_action_probability": at.repeat_action_probability, "obs_type": "grayscale"}


def envpool_kwargs(at: AtariConfig) -> dict:
    """The same preprocessing expressed in envpool's Atari options."""
    return {"noop_max": at.noop_max, "frame_skip": at.frame_skip, "img_height": at.frame_size,
            "img_width": at.frame_size, "stack_num": at.frame_stack, "gray_scale": True,
            "episodic_life": at.terminal_on_life_loss, "use_fire_reset": at.fire_reset,
            "reward_clip": at.clip_rewards, "repeat_action_probability": at.repeat_action_probability}


def wrap(env: gym.Env, at: AtariConfig, env_id: str) -> gym.Env:
    """The preset's wrapper stack around an ALE env made with `make_kwargs`."""
    ale_py = import_ale()
    if not isinstance(env.unwrapped, ale_py.AtariEnv):
        raise ConfigError(f"env.preset: 'atari' needs an ALE environment (e.g. ALE/Breakout-v5), "
                          f"got {env_id!r} ({type(env.unwrapped).__name__})")
    env = AtariFrames(env, at.noop_max, at.frame_skip, at.frame_size)
    if at.terminal_on_life_loss:
        env = EpisodicLife(env)
    meanings = env.unwrapped.get_action_meanings()
    if at.fire_reset and len(meanings) >= 3 and meanings[1] == "FIRE":
        env = FireReset(env)
    if at.clip_rewards:
        env = ClipReward(env)
    return gym.wrappers.FrameStackObservation(env, at.frame_stack)


def area_taps(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, int]:
    """An area resize of one axis (OpenCV's INTER_AREA): output pixel i averages the source interval
    [i * src/dst, (i+1) * src/dst), each source pixel weighted by its overlap. Returned as the few
    source pixels of each output pixel, their integer weights, and the weights' sum (exact integer
    arithmetic; a gather, not a BLAS matmul whose threads would oversubscribe the env ranks' cores)."""
    g = np.gcd(src, dst)
    pixel, out = dst // g, src // g  # lengths on a grid where both kinds of edge fall on whole numbers
    edges = np.arange(dst + 1) * out
    starts = np.arange(src)[None, :] * pixel
    weights = np.clip(np.minimum(edges[1:, None], starts + pixel) - np.maximum(edges[:-1, None], starts), 0, None)
    k = int((weights > 0).sum(axis=1).max())
    index = np.argsort(weights == 0, axis=1, kind="stable")[:, :k]
    return index, np.take_along_axis(weights, index, axis=1).astype(np.int64), int(out)


class AtariFrames(gym.Wrapper):
    """No-op reset (1..noop_max no-ops), action repeat over `frame_skip` frames with the summed reward
    and the max of the last two frames (Atari sprites flicker), area resize to size x size."""

    def __init__(self, env: gym.Env, noop_max: int, frame_skip: int, size: int):
        super().__init__(env)
        if noop_max > 0 and env.unwrapped.get_action_meanings()[0] != "NOOP":
            raise ConfigError("env.atari.noop_max: this game's action 0 is not NOOP; set noop_max: 0")
        height, width = env.observation_space.shape
        self.noop_max, self.frame_skip = noop_max, frame_skip
        self.row_index, self.row_weight, row_sum = area_taps(height, size)
        self.col_index, self.col_weight, col_sum = area_taps(width, size)
        self.total = row_sum * col_sum
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)
        self.last_action = 0  # what sticky actions repeat (ALE's reset sets NOOP)

    # Serial-mode checkpoints (hpcrl/envs/state.py) record this wrapper by these hooks, not by its
    # attributes (all config): the emulator (game, RAM, its random state for sticky actions) as the
    # bytes ALE serialises it to, and the env's generator (no-op counts). Between here and the
    # emulator sit gymnasium's OrderEnforcing and PassiveEnvChecker, whose flags are the same in
    # any env that has been reset.
    # ALE's state leaves out the action that sticky actions repeat (StellaEnvironment::m_actions),
    # so the restore sets it by acting with the last action asked for (each frame keeps the old
    # one with p = repeat_action_probability) and then restores the state again. That is the
    # action in effect unless every frame of the last step kept the one before (p = 0.25^4).
    def capture_state(self) -> dict:
        game = self.unwrapped
        emulator = game.ale.cloneState(include_rng=True).serialize()
        return {"emulator": np.frombuffer(emulator, dtype=np.uint8), "np_random": game.np_random.bit_generator.state,
                "last_action": int(self.last_action)}

    def restore_state(self, state: dict) -> None:
        game = self.unwrapped
        emulator = import_ale().ALEState(np.asarray(state["emulator"], dtype=np.uint8).tobytes())
        game.ale.restoreState(emulator)
        for _ in range(32):  # ALE's next random draws decide, so the same number of tries always
            game.ale.act(game._action_set[int(state["last_action"])])
        game.ale.restoreState(emulator)
        game.np_random.bit_generator.state = state["np_random"]
        self.last_action = int(state["last_action"])

    def resize(self, frame: np.ndarray) -> np.ndarray:
        rows = (frame[self.row_index] * self.row_weight[..., None]).sum(axis=1)  # (size, width)
        area_sum = (rows[:, self.col_index] * self.col_weight).sum(axis=2)
        return ((2 * area_sum + self.total) // (2 * self.total)).astype(np.uint8)  # the mean, halves up

    def reset(self, *, seed=None, options=None):
        frame, info = self.env.reset(seed=seed, options=options)
        self.last_action = 0
        noops = self.unwrapped.np_random.integers(1, self.noop_max + 1) if self.noop_max > 0 else 0
        for _ in range(noops):
            frame, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                frame, info = self.env.reset()
        return self.resize(frame), info

    def step(self, action):
        total, frames = 0.0, []
        self.last_action = action
        for _ in range(self.frame_skip):
            frame, reward, terminated, truncated, info = self.env.step(action)
            total += reward
            frames = [*frames[-1:], frame]
            if terminated or truncated:
                break
        return self.resize(np.maximum(frames[0], frames[-1])), total, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life is terminal for training, but the game goes on: reset() after a life loss is one
    no-op step, not a new game. info[GAME_OVER] says when the real game ended (or was truncated)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives, self.game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.unwrapped.ale.lives()
        terminated = terminated or 0 < lives < self.lives  # some games sit at 0 lives for a few frames
        self.lives = lives
        info[GAME_OVER] = self.game_over
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed=None, options=None):
        if self.game_over:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(seed=seed, options=options)
        self.lives, self.game_over = self.unwrapped.ale.lives(), False
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE (then action 2) after each reset: games such as Breakout wait for it."""

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class ClipReward(gym.Wrapper):
    """Train on the sign of the reward; the raw reward goes on in info[RAW_REWARD]."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info[RAW_REWARD] = float(reward)
        return obs, float(np.sign(reward)), terminated, truncated, info
