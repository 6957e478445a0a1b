"""League self-play (core/league.py, workers/league.py): the roles' opponents, PFSP draws and the
payoff EMA against hand-checked cases, a member's snapshots and slots, the holders' slots, the
config's refusals, and a league of 3 members on 12 ranks that resumes on 3."""
import json
import re

import numpy as np
import pytest

import yaml

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.core.league import (LEAGUE_EXPLOITER, MAIN, MAIN_EXPLOITER, League, ema_of_games, member_roles,
                               resets_after_snapshot, snapshot_rule)
from hpcrl.core.messages import weights_spec
from hpcrl.core.population import EXPLOIT, PAUSED, RESTART
from hpcrl.io.checkpoint import load_checkpoint
from hpcrl.io.metrics import read_metrics
from hpcrl.workers.league import LeagueMember, LeagueRoot, SnapshotRules, parse_report_part
from hpcrl.tools.plot_population import league_roles
from tests.conftest import mpirun, run_dir, run_hpcrl, small_config, write_config

ROLES = member_roles(1, 1, 1)


def test_roles_come_in_member_order():
    assert member_roles(2, 1, 1) == [MAIN, MAIN, MAIN_EXPLOITER, LEAGUE_EXPLOITER]


def test_each_role_is_offered_the_snapshots_its_role_plays():
    """Main agents and league exploiters: every snapshot the league keeps; main exploiters: the
    main agents' newest only. An owner keeps its last `keep`; only the owners present (that have
    reported in this launch, holding their snapshots) are offered."""
    league = League(ROLES, keep=2, slots=4)
    assert league.snapshots == {0: (0, 0), 1: (1, 0), 2: (2, 0)}  # every member's initial weights
    assert not len(league.candidates(0))  # nobody has reported yet
    league.present[:] = True
    assert league.add_snapshots(0, 3) == [3, 4, 5]  # member 0's seqs 1..3
    assert league.add_snapshots(2, 1) == [6]
    assert league.candidates(0).tolist() == [1, 2, 4, 5, 6]  # member 0 keeps seqs 2 and 3
    assert 0 not in league.snapshots and 3 not in league.snapshots  # its seqs 0 and 1 left the league
    assert league.candidates(2).tolist() == [1, 2, 4, 5, 6]
    assert league.candidates(1).tolist() == [5]  # the main agent's newest
    league.present[2] = False
    assert league.candidates(0).tolist() == [1, 4, 5]


def test_slots_are_drawn_by_pfsp_and_keep_what_is_drawn_again():
    """Win rates 0.5, 0 and 1 against the three initial snapshots: "hard" weighs them (1 - p)^2
    = 0.25, 1, 0, so 0.2, 0.8 and 0: the same draws as numpy's with those by hand."""
    league = League(ROLES, keep=4, slots=6)
    league.present[:] = True
    league.payoff = {(0, 0): 0.5, (0, 1): 0.0, (0, 2): 1.0}
    changes = league.assign(0, np.random.default_rng(7))
    expected = np.random.default_rng(7).choice([0, 1, 2], size=6, p=[0.2, 0.8, 0.0])
    assert changes == [(slot, int(sid)) for slot, sid in enumerate(expected)]
    assert 2 not in league.assigned[0]  # it always beats snapshot 2
    before = league.assigned[0].copy()
    again = league.assign(0, np.random.default_rng(8))
    drawn = np.random.default_rng(8).choice([0, 1, 2], size=6, p=[0.2, 0.8, 0.0])
    assert sorted(league.assigned[0].tolist()) == sorted(drawn.tolist())
    kept = 6 - len(again)  # a slot keeps its snapshot where the new draws hold it again
    assert kept == sum(min(list(before).count(s), list(drawn).count(s)) for s in set(drawn.tolist()))
    for slot, sid in again:
        assert before[slot] != sid
    # a main exploiter draws its mains uniformly, whatever its win rates
    league.payoff[(1, 0)] = 1.0
    league.assign(1, np.random.default_rng(0))
    assert set(league.assigned[1].tolist()) == {0}


