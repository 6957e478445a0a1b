"""Does the league learn? jobs/connect_four_league.yaml (a main agent, a main exploiter and a league
exploiter on connect four, one rank each), summed up from its population directory:

- per member, its win rate against each anchor (hpcrl/envs/anchors.py: a uniform player and a one-step
  lookahead player) by quarter of its frames, from the anchor games the run plays untrained (a
  tenth of its games), and its OpenSkill rating at the start, its peak and its end;
- `hpcrl eval` of each member's final checkpoint: GAMES games against each anchor, and the main
  agent against each exploiter;
- the league's payoff matrix as the population root left it (league_state.json), by owner;
- the main agent's mistakes against the one-step player, in GAMES more games: how often it took
  the wins and blocked the threats it had, and the first mistake of each game it lost;
- for scale, two scripted players with perfect one-move tactics against the one-step player.

Writes summary.json and two plots (`hpcrl plot` of the population: the ratings, and the win rate
against the one-step player) into --out-dir, and prints the summary as JSON.

    .venv/bin/python bench/league.py --population runs/connect_four_league \\
        [--out-dir jobs/results/connect_four_league]
    .venv/bin/python bench/league.py --run   (runs the job first, on 3 ranks: about an hour here)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit  # noqa: E402
from solve import timed  # noqa: E402
from hpcrl.core.league import League, member_roles  # noqa: E402
from hpcrl.io.metrics import read_metrics  # noqa: E402

JOB = REPO / "jobs" / "connect_four_league.yaml"
ANCHORS = {"uniform": "hpcrl.envs.anchors:uniform", "one_step": "hpcrl.envs.anchors:one_step_lookahead"}
GAMES = 200
QUARTERS = 4


def by_quarter(metrics: dict, anchor: str) -> list[float | None]:
    """The win rate against `anchor` over the anchor games of each quarter of the member's frames."""
    frames, games = metrics["frames"], metrics[f"anchor.{anchor}.games"]
    wins = np.nan_to_num(metrics[f"anchor.{anchor}.win_rate"]) * games
    edges = np.linspace(0, frames[-1], QUARTERS + 1)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        rows = (frames > lo) & (frames <= hi)
        out.append(round(float(wins[rows].sum() / games[rows].sum()), 3) if games[rows].sum() else None)
    return out


def evaluate(run: Path, opponent: str) -> dict:
    cmd = [sys.executable, "-m", "hpcrl", "eval", str(run), "--episodes", str(GAMES), "--json", "--opponent", opponent]
    _, out = timed(cmd, f"hpcrl eval {run.name} --opponent {opponent}")
    result = json.loads(out)
    return {k: result[k] for k in ("wins", "draws", "losses", "win_rate")}


def mistakes(run: Path) -> dict:
    """The run's final weights against the one-step player (sampled actions, as `evaluate`): its
    chances to win at once and to block, what it missed (hpcrl/envs/anchors.py:mistake), and by which
    first mistake it lost each game it lost (one the one-step player punishes at once). Also the
    policy's mean probability of a winning column where it had one, and of a blocking column where
    it faced a threat without a win: a measure of the tactics less noisy than the sampled moves."""
    from hpcrl.tools.evaluate import evaluate as play
    from hpcrl.envs.anchors import MISTAKES, chances, mistake
    counts = {"win chances": 0, "block chances": 0, **{kind: 0 for kind in MISTAKES}}
    first: dict[int, str] = {}
    chance_of = _column_probabilities(run)
    taken: dict[str, list[float]] = {"p(win)": [], "p(block)": []}

    def watch(game, seat, rows, mask, actions, active):
        if not active[seat]:
            return
        found = wins, blocks = chances(rows[seat], mask[seat])
        counts["win chances"] += bool(wins)
        counts["block chances"] += bool(blocks) and not wins
        if wins or blocks:
            taken["p(win)" if wins else "p(block)"].append(float(chance_of(rows[seat], mask[seat])[wins or blocks].sum()))
        kind = mistake(rows[seat], mask[seat], int(actions[seat]), found)
        if kind:
            counts[kind] += 1
            first.setdefault(game, kind)

    result = play(str(run), GAMES, opponent=ANCHORS["one_step"], seed=1, watch=watch)
    lost = [g for g, r in enumerate(result.returns) if r < 0]
    lost_after = {kind or "no such mistake": sum(first.get(g) == kind for g in lost) for kind in (*MISTAKES, None)}
    return {**counts, **{k: round(float(np.mean(v)), 3) if v else None for k, v in taken.items()}, "games": GAMES,
            "won": sum(r > 0 for r in result.returns), "lost": len(lost), "lost after": lost_after}


def _column_probabilities(run: Path):
    """f(row, mask): the run's final policy's probability of each action for one agent's row."""
    import torch
    from hpcrl.envs import env_spaces
    from hpcrl.models import build_policy
    from hpcrl.tools.evaluate import load_run
    cfg, checkpoint, _, _ = load_run(str(run))
    model = build_policy(env_spaces(cfg.env), cfg)
    model.load_state_dict(checkpoint["model"])

    @torch.no_grad()
    def chance_of(row: np.ndarray, mask: np.ndarray) -> np.ndarray:
        n = len(mask)
        obs = torch.as_tensor(row, dtype=torch.float32)[None].expand(n, *row.shape)
        logp, _, _ = model.evaluate(obs, torch.arange(n), torch.as_tensor(mask, dtype=torch.bool)[None].expand(n, n))
        return logp.exp().numpy()
    return chance_of


