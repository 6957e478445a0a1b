"""Self-play against a pool of frozen past versions (algo.selfplay, core/config_selfplay.py).

Two halves, joined by nothing but policy ids on the inference stream:
- `Seats`, on an actor: for each env and each game, whether the policy plays itself (every seat
  learns) or one seat, drawn at random, learns against pool age a in every other seat. The rows of
  those other seats ask for policy id P + a (P: the training policies) and are left out of the
  fragment's active rows, so the trainer never learns from the frozen side. When a game against
  the pool ends, it is judged from the learning seat's return: a win, a draw or a loss against age a.
  A share of games (algo.selfplay.anchor_share) goes to an anchor instead: a fixed player written as
  a function, which plays every seat but one on the actor itself (`play_anchors` overwrites those
  rows' actions). Such a game only measures: none of its rows is trained on or counted in the
  episode returns, and its result is judged against the anchor, for the learner's rating.
  The age of a game against the pool is drawn uniformly, or by prioritized fictitious self-play
  (algo.selfplay.opponents, core/population.pfsp_weights) on the win rate against each age, an EMA
  of this actor's own games (so no message is needed for it). The ages are relative: age a is
  always the snapshot a places back, so its win rate follows whichever snapshot holds the place.
- `Pool`, on a policy holder (in a league, `LeaguePool`: slots the population root fills):
  K frozen copies of the policy. Every `snapshot_every` versions the
  newest weights overwrite the oldest copy, so age 0 is the newest snapshot and age K-1 the oldest;
  until the pool has K snapshots the young ages share the first one. Holders snapshot on their
  own, at the first version they hold past each multiple of snapshot_every, so no weights travel
  for the pool and a holder that skipped versions (newest-only weights) snapshots the next one.
Pure numpy on the actor side (actors with remote inference never import torch).
"""
from __future__ import annotations

import numpy as np

from hpcrl.core.observations import take
from hpcrl.core.population import pfsp_weights

OUTCOMES = ("wins", "draws", "losses")
SCORE = (1.0, 0.5, 0.0)  # what each outcome adds to the win rate against an age