def test_the_payoff_ema_moves_towards_each_batch_as_game_by_game():
    assert ema_of_games(0.5, 2, 0, 0, decay=0.5) == pytest.approx(0.875)  # 0.5 -> 0.75 -> 0.875
    sequential = 0.5
    for _ in range(10):
        sequential = 0.99 * sequential + 0.01 * 0.0
    assert ema_of_games(0.5, 0, 0, 10, decay=0.99) == pytest.approx(sequential)
    assert ema_of_games(0.3, 0, 0, 0, decay=0.9) == 0.3
    assert ema_of_games(0.5, 0, 4, 0, decay=0.9) == pytest.approx(0.5)  # draws count half
    league = League(ROLES, keep=4, slots=2, decay=0.5)
    league.record(0, 1, 1, 0, 1)
    league.record(0, 99, 5, 0, 0)  # no such snapshot: nothing to judge
    assert league.payoff == {(0, 1): pytest.approx(0.5)} and league.games == {(0, 1): 2}


def test_exploiters_reset_after_their_snapshots_as_their_roles_say():
    assert not any(resets_after_snapshot(MAIN, 1.0, 1, 0, s) for s in range(1, 50))
    assert all(resets_after_snapshot(MAIN_EXPLOITER, 0.0, 1, 1, s) for s in range(1, 50))
    draws = [resets_after_snapshot(LEAGUE_EXPLOITER, 0.25, 1, 2, s) for s in range(1, 401)]
    assert 60 <= sum(draws) <= 140  # 100 expected
    # a resume draws alike
    assert draws == [resets_after_snapshot(LEAGUE_EXPLOITER, 0.25, 1, 2, s) for s in range(1, 401)]


def test_with_restart_main_an_exploiter_starts_again_from_the_main_agent_it_beats_least(tmp_path):
    """The population root's pick (restart 'main'): after a snapshot that resets the exploiter (its
    role's draw, by its own seed), the present main agent whose newest snapshot it beats least;
    none for a main agent, a snapshot that does not reset, or restart 'initial'."""
    league = League(member_roles(2, 1, 1), keep=3, slots=2)
    root = LeagueRoot(None, league, np.random.default_rng(0), str(tmp_path), restart=([5, 6, 7, 8], 0.25))
    league.present[:] = True
    league.add_snapshots(0, 2)  # member 0's newest: seq 2, id 5
    league.add_snapshots(1, 1)  # member 1's: seq 1, id 6
    league.record(2, 5, 1, 0, 3)  # the main exploiter wins a quarter against member 0's newest
    assert root.restart_parent(2, [1]) == 0
    league.record(2, 6, 0, 0, 50)  # and loses nearly all against member 1's
    assert root.restart_parent(2, [1, 2]) == 1
    league.present[1] = False  # (complete before this launch: no state to send)
    assert root.restart_parent(2, [1]) == 0
    assert root.restart_parent(2, [0]) is None  # its initial weights are no snapshot of its training
    assert root.restart_parent(0, [3]) is None  # a main agent never starts again
    resets = [s for s in range(1, 40) if resets_after_snapshot(LEAGUE_EXPLOITER, 0.25, 8, 3, s)]
    assert 0 < len(resets) < 39
    assert [s for s in range(1, 40) if root.restart_parent(3, [s]) is not None] == resets
    assert LeagueRoot(None, league, np.random.default_rng(0), str(tmp_path)).restart_parent(2, [1]) is None
    # a report of two new snapshots where the league keeps one: both are new seqs, though one left already
    small = LeagueRoot(None, League(ROLES, keep=1, slots=2), np.random.default_rng(0), str(tmp_path / "keep1"))
    assert small.report(1, np.array([2.0, -1.0, -1.0])) == [1, 2]
    assert small.report(1, np.array([2.0, -1.0, -1.0])) == []


