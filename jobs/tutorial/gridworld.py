"""The tutorial's own environment (docs/tutorial.md): walk from a random cell of a size x size grid
to the goal in the bottom-right corner. A config names it by import path, from the repository root:
env.id: jobs.tutorial.gridworld:GridWorld."""
import gymnasium as gym
import numpy as np

MOVES = np.array([[0, 1], [1, 0], [0, -1], [-1, 0]])  # right, down, left, up (row, column)


class GridWorld(gym.Env):
    """Reward 1 for reaching the goal, -0.1 for every other step."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(self, size: int = 5, render_mode: str | None = None):
        self.size, self.render_mode = size, render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)  # row, column in [0, 1]
        self.action_space = gym.spaces.Discrete(len(MOVES))
        self.goal = np.array([size - 1, size - 1])
        self.pos = np.zeros(2, np.int64)

    def _obs(self) -> np.ndarray:
        return (self.pos / (self.size - 1)).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)  # seeds self.np_random: hpcrl gives every env its own seed
        self.pos = self.np_random.integers(0, self.size, 2)
        while (self.pos == self.goal).all():
            self.pos = self.np_random.integers(0, self.size, 2)
        return self._obs(), {}

    def step(self, action):
        self.pos = np.clip(self.pos + MOVES[int(action)], 0, self.size - 1)
        at_goal = bool((self.pos == self.goal).all())
        return self._obs(), 1.0 if at_goal else -0.1, at_goal, False, {}

    def render(self) -> np.ndarray:
        """An RGB picture (hpcrl eval --video): the goal green, the walker blue, 32 pixels a cell."""
        cell = 32
        image = np.full((self.size * cell, self.size * cell, 3), 255, np.uint8)
        image[::cell], image[:, ::cell] = 220, 220  # grid lines
        for (row, col), colour in ((self.goal, (40, 170, 60)), (self.pos, (40, 80, 220))):
            image[row * cell:(row + 1) * cell, col * cell:(col + 1) * cell] = colour
        return image
