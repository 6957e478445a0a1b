"""A trainer's statistics of one update: read from the headers of its records, summed over all
trainers (MPI), folded into the metrics row, and the window of recent episodes that
`run.target_return` is judged on.

With several policies (core/policies.py) each sum is kept per policy: the row's columns pool
every agent's episodes and average every trainer's losses, as in a run of one policy, and
columns named `POLICY.return_mean`, `POLICY.episodes` and `POLICY.LOSS` give each policy's own.
A frame is an env step, which every policy's trainers count once each: the row counts the first
policy's."""
from __future__ import annotations

import resource
from collections import deque

import numpy as np

from hpcrl.core.messages import EPISODE_STATS
from hpcrl.workers.ratings import AnchorRating
from hpcrl.workers.selfplay import OUTCOMES
from hpcrl.runtime import comm

RETURN_WINDOW_EPISODES = 20  # target_return is judged on the mean of at least this many episodes


class TrainerStats:
    def __init__(self, trainer_comm, frames: int = 0, fragments_dropped: int = 0, policy: int = 0,
                 policy_names: list[str] | tuple = ("shared",), selfplay=None):
        """`selfplay`: algo.selfplay; with a pool or anchors, records carry games against each pool
        age, then each anchor. A resumed run's recent episodes and rating come back by `restore`."""
        self.comm = trainer_comm
        self.selfplay_ages = selfplay.pool if selfplay is not None else 0
        self.anchor_names = list(selfplay.anchors) if selfplay is not None else []
        self.opponents = self.selfplay_ages + len(self.anchor_names)
        self.anchor_ratings = selfplay.anchor_ratings() if self.anchor_names else None
        self.rating = AnchorRating(self.anchor_ratings) if self.anchor_names else None
        self.policy, self.policy_names = policy, list(policy_names)
        self.frames = frames
        self.fragments_dropped = fragments_dropped
        self.windows: deque = deque()  # (episodes, return_sum) of recent updates, all trainers

    def local(self, fragments: list, dropped: list, slots_held_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """From this trainer's fragment headers (trained, and `dropped` since the last update, as
        (frames, episode stats)): sums (frames, episodes, return sum, return sum of squares,
        length sum, fragments dropped, env rollout, wait and credit-wait microseconds of the
        trained fragments), lows (return min, version min) and highs (return max, version max,
        the sample-slot peak and this process's resident-memory peak in MiB); with a self-play
        pool or anchors the sums end with the games against each age, then each anchor (wins,
        draws, losses). Read before the slots are released."""
        counted = [(f.get("frames"), f["episode_stats"]) for f in fragments] + dropped
        ep = {name: np.array([st[i] for _, st in counted]) for i, name in enumerate(EPISODE_STATS)}
        versions = [f.get("version") for f in fragments]
        sums = np.array([sum(frames for frames, _ in counted), ep["episodes"].sum(), ep["return_sum"].sum(),
                         ep["return_sqsum"].sum(), ep["length_sum"].sum(), len(dropped),
                         sum(f.get("rollout_us") for f in fragments), sum(f.get("wait_us") for f in fragments),
                         sum(f.get("credit_wait_us") for f in fragments)], dtype=np.float64)
        if self.opponents:
            games = sum((f["selfplay"] for f in fragments), np.zeros((self.opponents, len(OUTCOMES))))
            sums = np.concatenate([sums, games.reshape(-1)])
        # no records (a replay trainer may update before new ones arrive): neutral for min and max
        lows = np.array([ep["return_min"].min(initial=np.inf), min(versions, default=np.inf)], dtype=np.float64)
        highs = np.array([ep["return_max"].max(initial=-np.inf), max(versions, default=-1), slots_held_max,
                          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024], dtype=np.float64)
        return sums, lows, highs

    def row(self, local: tuple[np.ndarray, np.ndarray, np.ndarray], losses: dict[str, float], version: int,
            elapsed: float, lr: float) -> dict:
        """MPI: the metrics row of this update, the same on every trainer (`losses` averaged)."""
        sums, lows, highs = local
        keys = list(losses)
        P = len(self.policy_names)
        mine = np.zeros((P, len(sums) + len(keys)))
        mine[self.policy] = np.concatenate([sums, [losses[k] for k in keys]])
        per_policy = comm.allreduce_sum(self.comm, mine.reshape(-1)).reshape(P, -1)
        sums = per_policy.sum(0)
        sums[0] = per_policy[0, 0]  # frames: env steps, which every policy counts
        # dropped fragments: an env rank's fragment is a record per policy, which every policy's
        # trainers judge at the same versions (they update in lockstep); counted as the first
        # policy's trainers drop them, once per fragment rather than once per policy
        sums[5] = per_policy[0, 5]
        lo, hi = comm.allreduce_min_max(self.comm, lows, highs)
        frames_now, episodes, ret_sum, ret_sq, len_sum, dropped, rollout_us, wait_us, credit_us = sums[:9]
        games = sums[9:9 + 3 * self.opponents].reshape(self.opponents, len(OUTCOMES))
        first_loss = 9 + games.size
        self.frames += int(frames_now)
        self.fragments_dropped += int(dropped)
        self.windows.append((episodes, ret_sum))
        while len(self.windows) > 1 and sum(e for e, _ in list(self.windows)[1:]) >= RETURN_WINDOW_EPISODES:
            self.windows.popleft()
        mean = ret_sum / episodes if episodes else np.nan
        row = {"frames": self.frames, "wall_time": elapsed, "fps": self.frames / max(elapsed, 1e-9),
               "policy_version": version, "episodes": int(episodes), "return_mean": mean,
               "return_std": np.sqrt(max(ret_sq / episodes - mean ** 2, 0.0)) if episodes else np.nan,
               "return_min": lo[0] if episodes else np.nan, "return_max": hi[0] if episodes else np.nan,
               "length_mean": len_sum / episodes if episodes else np.nan,
               "return_window_mean": self.window_mean(), "lr": lr,
               # the version trained on is version - 1; in sync mode every sample must carry it
               "sample_version_min": int(min(lo[1], version - 1)), "sample_version_max": int(hi[1]),
               "policy_lag_max": int(version - 1 - min(lo[1], version - 1)),
               "fragments_dropped": self.fragments_dropped,
               # share of the env ranks' rollout time in which no env group could step
               "env_wait_fraction": wait_us / rollout_us if rollout_us else 0.0,
               # share in which a finished fragment waited for a credit: the trainer is the bottleneck
               "env_credit_wait_fraction": credit_us / rollout_us if rollout_us else 0.0,
               # the sample stream's bound in use: slots in flight or held, at most roles.learner.sample_slots
               "sample_slots_max": int(hi[2]), "learner_rss_mib": float(hi[3])}
        n = self.comm.Get_size()
        row.update({k: float(v) / n for k, v in zip(keys, sums[first_loss:])})
        if P > 1:
            for name, own in zip(self.policy_names, per_policy):
                row[f"{name}.episodes"] = int(own[1])
                row[f"{name}.return_mean"] = own[2] / own[1] if own[1] else np.nan
                row.update({f"{name}.{k}": float(v) / (n // P) for k, v in zip(keys, own[first_loss:])})
        self.pool_games = games[:self.selfplay_ages]  # a league member's learner root reads them (workers/league.py)
        if self.selfplay_ages:
            row.update(selfplay_columns(games[:self.selfplay_ages]))
        if self.rating is not None:
            row.update(anchor_columns(self.anchor_names, games[self.selfplay_ages:]))
            self.rating.add(games[self.selfplay_ages:])
            row.update(self.rating.columns())
        return row

    def state(self) -> dict:
        """What a checkpoint keeps (the part 'stats'): the window of recent episodes as (episodes,
        return sum) rows, which run.target_return and a population's fitness judge, so a resumed
        run stops when the uninterrupted one would; and the rating against the anchors, if any."""
        kept = {"return_window": np.array(list(self.windows), dtype=np.float64).reshape(-1, 2)}
        if self.rating is not None:  # against the anchors (workers/ratings.py)
            kept["rating"] = self.rating.state()
        return kept

    def restore(self, state: dict) -> None:
        window = state.get("return_window")
        self.windows.clear()
        if window is not None:
            self.windows.extend((float(e), float(r)) for e, r in np.asarray(window, dtype=np.float64).reshape(-1, 2))
        if self.rating is not None and state.get("rating") is not None:
            self.rating = AnchorRating(self.anchor_ratings, state["rating"])

    def fitness(self) -> float:
        """What a population judges this run on: its rating against the anchors (self-play with
        anchors), else the mean return of its recent episodes; NaN until enough are in."""
        return self.rating.fitness() if self.rating is not None else self.window_mean()

    def reset_fitness(self) -> None:
        """After a copy of another member's state: the next judgement is of the copy."""
        self.windows.clear()
        if self.rating is not None:
            self.rating.reset()

    def window_mean(self) -> float:
        episodes = sum(e for e, _ in self.windows)
        return sum(s for _, s in self.windows) / episodes if episodes else float("nan")

    def target_reached(self, target: float | None) -> bool:
        episodes = sum(e for e, _ in self.windows)
        return target is not None and episodes >= RETURN_WINDOW_EPISODES and self.window_mean() >= target


def selfplay_columns(games: np.ndarray) -> dict:
    """Metrics of one update's games against the pool: per age a (0: the newest snapshot) the
    games and the learning seat's win rate (NaN without games), and over every age together."""
    total = games.sum(0)
    columns = {"selfplay.games": int(total.sum()), "selfplay.wins": int(total[0]), "selfplay.draws": int(total[1])}
    columns["selfplay.win_rate"] = total[0] / total.sum() if total.sum() else np.nan
    for age, (wins, draws, losses) in enumerate(games):
        played = wins + draws + losses
        columns[f"selfplay.age{age}.games"] = int(played)
        columns[f"selfplay.age{age}.win_rate"] = wins / played if played else np.nan
    return columns


def anchor_columns(names: list[str], games: np.ndarray) -> dict:
    """Metrics of one update's games against the anchors: per anchor the games and the learning
    seat's win rate and draw rate (NaN without games)."""
    columns = {}
    for name, (wins, draws, losses) in zip(names, games):
        played = wins + draws + losses
        columns[f"anchor.{name}.games"] = int(played)
        columns[f"anchor.{name}.win_rate"] = wins / played if played else np.nan
        columns[f"anchor.{name}.draw_rate"] = draws / played if played else np.nan
    return columns