def test_a_member_that_restarts_from_a_main_agent_never_resets_itself_and_judges_the_copy_afresh():
    member = LeagueMember(MAIN_EXPLOITER, 1, 5, 4, 2, SnapshotRules(2, 1000, 0.25, 100, snapshot_win_rate=0.7,
                                                                        restart_from_main=True),
                          initial=lambda flat: flat.fill(0))
    member.set_slot(0, 3)
    member.add_games(np.array([[90, 0, 10], [0, 0, 0]]))
    assert member.snapshot_due(150)
    assert not member.take_snapshot(lambda flat: flat.fill(1), 150)  # the root orders the restart instead
    member.add_games(np.array([[100, 0, 0], [0, 0, 0]]))  # its own weights win on until the copy comes
    member.restarted(180)
    assert member.since.sum() == 0 and member.last_snapshot == 180
    member.add_games(np.array([[100, 0, 0], [0, 0, 0]]))
    assert not member.snapshot_due(279) and member.snapshot_due(280)  # ready_frames after the copy


def test_the_league_state_round_trips_and_a_member_that_went_back_retires_its_later_snapshots():
    league = League(ROLES, keep=3, slots=2)
    league.record(0, 1, 1, 0, 0)
    league.add_snapshots(1, 4)  # ids 3 to 6; it keeps seqs 2 to 4 (ids 4 to 6)
    assert (0, 1) not in league.payoff  # its seq 0 left the league with its payoffs
    league.record(0, 4, 3, 1, 0)
    again = League(ROLES, keep=3, slots=2)
    again.restore(json.loads(json.dumps(league.state())))
    assert again.snapshots == league.snapshots and again.payoff == league.payoff and again.games == league.games
    assert again.newest.tolist() == [0, 4, 0]
    assert again.by_owner() == {(0, 1): (4, pytest.approx(league.payoff[(0, 4)]))}  # 3 wins, 1 draw
    again.present[:] = True
    again.rewind(1, 2)  # member 1 resumed from a checkpoint at its seq 2
    assert again.add_snapshots(1, 3) == [7]  # its new seq 3 is a new snapshot
    assert [again.snapshots[i] for i in again.candidates(0)] == [(0, 0), (2, 0), (1, 2), (1, 3)]
    assert (0, 4) in again.payoff
    with pytest.raises(ValueError, match="roles"):
        League(member_roles(2, 1, 0), keep=3, slots=2).restore(league.state())


def _member(ring_snapshots: int = 2, slots: int = 3) -> LeagueMember:
    counter = iter(range(100))
    return LeagueMember(MAIN_EXPLOITER, 1, 5, num_params=4, slots=slots,
                        rules=SnapshotRules(keep=ring_snapshots, snapshot_frames=100, exploiter_reset=0.25,
                                            ready_frames=100), initial=lambda flat: flat.fill(next(counter)))


def test_a_member_snapshots_on_its_frame_rule_and_keeps_a_ring():
    member = _member()  # a ring of keep 2 + 1 + ready/snapshot 1 = 4
    assert member.seq == 0 and member.snapshot(0).tolist() == [0.0] * 4
    assert not member.snapshot_due(99) and member.snapshot_due(100)
    value = iter(range(1, 100))
    for frames in (130, 250, 300, 420, 510):
        assert member.take_snapshot(lambda flat: flat.fill(next(value)), frames)  # a main exploiter always resets
    assert member.seq == 5 and member.next_snapshot == 600
    assert [member.snapshot(s)[0] for s in (2, 3, 4, 5)] == [2, 3, 4, 5]
    assert member.snapshot(1)[0] == 2  # gone from the ring: the oldest held instead


