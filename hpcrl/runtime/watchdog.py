"""A rank that stops making progress ends the job loudly instead of burning the allocation.

The poll loop ticks the watchdog on every pass and says when a pass did work. A background
thread checks the ticks:
- no tick for `hang_timeout_s`: this rank is stuck inside its own work (an env step that never
  returns, a forward pass); it says what it was doing and aborts the job;
- ticks but no work for twice that: it has waited that long for peers (what it waits for is in
  its status, e.g. the env ranks whose fragments are missing); it says so and aborts.
The stuck rank reports first, since the ranks waiting on it time out later. Heartbeats ride on
the poll loop itself: no extra messages.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable


STARTUP_GRACE_S = 120.0  # building roles imports torch and sizes models: slow on a loaded node, not a hang


class Watchdog:
    def __init__(self, hang_timeout_s: float, describe: Callable[[], str], abort: Callable[[], None],
                 rank: int, check_every_s: float = 1.0):
        self.hang_timeout_s = hang_timeout_s
        self.describe, self.abort, self.rank = describe, abort, rank
        now = time.monotonic()
        self.last_tick = self.last_work = now
        self.polling = False  # until the first tick the rank is starting up, judged by STARTUP_GRACE_S
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(check_every_s,), name="hpcrl-watchdog",
                                        daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def tick(self, did_work: bool) -> None:
        now = time.monotonic()
        self.last_tick = now
        if did_work or not self.polling:  # waiting for peers is counted from the first poll on
            self.last_work = now
        self.polling = True

    def stop(self) -> None:
        self._stop.set()

    def _watch(self, every: float) -> None:
        while not self._stop.wait(every):
            now = time.monotonic()
            stuck, idle = now - self.last_tick, now - self.last_work
            if not self.polling:
                if stuck > max(self.hang_timeout_s, STARTUP_GRACE_S):
                    self._fail(f"has spent {stuck:.0f} s starting up: {self.describe()}")
            elif stuck > self.hang_timeout_s:
                self._fail(f"has been stuck for {stuck:.0f} s in its own work; the last thing it was doing: "
                           f"{self.describe()}")
            elif idle > 2 * self.hang_timeout_s:
                self._fail(f"has waited {idle:.0f} s for its peers: {self.describe()}")

    def _fail(self, what: str) -> None:
        sys.stderr.write(f"hpcrl: rank {self.rank} {what} (run.hang_timeout_s = {self.hang_timeout_s:g}); "
                         f"aborting the job\n")
        sys.stderr.flush()
        self.abort()
