"""Peer liveness: a rank that stops hearing a neighbour ends the job in seconds, on both sides.

Why: a node that dies ends an Open MPI job at once (its connections close), but a node cut off
from the network sends no error at all. Its peers' messages just stop: TCP retransmits for about
15 minutes before it gives up, the watchdog judges waiting only after 2 x `run.hang_timeout_s`
(meant for legitimately long env steps and minibatches), and Open MPI's abort cannot cross the cut
either. Each rank therefore watches a few peers of its own, on a short clock of its own
(`run.peer_timeout_s`).

Whom a rank watches: its neighbours on the control tree (`control.control_parents`), its parent
and at most four children: O(1) peers whatever the world size, and one edge per node crosses the
network. Any cut of the nodes breaks at least one tree edge, so every part of a partition holds a
rank that notices, and reaches the rest of its part along the tree.

Protocol, on a communicator of its own, from a thread (so a rank inside a long step of its own
still answers; `hang_timeout_s` judges that step):
- BEAT: every `beat_s` a rank tells each neighbour it is alive; it keeps one receive posted per
  neighbour.
- A neighbour silent for `peer_timeout_s` is lost: this rank says which rank, role and node it
  lost, sends END to its other neighbours and ends.
- END from a neighbour: passed on to the others, then this rank ends too.
- BYE: a rank whose run is over sends BYE to every neighbour (its last word to each) and waits for
  theirs, still watching those that have not said it yet; no message is left unmatched.
Ending (`comm.leave_cut_off_job`) waits END_GRACE_S first, so the END words and the message leave
before the launcher may be stopped.
"""
from __future__ import annotations

import enum
import sys
import threading
import time
from typing import Callable, Sequence

import numpy as np
from mpi4py import MPI

END_GRACE_S = 5.0  # after END goes out: time for it and the message to reach the other ranks and the launcher
BYE_POLL_S = 0.002  # while waiting for the neighbours' BYE at the end of a run
BEAT_MAX_S = 3.0  # the longest time between two beats (shorter for short timeouts)


class Word(enum.IntEnum):
    BEAT = 1
    END = 2
    BYE = 3


TAG = 1
WORDS = 3  # int64 words of a message: the kind, the rank that lost a peer, the peer it lost