def test_exploiters_snapshot_early_once_they_beat_their_slots_often_enough_and_mains_by_frames():
    assert snapshot_rule(MAIN, 1000, 2000, 0.7) == (1000, 0.0)  # a main agent: the frame rule alone
    assert snapshot_rule(MAIN_EXPLOITER, 1000, 2000, 0.7) == (2000, 0.7)  # an exploiter: its own timeout
    assert snapshot_rule(LEAGUE_EXPLOITER, 1000, 0, 0.0) == (1000, 0.0)  # 0: the main agents' interval
    member = LeagueMember(LEAGUE_EXPLOITER, 0, 5, 4, 2, SnapshotRules(2, 1000, 0.0, 100, snapshot_win_rate=0.7),
                          initial=lambda flat: flat.fill(0))
    member.set_slot(0, 3)
    member.set_slot(1, 4)
    member.add_games(np.array([[60, 10, 20], [0, 0, 0]]))  # 90 games: too few to judge
    assert not member.snapshot_due(150)
    member.add_games(np.array([[0, 0, 0], [6, 0, 4]]))  # 100 games, (66 + 5) / 100 = 0.71
    assert not member.snapshot_due(99)  # not yet ready_frames (100) after its last snapshot, at 0
    assert member.snapshot_due(150)
    assert not member.take_snapshot(lambda flat: flat.fill(1), 150)  # exploiter_reset 0: never resets
    assert not member.snapshot_due(150) and member.next_snapshot == 1000
    assert member.ring.shape[0] == 2 + 1 + 100 // 1000 + 1  # room for one early snapshot between reports
    again = LeagueMember(LEAGUE_EXPLOITER, 0, 5, 4, 2, SnapshotRules(2, 1000, 0.0, 100, snapshot_win_rate=0.7),
                         saved=member.state())
    again.add_games(np.array([[99, 0, 0], [0, 0, 0]]))
    assert not again.snapshot_due(260)
    again.add_games(np.array([[1, 0, 0], [0, 0, 0]]))
    assert not again.snapshot_due(249) and again.snapshot_due(250)  # the resumed member waits from 150 too
    older = {**member.state(), "league_counters": member.state()["league_counters"][:2]}
    assert LeagueMember(LEAGUE_EXPLOITER, 0, 5, 4, 2, SnapshotRules(2, 1000, 0.0, 100), saved=older).last_snapshot == 0


def test_weights_messages_carry_every_slot_once_per_cycle_and_games_count_by_snapshot():
    member = _member(slots=3)
    for slot, sid in enumerate((10, 11, 12)):
        member.set_slot(slot, sid, np.full(4, sid, dtype=np.float32))
    message = weights_spec(4, league=True).allocate()
    for cycle in range(3):
        seen = []
        for version in range(3 * cycle, 3 * cycle + 3):
            member.fill_message(message, version)
            seen.append(int(message.get("slot")))
            assert message["slot_params"][0] == message.get("slot_id") == 10 + seen[-1]
        assert sorted(seen) == [0, 1, 2]
    member.add_games(np.array([[2, 0, 1], [0, 0, 0], [1, 1, 0]]))
    member.set_slot(2, 10)
    member.add_games(np.array([[1, 0, 0], [0, 0, 0], [0, 0, 3]]))
    newest, slot_ids, games = parse_report_part(np.array(member.report_part()), 3)
    assert newest == 0 and slot_ids.tolist() == [10, 11, 10]
    assert games.tolist() == [[10, 3, 0, 4], [12, 1, 1, 0]]
    assert parse_report_part(np.array(member.report_part()), 3)[2].size == 0  # counted once


