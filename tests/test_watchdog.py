"""The watchdog gives start-up its own, longer allowance, then judges the poll loop by hang_timeout_s."""
import time

from hpcrl.runtime import watchdog
from hpcrl.runtime.watchdog import Watchdog


def run_watchdog(monkeypatch, ticks_after: float | None, watch_for: float) -> list[str]:
    monkeypatch.setattr(watchdog, "STARTUP_GRACE_S", 0.6)
    aborted: list[str] = []
    dog = Watchdog(0.2, describe=lambda: "env: stepping envs", abort=lambda: aborted.append("abort"), rank=3,
                   check_every_s=0.05).start()
    if ticks_after is not None:
        time.sleep(ticks_after)
        dog.tick(True)  # the poll loop has started
    time.sleep(watch_for)
    dog.stop()
    return aborted


def test_slow_start_up_is_not_a_hang(monkeypatch, capsys):
    assert run_watchdog(monkeypatch, ticks_after=None, watch_for=0.4) == []  # 0.4 s > hang_timeout, < grace


def test_start_up_beyond_the_grace_aborts(monkeypatch, capsys):
    assert run_watchdog(monkeypatch, ticks_after=None, watch_for=0.9)
    assert "rank 3 has spent" in capsys.readouterr().err


def test_once_polling_a_stuck_rank_aborts_after_hang_timeout(monkeypatch, capsys):
    assert run_watchdog(monkeypatch, ticks_after=0.4, watch_for=0.4)  # 0.4 s without a tick > 0.2 s
    err = capsys.readouterr().err
    assert "rank 3 has been stuck for" in err and "stepping envs" in err
