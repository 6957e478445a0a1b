"""Environments for failure tests, registered on import ('tests.faulty_envs:HpcrlTest/...')."""
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class ExplodingCartPole(CartPoleEnv):
    """CartPole that raises after `explode_after` steps: an env bug on one env rank."""

    def __init__(self, explode_after: int = 50, **kwargs):
        super().__init__(**kwargs)
        self.explode_after = explode_after
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps > self.explode_after:
            raise RuntimeError("simulated env failure")
        return super().step(action)


gym.register("HpcrlTest/Exploding-v0", entry_point=ExplodingCartPole, max_episode_steps=500)