def test_a_member_restores_its_snapshots_and_slots_from_a_checkpoint():
    member = _member()
    member.take_snapshot(lambda flat: flat.fill(7), 150)
    member.set_slot(1, 3, np.arange(4, dtype=np.float32))
    again = LeagueMember(MAIN_EXPLOITER, 1, 5, 4, 3, SnapshotRules(2, 100, 0.25, 100),
                         saved={k: v.copy() for k, v in member.state().items()})
    assert again.seq == 1 and again.next_snapshot == 200 and again.snapshot(1)[0] == 7
    assert again.slot_ids.tolist() == [-1, 3, -1] and again.slot_params[1].tolist() == [0, 1, 2, 3]
    larger = LeagueMember(MAIN_EXPLOITER, 1, 5, 4, 3, SnapshotRules(5, 100, 0.25, 100), saved=member.state())  # keep 5
    assert len(larger.ring) == 7 and [larger.snapshot(s)[0] for s in (0, 1)] == [0, 7]  # each at its seq's place
    with pytest.raises(ValueError, match="league_ring"):  # another model
        LeagueMember(MAIN_EXPLOITER, 1, 5, 6, 3, SnapshotRules(2, 100, 0.25, 100), saved=member.state())


def test_a_holder_loads_a_slot_only_when_its_snapshot_changes_and_never_from_a_first_version():
    """A league member's policy holder, as env ranks and policy servers build it: each weights
    message carries one slot, which its runner loads when the snapshot is new to it."""
    from hpcrl.workers.selfplay import LeaguePool
    from hpcrl.workers.policy_server import build_runner
    from hpcrl.envs import env_spaces
    cfg = _parsed(_league_dict())
    spaces = env_spaces(cfg.env)
    pool = LeaguePool([build_runner(cfg, spaces, "cpu", "inline_policy", 0, policy=1 + k) for k in range(2)])
    from hpcrl.models import num_params
    n = num_params(pool.runners[0].model)
    from hpcrl.workers.trainer import _no_slot
    first = weights_spec(n, league=True).allocate()  # a fresh member's first version: no slot in it yet
    _no_slot(first)
    pool.offer(None, 0, first)
    assert pool.ids == [-1, -1] and (first.get("slot"), first.get("slot_id")) == (-1, -1)
    message = weights_spec(n, league=True).allocate()
    message["slot_params"][...] = 0.25
    message.set(slot=1, slot_id=-1, version=3)
    pool.offer(None, 3, message)  # no snapshot in that slot yet
    assert pool.ids == [-1, -1]
    message.set(slot=1, slot_id=4)
    pool.offer(None, 3, message)
    assert pool.ids == [-1, 4] and all((p == 0.25).all() for p in pool.runner(1).model.parameters())
    message["slot_params"][...] = 0.5  # the same snapshot again: not loaded again
    pool.offer(None, 4, message)
    assert all((p == 0.25).all() for p in pool.runner(1).model.parameters())
    assert not all((p == 0.25).all() for p in pool.runner(0).model.parameters())


def games_by_owner(state: dict) -> dict[tuple[int, int], int]:
    """(member, snapshot owner) -> games, from a league_state.json's payoff matrix."""
    owners = {sid: o for sid, o, _ in state["snapshots"]}
    games: dict[tuple[int, int], int] = {}
    for m, sid, p, g in state["payoff"]:
        assert 0.0 <= p <= 1.0
        games[(m, owners[sid])] = games.get((m, owners[sid]), 0) + g
    return games


def _league_dict(tmp_path=None, **league) -> dict:
    cfg = small_config(tmp_path or __import__("pathlib").Path("/tmp"), name="league",
                       roles={"learner": {"ranks": 1}, "inference": {"ranks": 0}},
                       env={"id": "pettingzoo:classic/connect_four-v3", "num_envs": 4},
                       algo={"name": "ippo", "rollout_length": 32,
                             "selfplay": {"pool": 4, "latest": 0.4, "anchor_share": 0.2,
                                          "anchors": {"uniform": "hpcrl.envs.anchors:uniform"}}},
                       run={"total_frames": 12288}, model={"encoder": "mlp", "hidden_sizes": [32]})
    cfg["population"] = {"members": 3, "ready_frames": 1024,
                         "league": {"main": 1, "main_exploiters": 1, "league_exploiters": 1, "snapshot_frames": 2048,
                                    "keep": 3, **league}}
    return cfg


def _parsed(data: dict):
    return parse_config(yaml.safe_dump(data), "league.yaml")