class Seats:
    """Who plays which seat of each env of an env group (rows env-major, `agents` per env)."""

    def __init__(self, cfg, envs: int, agents: int, rng: np.random.Generator, first_pool_id: int = 1,
                 row_policy: np.ndarray | None = None, anchors: tuple = ()):
        """`row_policy`: where the policy id each row asks for is kept, written in place (an env
        group's request buffer, so every request carries the seats as they stand); a new array
        when None. `anchors`: the config's anchors as players (envs/scripted.py), in its order."""
        s = cfg.algo.selfplay
        self.ages, self.latest, self.agents = s.pool, s.latest, agents
        self.anchors = list(anchors)
        self.anchor_share = s.anchor_share if self.anchors else 0.0  # (none: the draws are as before anchors)
        self.first_pool_id = first_pool_id
        self.rng = rng
        # per env: the pool age it plays, ages + k: anchor k, -1: itself
        self.opponent = np.full(envs, -1, dtype=np.int64)
        self.seat = np.zeros(envs, dtype=np.int64)  # per env: the learning seat in a game against the pool
        self.row_policy = np.zeros(envs * agents, dtype=np.int16) if row_policy is None else row_policy
        self.learning = np.ones(envs * agents, dtype=bool)  # rows the trainer learns from
        self.game_return = np.zeros(envs * agents)  # each row's return in the current game
        # games judged since the last record: against each pool age, then each anchor
        self.results = np.zeros((self.ages + len(self.anchors), len(OUTCOMES)))
        self.opponents, self.decay = s.opponents, s.payoff_decay
        self.payoff = np.full(self.ages, 0.5)  # per age: the win rate against it (EMA; a draw counts half)
        for env in range(envs):
            self._draw(env)

    def _draw(self, env: int) -> None:
        rows = slice(env * self.agents, (env + 1) * self.agents)
        share = self.rng.random()
        if share < self.anchor_share:
            self.opponent[env] = self.ages + self.rng.integers(len(self.anchors))
        elif share < self.anchor_share + self.latest or not self.ages:  # without a pool: every other game
            self.opponent[env] = -1
        elif self.opponents == "uniform":
            self.opponent[env] = self.rng.integers(self.ages)
        else:
            self.opponent[env] = self.rng.choice(self.ages, p=pfsp_weights(self.payoff, self.opponents))
        self.seat[env] = self.rng.integers(self.agents)
        if self.opponent[env] < 0:
            self.row_policy[rows], self.learning[rows] = 0, True
        elif self.opponent[env] >= self.ages:  # an anchor: the policy acts for the learning seat, untrained
            self.row_policy[rows], self.learning[rows] = 0, False
        else:
            self.row_policy[rows] = self.first_pool_id + self.opponent[env]
            self.learning[rows] = False
            self.row_policy[env * self.agents + self.seat[env]] = 0
            self.learning[env * self.agents + self.seat[env]] = True

    def stepped(self, rewards: np.ndarray, env_done: np.ndarray) -> None:
        """After a step: add its rewards; judge the games that ended against the pool, and draw the
        next game's opponent and seat for every env whose game ended."""
        self.game_return += rewards
        for env in np.flatnonzero(env_done):
            rows = slice(env * self.agents, (env + 1) * self.agents)
            age = self.opponent[env]
            if age >= 0:
                returns = self.game_return[rows]
                mine = returns[self.seat[env]]
                best_other = np.delete(returns, self.seat[env]).max()
                outcome = 0 if mine > best_other else 1 if mine == best_other else 2
                self.results[age, outcome] += 1
                if age < self.ages:
                    self.payoff[age] = self.decay * self.payoff[age] + (1.0 - self.decay) * SCORE[outcome]
            self.game_return[rows] = 0.0
            self._draw(env)

    def play_anchors(self, obs, mask: np.ndarray | None, actions: np.ndarray) -> None:
        """Overwrite `actions` (the policy's, for every row of this step) in the rows of the seats
        anchors hold with the anchors' own actions, from the same observations and masks."""
        for k, player in enumerate(self.anchors):
            envs = np.flatnonzero(self.opponent == self.ages + k)
            if not len(envs):
                continue
            seats = np.ones((len(envs), self.agents), dtype=bool)
            seats[np.arange(len(envs)), self.seat[envs]] = False  # the learning seat keeps the policy's
            rows = (envs[:, None] * self.agents + np.arange(self.agents))[seats]
            actions[rows] = player.act(take(obs, rows), None if mask is None else mask[rows], self.rng)

    def saved_parts(self) -> dict:
        """What a serial checkpoint holds of the seats (envs/state.py reads and writes them in
        place): the draws, each env's game, and the win rates."""
        return {"rng": self.rng, "opponent": self.opponent, "seat": self.seat, "row_policy": self.row_policy,
                "learning": self.learning, "game_return": self.game_return, "results": self.results,
                "payoff": self.payoff}

    def take_results(self) -> np.ndarray:
        out, self.results = self.results, np.zeros_like(self.results)
        return out


class Pool:
    """A policy holder's frozen copies of policy 0 (runners of the same network), by age."""

    def __init__(self, runners: list, snapshot_every: int):
        self.runners = runners
        self.snapshot_every = snapshot_every
        self.newest = -1  # the slot of age 0 (-1: no snapshot yet)
        self.next_version = 0  # the version at or past which the next snapshot is taken
        self.taken = 0  # snapshots taken

    def runner(self, age: int):
        """The copy of pool age `age` (the first snapshot while the pool is still filling)."""
        age = min(age, self.taken - 1)
        return self.runners[(self.newest - age) % len(self.runners)]

    def offer(self, source, version: int, message=None) -> None:
        """The learning runner now holds `version` (from `message`): snapshot it if one is due."""
        if version < self.next_version:
            return
        self.newest = (self.newest + 1) % len(self.runners)
        self.runners[self.newest].model.load_state_dict(source.model.state_dict())
        self.runners[self.newest].version = version
        self.taken += 1
        self.next_version = (version // self.snapshot_every + 1) * self.snapshot_every


class LeaguePool:
    """A league member's policy holder's slots (core/league.py): each holds the league snapshot
    the population root gave it. The weights ride the member's parameter stream, one slot per
    version (workers/league.py), and a slot loads them when its snapshot changes. Until its first
    snapshot comes, a slot plays its runner's own initial weights; the games then are not judged
    against any snapshot (the learner root counts them against the slot's snapshot id, -1)."""

    def __init__(self, runners: list):
        self.runners = runners
        self.ids = [-1] * len(runners)  # each slot's snapshot id

    def runner(self, slot: int):
        return self.runners[slot]

    def offer(self, source, version: int, message=None) -> None:
        """The slot this version carries: loaded when its snapshot is new to this holder."""
        slot, sid = int(message.get("slot")), int(message.get("slot_id"))
        if sid >= 0 and 0 <= slot < len(self.runners) and self.ids[slot] != sid:
            self.runners[slot].load(message["slot_params"], version)
            self.ids[slot] = sid
