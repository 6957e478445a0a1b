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


class WrongShape(Corridor):
    """Declares Box(2) observations and returns 3 values: a newcomer's mistake (issue 46, item 1)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}


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


class MaskedKeys(gym.Env):
    """A single-agent env that gives its valid actions in info['action_mask'] (the gymnasium
    convention): each step a random half of 6 keys is valid, an invalid key raises, and the highest
    valid key pays 1. The observation is the mask itself, so the best key can be learned."""

    observation_space = gym.spaces.Box(0.0, 1.0, (6,), np.float32)
    action_space = gym.spaces.Discrete(6)

    def __init__(self, length: int = 8, width: int = 6):
        """`width`: the entries of the mask the env gives (not 6: a mistake hpcrl must name)."""
        self.length, self.t, self.mask, self.width = length, 0, np.ones(6, np.int8), width

    def _draw(self):
        self.mask = np.zeros(6, np.int8)
        self.mask[self.np_random.choice(6, 3, replace=False)] = 1
        return self.mask.astype(np.float32), {"action_mask": self.mask[:self.width].copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw()

    def step(self, action):
        if not self.mask[int(action)]:
            raise ValueError(f"key {int(action)} is not valid now (mask {self.mask.tolist()})")
        reward = float(int(action) == np.flatnonzero(self.mask).max())
        self.t += 1
        obs, info = self._draw()
        return obs, reward, False, self.t >= self.length, info


class DictCartPole(gym.Wrapper):
    """CartPole-v1 (with `max_episode_steps`) observed as a nested Dict: {'cart': [x, x_dot],
    'pole': ([theta], [theta_dot]) (a Tuple), 'parity': the step count mod 2 (Discrete),
    'mission': a text (left out by hpcrl)}. The same dynamics as CartPole, so a policy learns it."""

    def __init__(self, max_episode_steps: int = 500):
        super().__init__(gym.make("CartPole-v1", max_episode_steps=max_episode_steps))
        box = lambda n: gym.spaces.Box(-np.inf, np.inf, (n,), np.float32)  # noqa: E731
        self.observation_space = gym.spaces.Dict({
            "cart": box(2), "pole": gym.spaces.Tuple((box(1), box(1))), "parity": gym.spaces.Discrete(2),
            "mission": gym.spaces.Text(32)})
        self.steps = 0

    def _dict(self, obs):
        return {"cart": obs[:2].copy(), "pole": (obs[2:3].copy(), obs[3:4].copy()),
                "parity": self.steps % 2, "mission": "balance"}

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.steps = 0
        return self._dict(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        return self._dict(obs), reward, terminated, truncated, info
