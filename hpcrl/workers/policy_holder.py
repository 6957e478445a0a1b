"""What a policy holder runs, with no transport: a policy server, an env rank's inline policy and
`hpcrl eval` hold their policies through this module. `PolicySet` is the runners of a holder's
policies (models: PolicyRunner for PPO, models.q:QRunner for DQN), one per policy id, and their
weights' subscriptions; `RequestBatch` answers requests together in one forward pass per policy;
the functions below it keep a recurrent policy's hidden states. Nothing here imports MPI: the
parameter streams' ends come in from the wiring (workers/policy_server.py), and eval, one process
without MPI, gives none.
"""
from __future__ import annotations

import numpy as np

from hpcrl.core.messages import END, KEEP_ENV_STATE, VALUES_ONLY, Message
from hpcrl.core.observations import apply, assign, count_rows, take
from hpcrl.models import Runner
from hpcrl.workers.selfplay import LeaguePool, Pool


class PolicySet:
    """The policies a holder runs: a runner per policy id, each fed by that policy's parameter
    stream (one of each in a run of one policy). With several, a batch's rows are split by the
    policy id each row carries (the request's `policy` field), each runner takes its own rows in
    one forward pass, and the results go back in row order. A central critic reads whole envs of
    its own agents: rows keep their order, so a request's rows of one policy are still whole envs.
    With a self-play pool (workers/selfplay.py), ids after the training policies' are its ages."""

    def __init__(self, runners: list[Runner], weights: list, pool: Pool | LeaguePool | None = None):
        self.runners, self.weights, self.pool = runners, weights, pool
        self.outputs = runners[0].outputs
        self.ended = False  # a parameter stream has closed: the trainers have stopped
        self.flags = 0  # the newest version's KEEP_ENV_STATE, which its replies pass on to the env ranks

    @property
    def version(self) -> int:
        """The oldest version held (the trainers of all policies update in step, so versions agree
        once every policy's has arrived)."""
        return self.runners[0].version if len(self.runners) == 1 else min(r.version for r in self.runners)

    def act(self, obs: np.ndarray, out: dict[str, np.ndarray], mask: np.ndarray | None,
            policy: np.ndarray | None = None, state: np.ndarray | None = None,
            keys: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """`state`: a recurrent policy's hidden states of the rows, advanced in place. `keys`: each
        row's (global index, action step), which key its draws."""
        extra = {} if state is None else {"state": state}
        if policy is None:
            self.runners[0].act(obs, out, mask, keys=keys, **extra)
            return
        for p, rows in self._rows(policy):
            part = {name: values[rows] for name, values in out.items()}
            rows_state = {} if state is None else {"state": state[rows]}
            self._runner(p).act(take(obs, rows), part, None if mask is None else mask[rows],
                                keys=None if keys is None else (keys[0][rows], keys[1][rows]), **rows_state)
            for name, values in part.items():
                out[name][rows] = values
            if state is not None:
                state[rows] = rows_state["state"]

    def value(self, obs: np.ndarray, out: np.ndarray, policy: np.ndarray | None = None,
              state: np.ndarray | None = None) -> None:
        """`state`: a recurrent policy's hidden states of the rows, left as they are."""
        extra = {} if state is None else {"state": state}
        if policy is None:
            self.runners[0].value(obs, out, **extra)
            return
        for p, rows in self._rows(policy):
            part = out[rows]
            self._runner(p).value(take(obs, rows), part, **({} if state is None else {"state": state[rows]}))
            out[rows] = part

    def _rows(self, policy: np.ndarray):
        for p in np.unique(policy):
            yield int(p), np.flatnonzero(policy == p)

    def _runner(self, p: int) -> Runner:
        return self.runners[p] if p < len(self.runners) else self.pool.runner(p - len(self.runners))

    def poll_weights(self) -> int:
        """Load each policy's newest version that has arrived; the versions taken (END counts)."""
        taken = 0
        for runner, weights in zip(self.runners, self.weights):
            message = weights.poll()
            if message is None:
                continue
            taken += 1
            if message.get("flags") & END:  # the stream closes; why the run stops is on the control stream
                self.ended = True
            else:
                runner.load(message["params"], message.get("version"))
                self.flags = message.get("flags") & KEEP_ENV_STATE
                weights.rearm()
                if self.pool is not None:
                    self.pool.offer(runner, runner.version, message)
        return taken

    def finished(self) -> bool:
        """Every parameter stream has closed here (a node's leader has passed END on)."""
        return all(w.finished() for w in self.weights)

    def close(self) -> None:
        for w in self.weights:
            w.close()


class RequestBatch:
    """Requests answered together: their rows gathered into one batch, one forward pass per
    policy, the outputs scattered back into each reply. A policy server batches every ready
    request; an inline policy is a batch of one, through the same code. Before the actions, each
    request's final observations get their values and a recurrent policy's rows their start
    states; after them, the states of requests that advance move on.

    Each row's draws are keyed by (its global row index, its action step), from the request's
    header, so they never depend on the batch. Its bits do, in torch's CPU kernels (a row's
    logits differ in the last bits with the batch size), so with `block` (run.deterministic) every
    request is computed alone, in forward passes of `block` rows each: an env's actions are then
    the same whichever requests arrived together, and, with the same block on every layout,
    whichever rank holds the env."""

    def __init__(self, policies: PolicySet, request: Message, reply: Message, capacity: int, state_size: int = 0,
                 block: int | None = None):
        """Room for `capacity` requests shaped like `request` and `reply`; `block`: rows per forward
        pass, each request alone (a divisor of its rows), or None: every request of a batch in one."""
        self.policies = policies
        self.per_request = count_rows(request["obs"])
        if block is not None and self.per_request % block:
            raise ValueError(f"a forward block of {block} rows does not divide a request's {self.per_request}")
        self.block = block
        self.offsets = np.arange(self.per_request, dtype=np.int64)  # a request's rows after its first
        rows = capacity * self.per_request
        self.keys = (np.zeros(rows, np.int64), np.zeros(rows, np.int64))  # the batch's rows' (index, step)
        self.obs = apply(lambda leaf: np.zeros((rows, *leaf.shape[1:]), dtype=leaf.dtype), request["obs"])
        self.mask = (np.zeros((rows, *request["action_mask"].shape[1:]), dtype=np.uint8)
                     if "action_mask" in request.arrays else None)  # envs that give action masks
        self.policy = (np.zeros(rows, dtype=np.int16)
                       if "policy" in request.arrays else None)  # the policy of each row (several policies)
        self.state = np.zeros((rows, state_size), np.float32) if state_size else None
        self.out = {name: np.zeros((rows, *reply[name].shape[1:]), dtype=reply[name].dtype)
                    for name in policies.outputs}

    def answer(self, items: list[tuple[Message, Message, np.ndarray | None]]) -> None:
        """Fill the reply of each (request, reply, the request's hidden states or None)."""
        for request, reply, states in items:
            final_values(self.policies, request, reply, states, alone=self.block is not None)
            if states is not None:
                begin_states(request, reply, states)
        if len(items) == 1 or self.block is not None:
            for request, reply, states in items:
                self._answer_alone(request, reply, states)
        else:
            self.policies.act(*self._gather(items))
            self._scatter(items)
        for _, reply, _ in items:
            reply.set(version=self.policies.version, flags=self.policies.flags)

    def _keys(self, request: Message) -> tuple[np.ndarray, np.ndarray]:
        """Each row's (global index, action step): what keys its draws."""
        return self.offsets + request.get("row0"), np.full(self.per_request, request.get("step"), np.int64)

    def _answer_alone(self, request: Message, reply: Message, states: np.ndarray | None) -> None:
        """One request, acted on in place (no gather or scatter: a copy per step cost an inline
        policy 4% of its frames in bench/sampling.py), in forward passes of `block` rows."""
        obs, mask, policy = request["obs"], request.arrays.get("action_mask"), request.arrays.get("policy")
        state = None if states is None else states if advances(request) else states.copy()
        out = {name: reply[name] for name in self.policies.outputs}
        rows, steps = self._keys(request)
        block = self.block or self.per_request
        for start in range(0, self.per_request, block):
            b = slice(start, start + block)
            self.policies.act(take(obs, b), {name: values[b] for name, values in out.items()},
                              None if mask is None else mask[b], None if policy is None else policy[b],
                              None if state is None else state[b], (rows[b], steps[b]))

    def _gather(self, items: list) -> tuple:
        """The requests' rows, in order, in the batch arrays: (obs, outputs, mask, policy, state, keys)."""
        n = len(items) * self.per_request
        for k, (request, _, states) in enumerate(items):
            rows = slice(k * self.per_request, (k + 1) * self.per_request)
            self.keys[0][rows], self.keys[1][rows] = self._keys(request)
            assign(self.obs, request["obs"], rows)
            if self.mask is not None:
                self.mask[rows] = request["action_mask"]
            if self.policy is not None:
                self.policy[rows] = request["policy"]
            if states is not None:
                self.state[rows] = states
        return (take(self.obs, slice(0, n)), {name: out[:n] for name, out in self.out.items()},
                None if self.mask is None else self.mask[:n], None if self.policy is None else self.policy[:n],
                None if self.state is None else self.state[:n], (self.keys[0][:n], self.keys[1][:n]))

    def _scatter(self, items: list) -> None:
        """Each request's rows of the outputs into its reply; the states of those that advance."""
        for k, (request, reply, states) in enumerate(items):
            rows = slice(k * self.per_request, (k + 1) * self.per_request)
            for name, out in self.out.items():
                reply[name][...] = out[rows]
            if states is not None and advances(request):
                states[...] = self.state[rows]


def final_values(policies: PolicySet, request: Message, reply: Message, states: np.ndarray | None,
                 alone: bool = False) -> None:
    """Before the actions: the values of the request's final observations (episodes truncated in
    the last step), a recurrent policy's from the state each of those episodes ended in. `alone`
    (run.deterministic): each env's in a forward pass of its own, so its bits do not depend on
    which other envs' episodes were truncated in the same step."""
    n_final = request.get("n_final")
    if not n_final:  # most requests carry none: skip the forward call and its inference-mode switch
        return
    final_policy = request.arrays.get("final_policy")
    # final rows come in whole envs (a central critic reads every agent of one)
    env_rows = getattr(policies.runners[0].model, "num_agents", 1) if alone else n_final
    for start in range(0, n_final, env_rows):
        b = slice(start, min(start + env_rows, n_final))
        policies.value(take(request["final_obs"], b), reply["final_values"][b],
                       None if final_policy is None else final_policy[b],
                       None if states is None else states[request["final_rows"][b]])


def begin_states(request: Message, reply: Message, states: np.ndarray) -> None:
    """A recurrent policy's states before a request's actions: rows whose episode starts are
    zeroed, and the reply carries the states the actions are taken from (the actor keeps those
    that start its fragment)."""
    states[request["starts"].astype(bool)] = 0.0
    reply["state"][...] = states


def advances(request: Message) -> bool:
    """Whether a recurrent policy's states move on with this request's actions: not when it wants
    values only (sync mode's bootstrap: the same observations come again as the next step)."""
    return not request.get("flags") & VALUES_ONLY


def holder_states(policies: PolicySet, channels: int, rows: int) -> np.ndarray | None:
    """The hidden states a holder of a recurrent policy keeps: [channels, rows, state_size], zero at
    first (every row starts an episode); None for a feed-forward policy."""
    size = state_size(policies)
    return np.zeros((channels, rows, size), dtype=np.float32) if size else None


def state_size(policies: PolicySet) -> int:
    """A recurrent policy's hidden state width (0: feed-forward)."""
    return policies.runners[0].model.state_size
