"""Small envs that tests name by import path ('tests.custom_envs:Name')."""
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right `length` cells (action 1) to finish; reward 1 at the end."""

    observation_space = gym.spaces.Box(0.0, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 3):
        self.length, self.pos = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([self.pos], np.float32), {}

    def step(self, action):
        self.pos += int(action)
        done = self.pos >= self.length
        return np.array([self.pos], np.float32), float(done), done, False, {}


def make_corridor(length: int = 3) -> Corridor:
    return Corridor(length=length)


def make_nothing(**kwargs):
    return 42


class NotAnEnv:
    def __init__(self, **kwargs):
        pass


class Pointer(gym.Env):
    """Continuous actions in [-1, 1]^2; the observation is the action the env received."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.asarray(action, np.float32), 0.0, False, False, {}


class Keys(gym.Env):
    """An action space hpcrl does not support."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.MultiDiscrete([2, 3])

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}


class ThreeLives(gym.Env):
    """Atari-like episode accounting without an emulator: every 4 steps a life is lost (terminated
    for training), the game ends with the third; training sees clipped rewards (1) while the raw
    reward of step k of the game is k, reported in info as the contract says (hpcrl/vector_envs.py)."""

    observation_space = gym.spaces.Box(0.0, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.k, self.lives = 0, 3

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.lives == 0:
            self.k, self.lives = 0, 3
        return np.array([self.k], np.float32), {}

    def step(self, action):
        self.k += 1
        life_lost = self.k % 4 == 0
        self.lives -= life_lost
        game_over = self.lives == 0
        info = {"raw_reward": float(self.k), "game_over": game_over}
        return np.array([self.k], np.float32), 1.0, life_lost, False, info
