"""A league member's side of league self-play (core/league.py decides), on its learner root.

- Snapshots. The member's weights are frozen at its start (seq 0) and then every
  `snapshot_frames` of its training, into a ring a little larger than what the league keeps, so a
  snapshot the population root picked just before newer ones pushed it out of the league is still
  here to send. Each report tells the root the newest seq. Right after a snapshot
  an exploiter may start again (core/league.resets_after_snapshot): from its initial weights, here
  at once; or, with population.league.restart 'main', from a main agent's newest snapshot, which
  the root orders moved once the report tells it of the snapshot (`LeagueRoot.restart_parent`).
- Slots. The K snapshots the member's policy holders play against (algo.selfplay.pool). The root
  orders each change: the snapshot's owner sends the weights to this learner root, over MPI in
  memory as a population's copies travel (runtime/member_copy.py); a snapshot of its own it copies
  from its ring.
- The holders. Every weights message carries one slot besides the policy (core/messages.
  weights_spec), and a holder loads it when its snapshot is new to it (workers/selfplay.LeaguePool).
  The slots go in a fresh random order every K versions, drawn from the version, so a holder that
  skips versions (the parameter stream is newest-only) still gets each slot again within a few
  cycles (a fixed order could keep step with its skips), and a resumed run sends them as the
  uninterrupted one would. So no stream of its own is needed and nothing is sent twice to a
  holder that keeps up: each slot travels once per K versions.
- Games. The trainers count the games against each slot (workers/trainer_stats.py); the learner
  root adds them up by the snapshot the slot holds and sends them with its next report. Games
  played in the versions between a slot's change and its arrival at a holder count against the
  new snapshot, a small error the EMA forgets.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hpcrl.core.league import MAIN, League, resets_after_snapshot, ring_size
from hpcrl.core.seeds import seed_for
from hpcrl.core.say import say

# The population root's orders of a snapshot's move (after workers/population_root.py's):
# [SNAPSHOT_SEND, to member, seq] to the owner; [SNAPSHOT_RECEIVE, from owner, slot, snapshot id] to
# the member; [SNAPSHOT_LOCAL, slot, snapshot id, seq] to a member given a snapshot of its own;
# [SNAPSHOT_RESTART, from owner] to an exploiter that starts again from the snapshot sent.
SNAPSHOT_SEND, SNAPSHOT_RECEIVE, SNAPSHOT_LOCAL, SNAPSHOT_RESTART = 6.0, 7.0, 8.0, 9.0
SNAPSHOT_ORDERS = (SNAPSHOT_SEND, SNAPSHOT_RECEIVE, SNAPSHOT_LOCAL)  # (a restart's is served apart: it adopts)
STATE_FILE = "league_state.json"
MAX_STATE_BYTES = 64 * 2**20
SAVE_INTERVAL_S = 10.0  # the league's state is written at most this often (and when the population ends)

SAVED_KEYS = ("league_ring", "league_ring_seq", "league_slots", "league_slot_ids", "league_counters",
              "league_since")
WIN_RATE_GAMES = 100  # games a snapshot's win-rate rule waits for (population.league.snapshot_win_rate)


@dataclass(frozen=True)
class SnapshotRules:
    """When a league member takes snapshots and starts again (population.league). `keep`: the
    snapshots the league keeps of it; `snapshot_frames`: a snapshot every so many frames of its
    training (or early, at `snapshot_win_rate` against its slots); `exploiter_reset`: an
    exploiter's chance to start again after a snapshot; `ready_frames`: the population's.
    `restart_from_main` (population.league.restart 'main'): it never starts again by itself; the
    population root orders a main agent's newest snapshot to it instead (LeagueRoot.restart_parent)."""

    keep: int
    snapshot_frames: int
    exploiter_reset: float
    ready_frames: int
    snapshot_win_rate: float = 0.0
    restart_from_main: bool = False