@pytest.mark.parametrize("change, message", [
    ({"population": {"league": {"main": 0, "main_exploiters": 2, "league_exploiters": 1}}}, "at least one main"),
    ({"population": {"league": {"main": 2}}}, "population.members is 3"),
    ({"population": {"explore": {"algo.lr": {"perturb": [0.8, 1.2]}}}}, "not copied onto each other"),
    ({"population": {"league": {"keep": 0}}}, "population.league.keep"),
    ({"population": {"league": {"opponents": "easy"}}}, "population.league.opponents"),
    ({"population": {"league": {"exploiter_reset": 1.5}}}, "exploiter_reset"),
    ({"population": {"league": {"restart": "random"}}}, "population.league.restart: expected one of initial, main"),
    ({"population": {"league": {"exploiter_snapshot_frames": -1}}}, "exploiter_snapshot_frames: expected a number"),
    ({"algo": {"selfplay": {"pool": 0}}}, "algo.selfplay.pool >= 1"),
])
def test_a_league_config_is_refused_with_the_key_to_change(change, message):
    cfg = _league_dict()
    for section, values in change.items():
        for key, value in values.items():
            if isinstance(value, dict) and isinstance(cfg[section].get(key), dict):
                cfg[section][key] = {**cfg[section][key], **value}
            else:
                cfg[section][key] = value
    with pytest.raises(ConfigError, match=re.escape(message)):
        _parsed(cfg)


def test_exploiters_never_play_themselves_and_draw_their_slots_uniformly():
    from hpcrl.core.members import member_config, member_role
    cfg = _parsed(_league_dict())
    assert [member_role(cfg, m) for m in range(3)] == ROLES
    members = [member_config(cfg, m) for m in range(3)]
    assert [m.algo.selfplay.latest for m in members] == [0.4, 0.0, 0.0]
    assert {m.algo.selfplay.opponents for m in members} == {"uniform"}