def league_table(pop: Path, roles: list[str], keep: int, slots: int) -> dict:
    league = League(roles, keep, slots)
    league.restore(json.loads((pop / "league_state.json").read_text()))
    return {f"member {member} vs member {owner}'s snapshots": {"games": games, "win_rate": round(rate, 3)}
            for (member, owner), (games, rate) in league.by_owner().items()}


def tactician(centre: bool):
    """A scripted player with perfect one-move tactics: a win, else a block, else a column that
    gives the opponent no win on top of it (hpcrl/envs/anchors.py:mistake), drawn uniformly or, with
    `centre`, weighted towards the centre ((4 - |column - 3|)^2)."""
    from hpcrl.envs.anchors import chances, mistake

    def play(board: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> int:
        found = wins, blocks = chances(board, mask)
        if wins or blocks:
            return (wins or blocks)[0]
        valid = [int(c) for c in np.flatnonzero(mask)]
        safe = [c for c in valid if mistake(board, mask, c, found) is None] or valid
        weights = np.array([(4 - abs(c - 3)) ** 2 if centre else 1 for c in safe], dtype=float)
        return int(rng.choice(safe, p=weights / weights.sum()))
    return play


def references(games: int = 2 * GAMES, seed: int = 0) -> dict:
    """What 80% against the one-step player takes: the win rates of the two tacticians against it
    in PettingZoo's own game, the seats alternating."""
    from pettingzoo.classic import connect_four_v3
    from hpcrl.envs.anchors import one_step_move as one_step
    rng, env, out = np.random.default_rng(seed), connect_four_v3.env(), {}
    for name, player in (("tactics, else uniform", tactician(False)),
                         ("tactics, else towards the centre", tactician(True))):
        won = 0
        for game in range(games):
            env.reset(seed=seed + game)
            mine = env.agents[game % 2]
            for agent in env.agent_iter():
                obs, reward, terminated, truncated, _ = env.last()
                if terminated or truncated:
                    won += agent == mine and reward > 0
                    env.step(None)
                    continue
                move = player if agent == mine else one_step
                env.step(move(obs["observation"], obs["action_mask"].astype(bool), rng))
        out[name] = round(won / games, 3)
    return out


def summarize(pop: Path) -> dict:
    import yaml
    cfg = yaml.safe_load((pop / "config.yaml").read_text())
    lg = cfg["population"]["league"]
    roles = member_roles(lg.get("main", 0), lg.get("main_exploiters", 0), lg.get("league_exploiters", 0))
    members = {}
    for m, role in enumerate(roles):
        run = pop / f"member{m}"
        metrics = read_metrics(str(run / "metrics.h5"))
        rating = metrics["rating"][np.isfinite(metrics["rating"])]
        members[f"member{m}"] = {
            "role": role, "frames": int(metrics["frames"][-1]), "wall_time_s": round(float(metrics["wall_time"][-1])),
            "rating": {"first": round(float(rating[0]), 1), "peak": round(float(rating.max()), 1),
                       "last": round(float(rating[-1]), 1)},
            "anchor_win_rate_by_quarter": {a: by_quarter(metrics, a) for a in ANCHORS},
            "eval": {a: evaluate(run, player) for a, player in ANCHORS.items()}}
    for m in range(1, len(roles)):
        members["member0"]["eval"][f"member{m}"] = evaluate(pop / "member0", str(pop / f"member{m}"))
    members["member0"]["mistakes against one_step"] = mistakes(pop / "member0")
    members["member0"]["scripted players against one_step"] = references()
    return {"job": str(JOB.relative_to(REPO)), "eval_games": GAMES, "members": members,
            "payoff": league_table(pop, roles, lg.get("keep", 16), cfg["algo"]["selfplay"]["pool"])}


def plots(pop: Path, out: Path) -> None:
    for name, extra in (("rating.png", []), ("one_step.png", ["--metric", "anchor.one_step.win_rate"])):
        subprocess.run([sys.executable, "-m", "hpcrl", "plot", str(pop), "-o", str(out / name), "--smooth", "0.95",
                        *extra], check=True, cwd=REPO)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--population", type=Path, help="a finished league's directory")
    parser.add_argument("--run", action="store_true", help="run the job first (3 ranks)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "jobs/results/connect_four_league")
    args = parser.parse_args()
    if args.run == bool(args.population):
        parser.error("give either --population DIR or --run")
    with tempfile.TemporaryDirectory() as tmp:
        pop = args.population
        seconds = None
        if args.run:
            cmd = ["bash", str(REPO / "scripts/mpirun.sh"), "-n", "3", sys.executable, "-m", "hpcrl", "run", str(JOB),
                   "--set", f"run.output_dir={tmp}"]
            seconds, _ = timed(cmd, JOB.name)
            pop = Path(tmp) / "connect_four_league"
        args.out_dir.mkdir(parents=True, exist_ok=True)
        summary = {**summarize(pop), **({"seconds_from_launch": round(seconds)} if seconds else {})}
        plots(pop, args.out_dir)
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    emit(summary, str(REPO / "bench/results/league.json"))


if __name__ == "__main__":
    main()
