"""League self-play (after AlphaStar's league: Vinyals et al. 2019): who plays whom.

A league is a population whose members play each other's frozen snapshots. Each member has a role:
- main agents play the whole league: every snapshot still kept, their own included, drawn by
  prioritized fictitious self-play (PFSP) on their win rate against each;
- main exploiters play the main agents only, each main's newest snapshot, to find its weaknesses;
  they start again at each of their own snapshots;
- league exploiters play the whole league by PFSP, as main agents do, to find what no snapshot
  beats; they start again with probability `exploiter_reset` at each of their own snapshots.
An exploiter starts again from its initial weights, or (population.league.restart 'main') from the
newest snapshot of the main agent it beats least: AlphaStar's start from a supervised agent, a
player that knows the game; from random weights an exploiter learns nothing against a strong main
agent, while from the main agent's snapshot it starts even and learns what beats it.
A snapshot is a member's weights frozen by its role's rule (`snapshot_rule`): every `snapshot_frames`
of a main agent's training; an exploiter's at its own interval, or earlier once it beats its
opponents often enough. Its owner keeps its last `keep`, and those are the league. Each member's
policy holders hold `slots` snapshots (its self-play pool); the population root decides which,
drawing them by the member's role, and each env rank draws a slot per game uniformly, so the
games follow the draws.

The payoff matrix is the population root's: each member's win rate against each snapshot, an EMA
over the games its learner root reports (a draw counts half, every pair starts at 0.5).

Pure numpy, no MPI and no torch: the population root calls this with its own seeded generator, and
every case can be checked by hand (tests/test_league.py). Moving the weights is the transport's part
(workers/league.py, runtime/member_copy.py).
"""
from __future__ import annotations

import numpy as np

from hpcrl.core.population import pfsp_weights
from hpcrl.core.seeds import seed_for

MAIN, MAIN_EXPLOITER, LEAGUE_EXPLOITER = "main", "main_exploiter", "league_exploiter"
ROLES = (MAIN, MAIN_EXPLOITER, LEAGUE_EXPLOITER)


def member_roles(main: int, main_exploiters: int, league_exploiters: int) -> list[str]:
    """Each member's role, in member order: the main agents first, then the main exploiters,
    then the league exploiters."""
    return [MAIN] * main + [MAIN_EXPLOITER] * main_exploiters + [LEAGUE_EXPLOITER] * league_exploiters


def ring_size(keep: int, ready_frames: int, snapshot_frames: int, win_rate: float = 0.0) -> int:
    """The snapshots a member's learner root holds: what the league keeps, plus those it may take
    between two reports (`ready_frames` apart: one every `snapshot_frames`, and one more by a
    win-rate rule, which waits `ready_frames` after a snapshot), plus one: the population root may
    pick a snapshot it still counts as kept until the next report tells it of newer ones."""
    return keep + 1 + ready_frames // snapshot_frames + (1 if win_rate else 0)


def largest_ring(league, ready_frames: int) -> int:
    """The largest ring (`ring_size`) any member of this league (a population.league config)
    holds, by its role's snapshot rule."""
    roles = set(member_roles(league.main, league.main_exploiters, league.league_exploiters))
    return max(ring_size(league.keep, ready_frames, *snapshot_rule(role, league.snapshot_frames,
                                                                   league.exploiter_snapshot_frames,
                                                                   league.snapshot_win_rate))
               for role in roles)


def snapshot_rule(role: str, snapshot_frames: int, exploiter_snapshot_frames: int,
                  snapshot_win_rate: float) -> tuple[int, float]:
    """A member's snapshot rule by its role: (frames between its snapshots at most, the win rate
    against its slots that snapshots it early, 0 for none). After AlphaStar: main agents snapshot
    on the frame rule alone (they beat their frozen slots most of the time, so a win-rate rule
    would freeze them every few games); exploiters once they win often enough, with their own
    frame rule as the timeout."""
    if role == MAIN:
        return snapshot_frames, 0.0
    return exploiter_snapshot_frames or snapshot_frames, snapshot_win_rate


