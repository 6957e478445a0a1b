"""The fixed connect four players that trained policies are rated against (hpcrl/envs/anchors.py),
checked by hand and in real PettingZoo games, and played through `hpcrl eval --opponent`."""
import os
import subprocess
import sys

import numpy as np
import pytest
from pettingzoo.classic import connect_four_v3

from hpcrl.envs.anchors import chances, mistake, one_step_lookahead, uniform
from tests.conftest import REPO


def board(mine=(), theirs=()) -> np.ndarray:
    """The flattened observation of the agent to move: (row, column) cells, row 5 the bottom."""
    b = np.zeros((6, 7, 2), dtype=np.int8)
    for r, c in mine:
        b[r, c, 0] = 1
    for r, c in theirs:
        b[r, c, 1] = 1
    return b.reshape(1, -1)


def test_the_lookahead_wins_when_it_can_and_blocks_when_it_must():
    rng, open_columns = np.random.default_rng(0), np.ones((1, 7), dtype=np.int8)
    three_in_a_row = board(mine=[(5, 0), (5, 1), (5, 2)], theirs=[(4, 0), (4, 1)])
    assert one_step_lookahead(three_in_a_row, open_columns, rng).tolist() == [3]
    their_column = board(mine=[(5, 0), (5, 1)], theirs=[(5, 4), (4, 4), (3, 4)])
    assert one_step_lookahead(their_column, open_columns, rng).tolist() == [4]  # (2, 4) would be their fourth
    # a row not to move (no valid column) gets a placeholder the env does not use
    assert one_step_lookahead(board(), np.zeros((1, 7), dtype=np.int8), rng).tolist() == [0]


def test_mistakes_are_the_ones_the_lookahead_punishes_at_once():
    open_columns = np.ones(7, dtype=np.int8)
    three_in_a_row = board(mine=[(5, 0), (5, 1), (5, 2)], theirs=[(5, 4), (4, 4), (3, 4)])
    assert chances(three_in_a_row, open_columns) == ([3], [4])
    assert mistake(three_in_a_row, open_columns, 3) is None
    assert mistake(three_in_a_row, open_columns, 4) == "missed win"  # a win beats a block
    their_column = board(mine=[(5, 0), (5, 1)], theirs=[(5, 4), (4, 4), (3, 4)])
    assert [mistake(their_column, open_columns, c) for c in (4, 2)] == [None, "missed block"]
    # their three on row 4 wants (4, 3); a piece at (5, 3) lifts it within reach
    under = board(mine=[(5, 0), (5, 1), (5, 2), (5, 5)], theirs=[(4, 0), (4, 1), (4, 2), (5, 6)])
    assert chances(under, open_columns) == ([3], [])  # ...but here the bottom row wins first
    under = board(mine=[(5, 0), (5, 1), (5, 4), (5, 5)], theirs=[(4, 0), (4, 1), (4, 2), (5, 2)])
    assert chances(under, open_columns) == ([], [])
    assert [mistake(under, open_columns, c) for c in (3, 6)] == ["under a threat", None]
    # a column that is not valid (full) is no one's chance
    assert chances(three_in_a_row, np.array([1, 1, 1, 0, 1, 1, 1], dtype=np.int8)) == ([], [4])


def play(first, second, games: int, seed: int = 0) -> tuple[int, int]:
    """Real games (the AEC API): first's wins, second's wins."""
    rng, wins = np.random.default_rng(seed), [0, 0]
    env = connect_four_v3.env()
    for game in range(games):
        env.reset(seed=seed + game)
        players = dict(zip(env.agents, (first, second)))
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, _ = env.last()
            if terminated or truncated:
                if reward > 0:
                    wins[env.possible_agents.index(agent)] += 1
                env.step(None)
                continue
            env.step(int(players[agent](obs["observation"].reshape(1, -1), obs["action_mask"][None], rng)[0]))
    return tuple(wins)


def test_the_lookahead_beats_a_uniform_player_nearly_always_in_either_seat():
    first, _ = play(one_step_lookahead, uniform, 100)
    _, second = play(uniform, one_step_lookahead, 100, seed=1000)
    assert first >= 90 and second >= 90, (first, second)


def test_eval_refuses_a_scripted_opponent_it_cannot_import(tmp_path):
    from hpcrl.tools.evaluate import _Scripted as _scripted
    from hpcrl.tools.inspect import RunDirError
    with pytest.raises(RunDirError, match="cannot import module 'tests.no_such_module'"):
        _scripted("tests.no_such_module:player", 0)
    with pytest.raises(RunDirError, match="module 'hpcrl.envs.anchors' has no 'nobody'"):
        _scripted("hpcrl.envs.anchors:nobody", 0)
    with pytest.raises(RunDirError, match="is not a function"):
        _scripted("hpcrl.envs.anchors:ROWS", 0)


def test_the_shipped_jobs_anchors_import_from_a_copy_outside_the_checkout(tmp_path):
    """A user copies a shipped self-play job into their own directory and runs it there: its
    anchors come from the installed package, not from this repository's tests/."""
    script = ("import sys\n"
              "from hpcrl.core.config import load_config\n"
              "from hpcrl.envs.scripted import anchor_players\n"
              "for path in sys.argv[1:]:\n"
              "    players = anchor_players(load_config(path)[0].algo.selfplay)\n"
              "    print(path, len(players))\n")
    jobs = [j for j in sorted((REPO / "jobs").glob("*.yaml")) if "anchors:" in j.read_text()]
    assert {j.name for j in jobs} >= {"connect_four_selfplay.yaml", "connect_four_league.yaml"}
    copies = []
    for job in jobs:
        (tmp_path / job.name).write_text(job.read_text())
        copies.append(job.name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script, *copies], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [word for name in copies for word in (name, "2")]