class PeerWatch:
    """One rank's liveness thread. `start()` after the control tree is built; `close()` when the
    run is over on this rank (returns once every neighbour has said BYE)."""

    def __init__(self, comm, rank: int, neighbours: Sequence[int], timeout_s: float,
                 describe: Callable[[int], str], end: Callable[[], None]):
        """`describe(rank)`: a peer's role and node for the message; `end()`: leave the job (never
        returns)."""
        self.comm, self.rank = comm, rank
        self.neighbours = [int(n) for n in neighbours]
        self.timeout_s = timeout_s
        self.beat_s = min(BEAT_MAX_S, timeout_s / 10)
        self.describe, self.end = describe, end
        now = time.monotonic()
        self.heard = np.full(len(self.neighbours), now)
        self.said_bye = np.zeros(len(self.neighbours), dtype=bool)
        self._inbox = np.zeros((len(self.neighbours), WORDS), dtype=np.int64)
        # a buffer per neighbour and kind: a beat still in flight never shares one with END or BYE
        self._outbox = np.zeros((len(self.neighbours), len(Word), WORDS), dtype=np.int64)
        self._recvs = [comm.Irecv(self._inbox[i], source=n, tag=TAG) for i, n in enumerate(self.neighbours)]
        self._beats = [MPI.REQUEST_NULL] * len(self.neighbours)  # the last beat to each neighbour
        self._words: list = []  # END and BYE: one of each per neighbour at most
        self._next_beat = now
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcrl-peers", daemon=True)

    def start(self) -> "PeerWatch":
        if self.neighbours:
            self._thread.start()
        return self

    def close(self) -> None:
        """Say BYE and wait for every neighbour's BYE (watching the others meanwhile)."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join()
        self.comm.Free()

    # --- the thread ---
    def _run(self) -> None:
        try:
            self._watch()
        except Exception:  # an MPI error here ends the job as one on the main thread would
            sys.excepthook(*sys.exc_info())

    def _watch(self) -> None:
        tick = min(1.0, self.beat_s / 2)
        bye_sent = False
        last_pass = time.monotonic()
        while True:
            self._take_words()
            now = time.monotonic()
            # Silence counts only while this rank itself was running: after it was stopped or
            # starved (SIGSTOP, a frozen or throttled node), its peers' words are still in flight
            missed = now - last_pass - 2 * tick  # (tick: the longest sleep between passes)
            if missed > 0:
                self.heard += missed
            last_pass = now
            if self._closing.is_set() and not bye_sent:
                self._send_all(Word.BYE)
                bye_sent = True
            if bye_sent and self.said_bye.all():
                MPI.Request.Waitall(self._beats + self._words)  # to ranks that are leaving too: they complete
                return
            if not bye_sent and now >= self._next_beat:
                self._send_all(Word.BEAT)
                self._next_beat = now + self.beat_s
            silent = np.flatnonzero(~self.said_bye & (now - self.heard > self.timeout_s))
            if len(silent):
                self._lost(self.neighbours[silent[0]], now - self.heard[silent[0]])
            if bye_sent:
                time.sleep(BYE_POLL_S)  # the neighbours' BYEs are due within milliseconds
            else:
                self._closing.wait(tick)  # close() wakes the thread at once: a run ends without delay

    def _take_words(self) -> None:
        """Every word that has arrived (after a stop, several beats and maybe END wait in line)."""
        for i in range(len(self.neighbours)):
            while self._recvs[i] != MPI.REQUEST_NULL and self._recvs[i].Test():
                kind, origin, lost = (int(w) for w in self._inbox[i])
                self.heard[i] = time.monotonic()
                if kind == Word.BYE:
                    self.said_bye[i] = True
                    self._recvs[i] = MPI.REQUEST_NULL  # BYE is a neighbour's last word to this rank
                    break
                if kind == Word.END:
                    self._end(origin, lost, skip=i)
                self._recvs[i] = self.comm.Irecv(self._inbox[i], source=self.neighbours[i], tag=TAG)

    def _send_all(self, kind: Word, origin: int = -1, lost: int = -1, skip: int = -1) -> None:
        for i, peer in enumerate(self.neighbours):
            if i == skip or (self.said_bye[i] and kind != Word.BYE):
                continue  # a neighbour that said BYE hears only this rank's BYE
            if kind == Word.BEAT and not self._beats[i].Test():
                continue  # the last beat has not left (a peer that stopped reading): no pile-up
            buffer = self._outbox[i, kind - 1]
            buffer[:] = (kind, origin, lost)
            request = self.comm.Isend(buffer, dest=peer, tag=TAG)
            if kind == Word.BEAT:
                self._beats[i] = request
            else:
                self._words.append(request)

    def _lost(self, peer: int, silent_s: float) -> None:
        sys.stderr.write(f"hpcrl: rank {self.rank} ({self.describe(self.rank)}) has heard nothing from rank {peer} "
                         f"({self.describe(peer)}) for {silent_s:.0f} s (run.peer_timeout_s = {self.timeout_s:g}): "
                         f"that node is unreachable, stopped or gone; ending the job on every node this rank can "
                         f"reach, then this rank\n")
        sys.stderr.flush()
        self._end(self.rank, peer, skip=self.neighbours.index(peer))

    def _end(self, origin: int, lost: int, skip: int) -> None:
        """END to every neighbour but `skip` (the lost one, or the one END came from), then leave."""
        self._send_all(Word.END, origin, lost, skip=skip)
        time.sleep(END_GRACE_S)
        self.end()


def start_peer_watch(world, rank: int, neighbours: Sequence[int], timeout_s: float,
                     describe: Callable[[int], str], end: Callable[[], None]) -> PeerWatch:
    """Collective over `world`: every rank's liveness thread, on a duplicate of `world`."""
    return PeerWatch(world.Dup(), rank, neighbours, timeout_s, describe, end).start()