class LeagueMember:
    def __init__(self, role: str, member: int, run_seed: int, num_params: int, slots: int, rules: SnapshotRules,
                 saved: dict | None = None, initial: Callable[[np.ndarray], None] | None = None):
        """`saved`: what a checkpoint held (`state`); else `initial` copies the weights it
        starts with into snapshot 0 (the ring: core/league.ring_size)."""
        keep, snapshot_frames, ready_frames = rules.keep, rules.snapshot_frames, rules.ready_frames
        snapshot_win_rate, exploiter_reset, restart_from_main = (rules.snapshot_win_rate, rules.exploiter_reset,
                                                                 rules.restart_from_main)
        self.role, self.member, self.run_seed = role, member, run_seed
        self.restart_from_main = restart_from_main
        self.snapshot_frames, self.exploiter_reset = snapshot_frames, exploiter_reset
        self.snapshot_win_rate = snapshot_win_rate
        self.since = np.zeros(3)  # (wins, draws, losses) against the slots since the last snapshot
        self.ready_frames, self.last_snapshot = ready_frames, 0
        ring = ring_size(keep, ready_frames, snapshot_frames, snapshot_win_rate)
        self.ring = np.zeros((ring, num_params), dtype=np.float32)
        self.ring_seq = np.full(ring, -1, dtype=np.int64)
        self.slot_params = np.zeros((slots, num_params), dtype=np.float32)
        self.slot_ids = np.full(slots, -1, dtype=np.int64)
        self.seq, self.next_snapshot = -1, 0
        self.games: dict[int, np.ndarray] = {}  # snapshot id -> (wins, draws, losses) since the last report
        self._warned = False
        if saved:
            self.restore(saved)
        else:
            self.take_snapshot(initial, 0)

    # --- snapshots ----------------------------------------------------------------------------------
    def snapshot_due(self, frames: int) -> bool:
        """By the frame rule, or early by the win-rate rule (snapshot_win_rate, over WIN_RATE_GAMES),
        which waits `ready_frames` after the last snapshot: the league hears of a snapshot at the
        member's next report, and the ring holds one early snapshot between two reports."""
        games = self.since.sum()
        return frames >= self.next_snapshot or bool(
            self.snapshot_win_rate and games >= WIN_RATE_GAMES and frames - self.last_snapshot >= self.ready_frames
            and (self.since[0] + 0.5 * self.since[1]) / games >= self.snapshot_win_rate)

    def take_snapshot(self, fill: Callable[[np.ndarray], None], frames: int) -> bool:
        """Freeze the weights (`fill` copies them into a vector) as the next seq; whether the
        member now starts again from its initial weights (with restart 'main', never here)."""
        self.seq += 1
        i = self.seq % len(self.ring)
        fill(self.ring[i])
        self.ring_seq[i] = self.seq
        self.since[:] = 0.0
        self.last_snapshot = frames
        self.next_snapshot = (frames // self.snapshot_frames + 1) * self.snapshot_frames
        return not self.restart_from_main and self.seq > 0 and resets_after_snapshot(
            self.role, self.exploiter_reset, self.run_seed, self.member, self.seq)

    def restarted(self, frames: int) -> None:
        """It started again from a main agent's snapshot (restart 'main'): the win-rate rule judges
        the new weights from here, not the games its old ones won before the snapshot came."""
        self.since[:] = 0.0
        self.last_snapshot = frames

    def snapshot(self, seq: int) -> np.ndarray:
        """Snapshot `seq`'s weights, to send. One already out of the ring (the root picked it
        before it learned of two newer ones) gives way to the oldest held, said once."""
        i = seq % len(self.ring)
        if self.ring_seq[i] != seq:
            i = int(np.argmin(np.where(self.ring_seq >= 0, self.ring_seq, np.iinfo(np.int64).max)))
            if not self._warned:
                say(f"league: member {self.member}'s snapshot {seq} is no longer kept; sending snapshot "
                    f"{self.ring_seq[i]} in its place (it took more snapshots than expected between the root's "
                    f"pick and this send)")
                self._warned = True
        return self.ring[i]

    # --- slots --------------------------------------------------------------------------------------
    def set_slot(self, slot: int, sid: int, weights: np.ndarray | None = None) -> None:
        """Slot `slot` now holds snapshot `sid` (its weights received in place, or `weights`)."""
        if weights is not None:
            self.slot_params[slot] = weights
        self.slot_ids[slot] = sid

    def fill_message(self, message, version: int) -> None:
        """Put one slot into the weights message of `version`: the k-th of a random order of the
        slots drawn for each cycle of K versions."""
        k = len(self.slot_ids)
        cycle, place = divmod(int(version), k)
        order = np.random.default_rng(seed_for(self.run_seed, "league", self.member, cycle, 1)).permutation(k)
        slot = int(order[place])
        message["slot_params"][...] = self.slot_params[slot]
        message.set(slot=slot, slot_id=int(self.slot_ids[slot]))

    # --- games and reports --------------------------------------------------------------------------
    def add_games(self, slot_games: np.ndarray) -> None:
        """One update's games against each slot (wins, draws, losses), by the snapshot it holds."""
        for slot, row in enumerate(np.asarray(slot_games)):
            sid = int(self.slot_ids[slot])
            if row.sum() and sid >= 0:
                self.games[sid] = self.games.get(sid, np.zeros(3)) + row
                self.since += row

    def report_part(self) -> list[float]:
        """What the next report adds: the newest seq, each slot's snapshot id, then (id, wins,
        draws, losses) per snapshot played since the last report (taken: counted once)."""
        games = [v for sid, row in sorted(self.games.items()) for v in (sid, *row)]
        self.games = {}
        return [self.seq, *self.slot_ids.tolist(), *games]

    # --- checkpoints --------------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """What a checkpoint keeps (the learner's part 'league'): the ring, the slots, the counters."""
        return {"league_ring": self.ring, "league_ring_seq": self.ring_seq, "league_slots": self.slot_params,
                "league_slot_ids": self.slot_ids,
                "league_counters": np.array([self.seq, self.next_snapshot, self.last_snapshot], dtype=np.int64),
                "league_since": self.since}

    def restore(self, saved: dict) -> None:
        """From a checkpoint of a member of the same model and pool (ValueError otherwise); its ring
        may have another length."""
        parts = {k: np.asarray(saved[k]) for k in SAVED_KEYS}
        ring, slots = parts["league_ring"], parts["league_slots"]
        if ring.shape[1:] != self.ring.shape[1:] or slots.shape != self.slot_params.shape:
            raise ValueError(f"the checkpoint's league_ring and league_slots are {ring.shape} and {slots.shape}, "
                             f"this league member holds {self.ring.shape} and {self.slot_params.shape} "
                             f"(algo.selfplay.pool or the model changed)")
        # the ring may differ in length (keep or the snapshot rule changed): each snapshot goes to its
        # seq's place, oldest first, so the newest win where two meet
        for i in np.argsort(parts["league_ring_seq"], kind="stable"):
            seq = int(parts["league_ring_seq"][i])
            if seq >= 0:
                self.ring[seq % len(self.ring)], self.ring_seq[seq % len(self.ring)] = ring[i], seq
        self.slot_params[...], self.slot_ids[...] = slots, parts["league_slot_ids"]
        counters = [int(v) for v in parts["league_counters"]]
        self.seq, self.next_snapshot = counters[:2]
        # a checkpoint from before the win-rate rule waited has no last snapshot: the frame rule's last point
        self.last_snapshot = counters[2] if len(counters) > 2 else max(0, self.next_snapshot - self.snapshot_frames)
        self.since[...] = parts["league_since"]


def parse_report_part(values: np.ndarray, slots: int) -> tuple[int, np.ndarray, np.ndarray]:
    """The population root's reading of `LeagueMember.report_part`: (newest seq, slot ids,
    rows of (snapshot id, wins, draws, losses))."""
    values = np.asarray(values, dtype=np.float64)
    return int(values[0]), values[1:1 + slots].astype(np.int64), values[1 + slots:].reshape(-1, 4)


class LeagueRoot:
    """The population root's league: it reads the members' reports into the league (their new
    snapshots, their games), draws each reporting member's slots anew and orders the moves, and
    saves the league (its snapshots and payoff matrix) beside the lineage, as JSON data, every
    SAVE_INTERVAL_S at most (its size grows with members x keep) and when the population ends; a
    resumed population reads it back."""

    def __init__(self, channel, league: League, rng: np.random.Generator, run_dir: str,
                 restart: tuple[list[int], float] | None = None):
        """`restart`: (each member's seed, exploiter_reset) where exploiters start again from a main
        agent's newest snapshot (population.league.restart 'main'): this picks the main agent
        (`restart_parent`) and orders the snapshot's move."""
        self.channel, self.league, self.rng = channel, league, rng
        self.restart = restart
        self.path = os.path.join(run_dir, STATE_FILE)
        self.write_failed = False
        self.saved_at = -SAVE_INTERVAL_S
        if os.path.exists(self.path):
            self._load()

    def on_report(self, member: int, part: np.ndarray, ready: bool, holds_snapshots: bool) -> int | None:
        """A member's report, with its league part (`part`; none from a member complete before this
        launch, which holds no snapshots to send): read it; after a READY report, order the
        exploiter's start again from a main agent's newest snapshot where its snapshot calls for
        it, and draw its slots anew; save when due. The main agent it starts again from, if any."""
        self.league.present[member] = holds_snapshots
        added = self.report(member, part) if len(part) else []
        parent = self.restart_parent(member, added) if ready else None
        if parent is not None:  # the pair back to back, as a slot's move
            seq = int(self.league.newest[parent])
            self.channel.order(parent, [SNAPSHOT_SEND, member, seq])
            self.channel.order(member, [SNAPSHOT_RESTART, parent])
        if ready:
            self.match(member)
        self.save()
        return parent

    def report(self, member: int, part: np.ndarray) -> list[int]:
        """A member's report: its newest snapshot, what its slots hold, its games since the last.
        The seqs of its snapshots new to the league."""
        newest, slot_ids, games = parse_report_part(part, self.league.slots)
        if newest < self.league.newest[member]:
            self.league.rewind(member, newest)
        # (by seq: with a small keep, some of them may have left the league already)
        added = list(range(int(self.league.newest[member]) + 1, newest + 1))
        self.league.add_snapshots(member, newest)
        self.league.assigned[member] = slot_ids  # the member's own word (a resumed member's, from its checkpoint)
        for sid, wins, draws, losses in games:
            self.league.record(member, int(sid), wins, draws, losses)
        return added

    def restart_parent(self, member: int, seqs: list[int]) -> int | None:
        """With restart 'main': after a new snapshot that starts the exploiter `member` again
        (core/league.resets_after_snapshot), the main agent it starts again from, the present
        one whose newest snapshot it beats least (the first on a tie); None otherwise."""
        if self.restart is None:
            return None
        seeds, probability = self.restart
        role = self.league.roles[member]
        if not any(resets_after_snapshot(role, probability, seeds[member], member, seq) for seq in seqs if seq > 0):
            return None
        mains = [m for m, r in enumerate(self.league.roles) if r == MAIN and self.league.present[m]]
        rates = [self.league.win_rate(member, self._snapshot_id(m, int(self.league.newest[m]))) for m in mains]
        return mains[int(np.argmin(rates))] if mains else None

    def _snapshot_id(self, owner: int, seq: int) -> int:
        """The id of owner's snapshot `seq` in the league (-1: none kept)."""
        return next((sid for sid, s in self.league.snapshots.items() if s == (owner, seq)), -1)

    def match(self, member: int) -> None:
        """Draw the member's slots anew and order the moves of the snapshots that change."""
        for slot, sid in self.league.assign(member, self.rng):
            owner, seq = self.league.snapshots[sid]
            if owner == member:
                self.channel.order(member, [SNAPSHOT_LOCAL, slot, sid, seq])
            else:  # the pair back to back: every member serves its orders in the order they were issued
                self.channel.order(owner, [SNAPSHOT_SEND, member, seq])
                self.channel.order(member, [SNAPSHOT_RECEIVE, owner, slot, sid])

    def save(self, now: bool = False) -> None:
        """The league's state, if SAVE_INTERVAL_S have passed since the last save (or `now`)."""
        if self.write_failed or (not now and time.monotonic() - self.saved_at < SAVE_INTERVAL_S):
            return
        self.saved_at = time.monotonic()
        temporary = self.path + ".tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as fh:
                json.dump(self.league.state(), fh)
            os.replace(temporary, self.path)
        except OSError as exc:
            self.write_failed = True
            say(f"warning: league: cannot write {self.path} ({exc.strerror or exc}); the league plays on, "
                f"but a resume would start its payoff matrix from the last one saved")

    def _load(self) -> None:
        """The league a previous launch left (data, read bounded)."""
        try:
            with open(self.path, "rb") as fh:
                state = json.loads(fh.read(MAX_STATE_BYTES + 1)[:MAX_STATE_BYTES + 1])
            self.league.restore(state)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"cannot resume the league from {self.path}: {type(exc).__name__}: {exc}; move it "
                               f"aside to start the league's payoff matrix afresh") from None