def resets_after_snapshot(role: str, reset_probability: float, run_seed: int, member: int, seq: int) -> bool:
    """Whether a member starts again from its initial weights right after its snapshot `seq`: a
    main exploiter always, a league exploiter with `reset_probability` (drawn from a generator
    seeded by the member and the snapshot, so a resume draws the same), a main agent never."""
    if role == MAIN_EXPLOITER:
        return True
    if role == LEAGUE_EXPLOITER:
        return bool(np.random.default_rng(seed_for(run_seed, "league", member, seq)).random() < reset_probability)
    return False


def ema_of_games(payoff: float, wins: float, draws: float, losses: float, decay: float) -> float:
    """The win rate EMA after a batch of games, as if they came one at a time in an order that
    spreads each outcome evenly: each game moves it by (1 - decay) towards its score."""
    n = wins + draws + losses
    if n <= 0:
        return payoff
    score = (wins + 0.5 * draws) / n
    kept = decay ** n
    return float(kept * payoff + (1.0 - kept) * score)


class League:
    """The population root's view of the league: its snapshots, the payoff matrix, and which
    snapshot each member's slots hold."""

    def __init__(self, roles: list[str], keep: int, slots: int, weighting: str = "hard", decay: float = 0.99):
        self.roles, self.keep, self.slots = list(roles), keep, slots
        self.weighting, self.decay = weighting, decay
        n = len(roles)
        # id -> (owner, its seq): the snapshots the league keeps (ids are never reused)
        self.snapshots: dict[int, tuple[int, int]] = {m: (m, 0) for m in range(n)}
        self.next_id = n
        self.newest = np.zeros(n, dtype=np.int64)  # each owner's newest seq (0: its initial weights)
        # owners that have said, in this launch, that they hold their snapshots (a member that was
        # complete before it holds none): only theirs are offered, so every ordered send is served
        self.present = np.zeros(n, dtype=bool)
        self.payoff: dict[tuple[int, int], float] = {}  # (member, snapshot id) -> its win rate EMA
        self.games: dict[tuple[int, int], int] = {}  # (member, snapshot id) -> games judged
        self.assigned = np.full((n, slots), -1, dtype=np.int64)  # member's slot -> snapshot id

    # --- snapshots ----------------------------------------------------------------------------------
    def add_snapshots(self, owner: int, newest: int) -> list[int]:
        """The owner's snapshots up to its seq `newest` are in the league (its reports say so);
        the ids of those new to it. Its snapshots older than its last `keep` leave the league,
        with their payoffs, so the league's size stays members x keep however long it runs."""
        added = []
        for seq in range(int(self.newest[owner]) + 1, newest + 1):
            self.snapshots[self.next_id] = (owner, seq)
            added.append(self.next_id)
            self.next_id += 1
        self.newest[owner] = max(self.newest[owner], newest)
        self._drop([sid for sid, (o, seq) in self.snapshots.items() if o == owner and seq <= newest - self.keep])
        return added

    def rewind(self, owner: int, newest: int) -> None:
        """The owner's newest seq is `newest`, below what the league knew (it resumed from a
        checkpoint older than the league's saved state): its later snapshots are gone for good,
        and the seqs it takes again are new snapshots."""
        self._drop([sid for sid, (o, seq) in self.snapshots.items() if o == owner and seq > newest])
        self.newest[owner] = newest

    def _drop(self, ids: list[int]) -> None:
        gone = set(ids)
        for sid in gone:
            del self.snapshots[sid]
        for key in [k for k in self.payoff if k[1] in gone]:
            del self.payoff[key]
            self.games.pop(key, None)

    def candidates(self, member: int) -> np.ndarray:
        """The snapshots `member` may be given, by its role (only those of owners present)."""
        here = [(sid, s) for sid, s in sorted(self.snapshots.items()) if self.present[s[0]]]
        if self.roles[member] == MAIN_EXPLOITER:
            wanted = {(m, int(self.newest[m])) for m, r in enumerate(self.roles) if r == MAIN}
            return np.array([sid for sid, s in here if s in wanted], dtype=np.int64)
        return np.array([sid for sid, _ in here], dtype=np.int64)

    # --- payoffs ------------------------------------------------------------------------------------
    def win_rate(self, member: int, sid: int) -> float:
        return self.payoff.get((member, sid), 0.5)

    def record(self, member: int, sid: int, wins: float, draws: float, losses: float) -> None:
        """Games `member` played against snapshot `sid` (its learner root's count since its last report)."""
        if sid not in self.snapshots:
            return  # a slot not yet filled, or a snapshot that has left the league: nothing to judge
        key = (member, sid)
        self.payoff[key] = ema_of_games(self.win_rate(member, sid), wins, draws, losses, self.decay)
        self.games[key] = self.games.get(key, 0) + int(wins + draws + losses)

    # --- matchmaking --------------------------------------------------------------------------------
    def assign(self, member: int, rng: np.random.Generator) -> list[tuple[int, int]]:
        """Draw the snapshots of `member`'s slots anew: `slots` draws, with replacement, from its
        candidates, by PFSP on its win rates (main agents and league exploiters) or uniformly (a
        main exploiter's mains). A slot keeps its snapshot where the draws hold it again, so
        only the others travel. The (slot, snapshot id) pairs that change."""
        cands = self.candidates(member)
        if not len(cands):
            return []
        weighting = "uniform" if self.roles[member] == MAIN_EXPLOITER else self.weighting
        p = pfsp_weights(np.array([self.win_rate(member, int(c)) for c in cands]), weighting)
        drawn = list(rng.choice(cands, size=self.slots, p=p))
        held = self.assigned[member]
        keep = np.zeros(self.slots, dtype=bool)
        for slot, sid in enumerate(held):
            if sid in drawn:
                drawn.remove(sid)
                keep[slot] = True
        changes = []
        for slot in np.flatnonzero(~keep):
            sid = int(drawn.pop(0))
            held[slot] = sid
            changes.append((int(slot), sid))
        return changes

    # --- saved between launches ---------------------------------------------------------------------
    def state(self) -> dict:
        """JSON data: the snapshots, each owner's newest, the payoffs and their game counts."""
        return {"roles": self.roles, "snapshots": [[sid, o, s] for sid, (o, s) in sorted(self.snapshots.items())],
                "next_id": self.next_id, "newest": self.newest.tolist(),
                "payoff": [[m, s, p, self.games.get((m, s), 0)] for (m, s), p in sorted(self.payoff.items())]}

    def restore(self, state: dict) -> None:
        """From `state` (a league of the same roles; ValueError otherwise)."""
        if list(state["roles"]) != self.roles:
            raise ValueError(f"it is a league of roles {state['roles']}, this one has {self.roles}")
        snapshots = {int(sid): (int(o), int(s)) for sid, o, s in state["snapshots"]}
        newest = np.array(state["newest"], dtype=np.int64)
        if len(newest) != len(self.roles) or any(not 0 <= o < len(self.roles) for o, _ in snapshots.values()):
            raise ValueError("its snapshots name members this league does not have")
        self.snapshots, self.newest, self.next_id = snapshots, newest, int(state["next_id"])
        self.payoff = {(int(m), int(s)): float(p) for m, s, p, _ in state["payoff"]}
        self.games = {(int(m), int(s)): int(g) for m, s, _, g in state["payoff"]}

    def by_owner(self) -> dict[tuple[int, int], tuple[int, float]]:
        """(member, owner) -> (games, win rate): each member's games against each owner's kept
        snapshots, their win rates weighted by games (pairs with no games left out)."""
        cells: dict[tuple[int, int], list[float]] = {}
        for (m, sid), rate in self.payoff.items():
            games = self.games.get((m, sid), 0)
            if games and sid in self.snapshots:
                cell = cells.setdefault((m, self.snapshots[sid][0]), [0, 0.0])
                cell[0] += games
                cell[1] += rate * games
        return {key: (int(g), s / g) for key, (g, s) in sorted(cells.items())}
