"""Fixed players for connect four (PettingZoo connect_four_v3), to rate trained policies against
(`hpcrl eval RUN --opponent hpcrl.envs.anchors:one_step_lookahead`). Each takes the env's rows (every
agent's own observation, the 6 x 7 x 2 board flattened: plane 0 the agent's own pieces, plane 1
the opponent's, row 0 the top), their action masks and a numpy generator, and returns an action
per row."""
import numpy as np

ROWS, COLUMNS = 6, 7


def uniform(obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A uniform choice among each row's valid columns (0 for a row not to move: no valid column)."""
    return np.array([rng.choice(np.flatnonzero(m)) if m.any() else 0 for m in mask], dtype=np.int64)


def one_step_lookahead(obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Win now if a column does it, else block the opponent's win in one, else a uniform valid
    column. It beats the uniform player in about 98% of games."""
    return np.array([one_step_move(o, m, rng) for o, m in zip(obs, mask)], dtype=np.int64)


def one_step_move(board: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> int:
    """The one-step player's column on one [6, 7, 2] (or flattened) board (0: not its turn)."""
    valid = np.flatnonzero(mask)
    if not len(valid):  # not this row's turn
        return 0
    wins, blocks = chances(board, mask)
    return int((wins or blocks or [rng.choice(valid)])[0])  # a winning move first, then a block


def chances(board: np.ndarray, mask: np.ndarray) -> tuple[list[int], list[int]]:
    """The columns that win at once for the agent to move, and those where the opponent's next
    piece would win (the ones to block), on its [6, 7, 2] (or flattened) board."""
    mine, theirs = _planes(board)
    out: tuple[list[int], list[int]] = ([], [])
    for found, plane in zip(out, (mine, theirs)):
        for column in np.flatnonzero(mask):
            row = _drop_row(mine | theirs, column)
            if row is not None and _fours(plane, row, column):
                found.append(int(column))
    return out


MISTAKES = ("missed win", "missed block", "under a threat")


def mistake(board: np.ndarray, mask: np.ndarray, column: int,
            found: tuple[list[int], list[int]] | None = None) -> str | None:
    """What is wrong with playing `column` here, as the one-step player punishes it: a win left
    untaken, a threat of the opponent's left unblocked (with no win to take instead), or a piece
    that lets the opponent win on top of it; None for a move without such a fault. `found`: the
    board's `chances`, where the caller has them already."""
    wins, blocks = found if found is not None else chances(board, mask)
    if wins:
        return None if column in wins else MISTAKES[0]
    if blocks and column not in blocks:
        return MISTAKES[1]
    mine, theirs = _planes(board)
    row = _drop_row(mine | theirs, column)
    if row is not None and row > 0 and _fours(theirs, row - 1, column):
        return MISTAKES[2]
    return None


def _planes(board: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The [6, 7] boolean planes of the agent's own pieces and the opponent's, from its [6, 7, 2]
    (or flattened) board."""
    board = board.reshape(ROWS, COLUMNS, 2)
    return board[..., 0].astype(bool), board[..., 1].astype(bool)


def _drop_row(taken: np.ndarray, column: int) -> int | None:
    """Where a piece dropped in `column` lands (the lowest empty row; row 0 is the top)."""
    empty = np.flatnonzero(~taken[:, column])
    return int(empty[-1]) if len(empty) else None


def _fours(plane: np.ndarray, row: int, column: int) -> bool:
    """Whether a piece at (row, column) makes four in a line with the pieces of `plane`."""
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < ROWS and 0 <= c < COLUMNS and plane[r, c]:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False