def test_a_league_of_three_members_on_12_ranks_plays_each_others_snapshots_and_resumes_on_3(tmp_path):
    """Each member on 4 ranks: 2 learners averaging with Horovod, and 2 env ranks that hold the
    policy inline, so the slots travel down the parameter stream to other ranks. The population
    root's league: every member's snapshots, the main agent's games against the exploiters'
    snapshots, the main exploiter's only against the main agent's. The main exploiter starts
    again after every snapshot and the main agent never; the main exploiter's 2 learners stay
    bit-identical through its resets (the root's reset reaches the other learner as a copy
    does); checkpoints hold the snapshots and slots. Resumed on 3 ranks (every member serial: its
    slots now reach its holder in-process), the league goes on from the saved payoff matrix, and
    `hpcrl plot` labels the members by role."""
    cfg = _league_dict(tmp_path, snapshot_frames=1024)  # 6 snapshots and 12 reports a member, as at twice the frames
    cfg["population"]["ready_frames"] = 512
    cfg["run"].update(total_frames=6144, replica_digests=True)
    cfg["roles"]["learner"]["ranks"] = 2
    path = write_config(tmp_path, cfg)
    result = mpirun(12, "run", str(path), timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    state = json.loads((run_dir(cfg) / "league_state.json").read_text())
    newest = state["newest"]
    assert all(n >= 4 for n in newest), newest  # 6,144 frames, a snapshot every 1,024
    games = games_by_owner(state)
    assert {o for (m, o) in games if m == 1} == {0}, games  # the main exploiter: the main agent only
    resets = {m: len(re.findall(rf"member{m} \(\w+\)\] league: started again", result.stdout)) for m in range(3)}
    assert resets[0] == 0 and resets[1] == newest[1], (resets, newest)
    digests = read_metrics(str(run_dir(cfg) / "member1" / "metrics.h5"))["replica_digest"]
    assert digests.shape[1] == 2 and np.all(digests[:, 0] == digests[:, 1])
    saved = load_checkpoint(str(run_dir(cfg) / "member1" / "checkpoint.h5"))["parts"]["league"]
    assert saved["league_counters"][0] == newest[1]
    assert (saved["league_slot_ids"] >= 0).all()
    assert len(saved["league_ring"]) == 3 + 1 + 512 // 1024

    before = {(m, s): g for m, s, _, g in state["payoff"]}
    cfg["run"]["total_frames"] = 8192
    cfg["roles"]["learner"]["ranks"] = 1
    cfg["population"]["league"]["restart"] = "main"
    result = mpirun(3, "run", str(write_config(tmp_path, cfg)), timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("resuming from") == 3 and "serial mode" in result.stdout
    state = json.loads((run_dir(cfg) / "league_state.json").read_text())
    assert all(n >= 6 for n in state["newest"]), state["newest"]
    # restart 'main': the main exploiter starts again from the main agent's newest snapshot, moved at
    # its next report after each of its own snapshots, and never from its initial weights any more
    table = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    restarts = table["event"] == RESTART
    assert set(table["parent"][restarts].astype(int)) == {0} and 1 in set(table["member"][restarts].astype(int))
    assert not (table["event"] == EXPLOIT).any()
    taken = result.stdout.count("league: started again from main agent 0's newest snapshot")
    assert restarts.sum() - 2 <= taken <= restarts.sum() and taken >= 1  # (one each may come after its stop)
    assert "started again from its initial weights" not in result.stdout
    # over both launches (how soon the exploiters' first snapshots come depends on the members' paces: under
    # load the main agent once drew only its own in the first), the main agent plays the exploiters' snapshots
    # and the league exploiter every member's
    later = games_by_owner(state)
    both = {k: max(games.get(k, 0), later.get(k, 0)) for k in set(games) | set(later)}
    assert both.get((0, 1), 0) + both.get((0, 2), 0) > 0, both
    assert both.get((2, 0), 0) + both.get((2, 1), 0) > 0, both
    # the payoff matrix went on from the saved one: every game of a snapshot still kept is still counted
    # (which snapshots are still kept, and were played before, depends on the games' pace: often none)
    after = {(m, s): g for m, s, _, g in state["payoff"]}
    kept = {sid for sid, _, _ in state["snapshots"]}
    assert all(after.get(k, 0) >= before[k] for k in before if k[1] in kept), (before, after)
    assert league_roles(str(run_dir(cfg))) == ROLES
    plotted = run_hpcrl("plot", str(run_dir(cfg)), "-o", str(tmp_path / "league.png"))
    assert plotted.returncode == 0 and (tmp_path / "league.png").stat().st_size > 0, plotted.stderr

    # on 2 ranks (a node lost): the main agent and the main exploiter go on, the league exploiter is
    # paused (its checkpoint kept, its snapshots out of the draws while it is away); then all 3 again
    newest = state["newest"]
    frames_2 = load_checkpoint(str(run_dir(cfg) / "member2" / "checkpoint.h5"))["counters"]["frames"]
    cfg["run"]["total_frames"] = 10240
    result = mpirun(2, "run", str(write_config(tmp_path, cfg)), timeout=400)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert ("resumed 3 members on 2 ranks: 2 running on 1 rank each, 1 paused (member 2: its checkpoint waits "
            "for a launch on 3 ranks or more)") in result.stdout, result.stdout
    table = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    assert table["member"][table["event"] == PAUSED].tolist() == [2]
    state = json.loads((run_dir(cfg) / "league_state.json").read_text())
    assert state["newest"][0] > newest[0] and state["newest"][1] > newest[1] and state["newest"][2] == newest[2]
    assert load_checkpoint(str(run_dir(cfg) / "member2" / "checkpoint.h5"))["counters"]["frames"] == frames_2
    for m in (0, 1):
        assert load_checkpoint(str(run_dir(cfg) / f"member{m}" / "checkpoint.h5"))["counters"]["frames"] >= 10240
