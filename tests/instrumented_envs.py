"""CartPoles that explode, hang, run slowly or report their imports, for tests that watch a run from
inside; registered on import ('tests.instrumented_envs:HpcrlTest/...')."""
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv, PendulumEnv


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


class ReportsModulesOnClose:
    """An env that, on close, writes which heavy modules its process has imported (mixed in first),
    and beside it (gc-rankN-PID.txt) whether the cyclic collector runs and how many objects
    start-up froze (core/startup.py pauses it during start-up only)."""

    def __init__(self, report_dir: str, **kwargs):
        super().__init__(**kwargs)
        self.report_dir = report_dir

    def close(self):
        import os
        import sys
        rank = os.environ.get("OMPI_COMM_WORLD_RANK", "serial")
        loaded = sorted(m for m in ("torch", "horovod") if m in sys.modules)
        with open(os.path.join(self.report_dir, f"rank{rank}-{os.getpid()}.txt"), "w") as fh:
            fh.write(",".join(loaded))
        import gc
        with open(os.path.join(self.report_dir, f"gc-rank{rank}-{os.getpid()}.txt"), "w") as fh:
            fh.write(f"{gc.isenabled()} {gc.get_freeze_count()}")
        super().close()


class ModuleReportingCartPole(ReportsModulesOnClose, CartPoleEnv):
    """CartPole that reports its process's imports on close."""


gym.register("HpcrlTest/ModuleReporting-v0", entry_point=ModuleReportingCartPole, max_episode_steps=500)


class ModuleReportingPendulum(ReportsModulesOnClose, PendulumEnv):
    """Pendulum (Box actions) that reports its process's imports on close."""


gym.register("HpcrlTest/ModuleReportingPendulum-v0", entry_point=ModuleReportingPendulum, max_episode_steps=200)


class HangingCartPole(CartPoleEnv):
    """CartPole whose step never returns after `hang_after` steps: a deadlocked simulator."""

    def __init__(self, hang_after: int = 50, **kwargs):
        super().__init__(**kwargs)
        self.hang_after = hang_after
        self.steps = 0

    def step(self, action):
        import time
        self.steps += 1
        while self.steps > self.hang_after:
            time.sleep(1.0)
        return super().step(action)


gym.register("HpcrlTest/Hanging-v0", entry_point=HangingCartPole, max_episode_steps=500)


class SlowCartPole(CartPoleEnv):
    """CartPole whose step takes `step_seconds` of wall time (sleeping): a costly simulator."""

    def __init__(self, step_seconds: float = 0.002, **kwargs):
        super().__init__(**kwargs)
        self.step_seconds = step_seconds

    def step(self, action):
        import time
        time.sleep(self.step_seconds)
        return super().step(action)


gym.register("HpcrlTest/Slow-v0", entry_point=SlowCartPole, max_episode_steps=500)


class SlowOnOneRankCartPole(CartPoleEnv):
    """CartPole that sleeps `step_seconds` per step on world rank `slow_rank` only, and writes how
    many steps it took there to `report` on close: one slow policy holder among fast ones."""

    def __init__(self, slow_rank: int, step_seconds: float, report: str, **kwargs):
        import os
        super().__init__(**kwargs)
        self.slow = os.environ.get("OMPI_COMM_WORLD_RANK") == str(slow_rank)
        self.step_seconds, self.report, self.steps = step_seconds, report, 0

    def step(self, action):
        if self.slow:
            import time
            time.sleep(self.step_seconds)
            self.steps += 1
        return super().step(action)

    def close(self):
        if self.slow:
            with open(self.report, "a") as fh:
                fh.write(f"{self.steps}\n")
        super().close()


gym.register("HpcrlTest/SlowOnOneRank-v0", entry_point=SlowOnOneRankCartPole, max_episode_steps=500)
