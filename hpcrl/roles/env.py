"""Env rank (actor): steps a gymnasium vector, asks a policy for actions, ships fragments.

Never imports torch: the policy is either remote (`RemotePolicy`, over MPI) or an inline policy
object handed in by the wiring (roles/inference.py), which is the only side that needs torch.
"""
from __future__ import annotations

import pickle

import numpy as np

from hpcrl.comm import FragmentSender, RequestClient
from hpcrl.config import Config
from hpcrl.envs import GAME_OVER, RAW_REWARD, make_vector_env
from hpcrl.messages import EPISODE_STATS, PREEMPTED, STOP, Message


class RemotePolicy:
    """Actions from an inference rank: the request goes out as one message, the reply is polled."""

    def __init__(self, client: RequestClient):
        self.client = client
        self.request, self.reply = client.request, client.reply

    def submit(self, version: int, n_final: int) -> None:
        self.request.set(version=version, n_final=n_final, flags=0)
        self.client.send(self.request.spec.prefix_nbytes("final_obs", n_final))

    def poll(self) -> Message | None:
        return self.reply if self.client.test() else None

    def close(self) -> None:
        self.client.close()

    def sampling_state(self):
        return None  # sampling happens on the inference rank

    def restore_sampling_state(self, state) -> None:
        pass


class EnvRole:
    """One rollout of T steps per policy version (sync mode): fragment k is collected with version k.

    A rollout makes T+1 policy calls: the last one only asks for the values of the observations
    after step T-1 (and of episodes truncated there), which the learner needs to bootstrap.
    """

    name = "env"

    def __init__(self, cfg: Config, rank: int, index: int, policy, sender: FragmentSender, start_version: int = 0):
        self.rank = rank
        self.T, self.N = cfg.algo.rollout_length, cfg.env.num_envs
        self.policy = policy
        self.sender = sender
        self.envs, first_obs = make_vector_env(cfg.env, seed=cfg.run.seed * 100_003 + 1_000 * index,
                                               gamma=cfg.algo.gamma)
        self.request, self.reply = policy.request, policy.reply
        self.request["obs"][...] = first_obs
        self.version = start_version  # the policy version this rollout must be collected with
        self.t = 0
        self.waiting = False
        self.done = False
        self.preempted = False
        self.fragments_sent = 0
        self.fragment = sender.acquire()
        self.ep_return = np.zeros(self.N, dtype=np.float64)
        self.ep_length = np.zeros(self.N, dtype=np.int64)
        self.truncated_envs = np.zeros(0, dtype=np.int64)  # envs whose final obs rides on the next request
        self.status = "starting"
        self._reset_stats()

    def _reset_stats(self) -> None:
        stats = self.fragment["episode_stats"]
        stats[:] = 0
        stats[EPISODE_STATS.index("return_min")] = np.inf
        stats[EPISODE_STATS.index("return_max")] = -np.inf

    def poll(self) -> int:
        if not self.waiting:
            self.policy.submit(self.version, len(self.truncated_envs))
            self.waiting = True
            self.status = f"waiting for actions (policy version {self.version}, step {self.t})"
        reply = self.policy.poll()
        if reply is None:
            return 0
        self.waiting = False
        if reply.get("flags") & STOP:
            self.preempted = bool(reply.get("flags") & PREEMPTED)
            self._finish()
            return 1
        if reply.get("version") != self.version:
            raise RuntimeError(f"env rank {self.rank}: sync mode got actions from policy version "
                               f"{reply.get('version')} while collecting with version {self.version}")
        frag = self.fragment
        if len(self.truncated_envs):
            frag["trunc_values"][self.t - 1, self.truncated_envs] = reply["final_values"][:len(self.truncated_envs)]
        if self.t == self.T:
            frag["last_values"][...] = reply["values"]
            self._ship()
            return 1
        self._step(reply)
        return 1

    def _step(self, reply: Message) -> None:
        t, frag = self.t, self.fragment
        frag["obs"][t] = self.request["obs"]
        frag["actions"][t] = reply["actions"]
        frag["logp"][t] = reply["logp"]
        frag["values"][t] = reply["values"]
        self.status = f"stepping envs (step {t})"
        obs, rewards, terminated, truncated, info = self.envs.step(reply["actions"])
        done = terminated | truncated
        frag["rewards"][t] = rewards
        frag["dones"][t] = done
        frag["trunc_values"][t] = 0.0
        self.request["obs"][...] = obs
        # Truncated (not terminated) episodes still have a future: send their final obs for a value.
        self.truncated_envs = np.flatnonzero(truncated & ~terminated)
        if len(self.truncated_envs):
            self.request["final_obs"][:len(self.truncated_envs)] = np.stack(info["final_obs"][self.truncated_envs])
        # Metrics: raw rewards over whole episodes (an Atari game of several lives), when training
        # sees clipped or normalised rewards and life losses as ends (hpcrl/vector_envs.py)
        self.ep_return += info.get(RAW_REWARD, rewards)
        self.ep_length += 1
        ended = info.get(GAME_OVER, done)
        if ended.any():
            self._count_episodes(np.flatnonzero(ended))
        self.t += 1

    def _count_episodes(self, ended: np.ndarray) -> None:
        stats, returns = self.fragment["episode_stats"], self.ep_return[ended]
        stats[0] += len(ended)
        stats[1] += returns.sum()
        stats[2] += (returns ** 2).sum()
        stats[3] = min(stats[3], returns.min())
        stats[4] = max(stats[4], returns.max())
        stats[5] += self.ep_length[ended].sum()
        self.ep_return[ended] = 0.0
        self.ep_length[ended] = 0

    def _ship(self) -> None:
        self.fragment.set(env_rank=self.rank, version=self.version, index=self.fragments_sent,
                          frames=self.T * self.N)
        self.sender.send()
        self.fragments_sent += 1
        self.version += 1
        self.t = 0
        self.truncated_envs = np.zeros(0, dtype=np.int64)
        self.status = "waiting for a free fragment buffer"
        self.fragment = self.sender.acquire()
        self._reset_stats()

    def snapshot(self) -> bytes:
        """Serial mode: everything needed to continue exactly, taken between rollouts (when the
        learner checkpoints). Raises pickle/type errors for envs that cannot be pickled."""
        if self.t != 0:
            raise RuntimeError("env snapshots are taken between rollouts")
        return pickle.dumps({"envs": self.envs, "obs": self.request["obs"].copy(), "version": self.version,
                             "ep_return": self.ep_return, "ep_length": self.ep_length,
                             "fragments_sent": self.fragments_sent,
                             "sampling": self.policy.sampling_state()})

    def restore(self, blob: bytes) -> None:
        state = pickle.loads(blob)
        self.envs.close()
        self.envs = state["envs"]
        self.request["obs"][...] = state["obs"]
        self.version, self.fragments_sent = state["version"], state["fragments_sent"]
        self.ep_return, self.ep_length = state["ep_return"], state["ep_length"]
        self.policy.restore_sampling_state(state["sampling"])

    def _finish(self) -> None:
        self.sender.close()
        self.policy.close()
        self.envs.close()
        self.done = True
        self.status = "finished"
