"""Inference rank (policy server) and inline inference: both run the algorithm's runner (models:
PolicyRunner for PPO, models.q:QRunner for DQN) on fresh weights and fill the reply fields it names.

Sync mode: a request names the policy version it must be answered with. An inference rank holds
requests for a version it does not have yet, and serves them in one batched forward pass once
the learner root's broadcast of that version has arrived.
Async mode: a request names the oldest version it accepts, and is answered with the newest
weights at hand: inference never waits for the learner.
The stop word comes on the control stream: each actor group's next request is then answered with
STOP (the inference stream's goodbye), and the server leaves once every group has had it and the
parameter stream has closed (END).
"""
from __future__ import annotations

import numpy as np

from hpcrl.runtime.comm import RequestServer
from hpcrl.core.messages import STOP, Message
from hpcrl.runtime.params import END
from hpcrl.core.seeds import seed_for
from hpcrl.models import Runner


class InlinePolicy:
    """The policy inside an env rank (`inference: {ranks: 0}`, and serial mode): same calls as
    RemotePolicy, answered in-process once this rank holds the requested version."""

    def __init__(self, runner: Runner, weights, request: Message, reply: Message, sync: bool = True,
                 control=None):
        """`control`: the rank's control stream (None: only the weights' END stops it, as in tests
        that drive an actor alone)."""
        self.runner, self.weights = runner, weights
        self.sync = sync
        self.control = control
        self.request, self.reply = request, reply
        self.stopped = False
        self._wanted: int | None = None

    def submit(self, version: int, n_final: int) -> None:
        self.request.set(version=version, n_final=n_final, flags=0)
        self._wanted = version

    @classmethod
    def build(cls, w, index: int) -> "InlinePolicy":
        """The policy of env rank number `index` (inference: {ranks: 0}, and serial mode)."""
        from hpcrl.runtime.comm import LocalWeightSubscriber
        weights = LocalWeightSubscriber(w.params) if w.layout.serial else w.params
        spec = w.inference
        return cls(build_runner(w.cfg, w.spaces, w.cfg.roles.env.device, "inline_policy", index), weights,
                   spec.request.allocate(), spec.reply.allocate(), sync=w.cfg.algo.mode == "sync", control=w.control)

    def finished(self) -> bool:
        """The parameter stream has closed here (a node's leader has passed END on)."""
        if not self.weights.finished():
            self._take_weights()
            return False
        return True

    def close(self) -> None:
        self.weights.close()

    def sampling_state(self):
        return self.runner.generator.get_state()

    def restore_sampling_state(self, state) -> None:
        self.runner.generator.set_state(state)

    def poll(self) -> Message | None:
        if self._wanted is None:
            return None
        if not self.stopped and (not self.sync or self.runner.version < self._wanted):
            self._take_weights()
        if self.control is not None and self.control.stopped:
            self.stopped = True
        if self.stopped:
            self.reply.set(flags=STOP)
            return self.reply
        if not can_answer(self.runner.version, self._wanted, self.sync):
            return None
        answer(self.runner, self.request, self.reply)
        self._wanted = None
        return self.reply

    def _take_weights(self) -> None:
        message = self.weights.poll()
        if message is None:
            return
        if message.get("flags") & END:
            self.stopped = True  # the last version: the trainer has stopped
        else:
            self.runner.load(message["params"], message.get("version"))
            self.weights.rearm()


def build_runner(cfg, spaces, device: str, purpose: str, index: int) -> Runner:
    """The policy of an inference rank (or an env rank's inline one); `index`: the rank's index in its role."""
    import torch

    from hpcrl.models import build_policy, make_runner
    torch.manual_seed(cfg.run.seed)  # initial weights; the learner root's first version replaces them
    # action sampling: its own stream per rank, repeatable per run seed
    return make_runner(build_policy(spaces, cfg), device, seed=seed_for(cfg.run.seed, purpose, index))


def can_answer(have: int, wanted: int, sync: bool) -> bool:
    """Sync: exactly the requested version; async: the requested one or newer."""
    return have == wanted or (not sync and have > wanted)


def answer(runner: Runner, request: Message, reply: Message) -> None:
    """Fill one reply for one request (no batching across env ranks)."""
    runner.act(request["obs"], {name: reply[name] for name in runner.outputs}, request.arrays.get("action_mask"))
    finish_reply(runner, request, reply)


def finish_reply(runner: Runner, request: Message, reply: Message) -> None:
    """After the actions: values of the request's final observations, and the policy version."""
    n_final = request.get("n_final")
    runner.value(request["final_obs"][:n_final], reply["final_values"][:n_final])
    reply.set(version=runner.version, flags=0)


class InferenceRole:
    """Serves several env ranks; every forward pass covers all requests that are ready."""

    name = "inference"

    def __init__(self, rank: int, runner: Runner, weights, server: RequestServer, control, sync: bool = True):
        self.rank = rank
        self.sync = sync
        self.runner, self.weights, self.server = runner, weights, server
        self.control = control
        self.pending: list[int] = []
        self.stopping = False
        self.stopped_envs: set[int] = set()
        self.done = False
        self.status = "waiting for the first weights"
        first = server.requests[0]
        rows = len(server.requests) * first["obs"].shape[0]
        self.batch_obs = np.zeros((rows, *first["obs"].shape[1:]), dtype=first["obs"].dtype)
        self.batch_mask = (np.zeros((rows, *first["action_mask"].shape[1:]), dtype=np.uint8)
                           if "action_mask" in first.arrays else None)  # envs that give action masks
        reply = server.replies[0]  # the runner's outputs for every request at once, then split per reply
        self.batch_out = {name: np.zeros((rows, *reply[name].shape[1:]), dtype=reply[name].dtype)
                          for name in runner.outputs}

    @classmethod
    def build(cls, w) -> "InferenceRole":
        """From the wiring (hpcrl.runtime.wiring.Wiring): a request channel per (actor, env group)
        it serves, its parameter-stream subscription and its policy."""
        clients = [(env, g) for env in w.layout.envs_of_inference(w.rank) for g in range(w.groups)]
        runner = build_runner(w.cfg, w.spaces, w.cfg.roles.inference.device, "inference",
                              w.layout.index_in("inference", w.rank))
        return cls(w.rank, runner, w.params, w.inference.server(clients), w.control, sync=w.cfg.algo.mode == "sync")

    def poll(self) -> int:
        work = self._poll_weights()
        ready = self.server.ready()
        self.pending.extend(ready)
        work += len(ready)
        if self.control.stopped and not self.stopping:
            self.stopping = True
            self.status = "stopping: telling env ranks"
        if self.stopping:
            return work + self._stop_pending()
        serve = []
        for i in self.pending:
            wanted = self.server.requests[i].get("version")
            if self.sync and wanted < self.runner.version:
                raise RuntimeError(f"inference rank {self.rank}: env rank {self.server.env_ranks[i]} asked for "
                                   f"policy version {wanted}, older than the current {self.runner.version} (sync mode)")
            if can_answer(self.runner.version, wanted, self.sync):
                serve.append(i)
        if serve:
            self._serve(serve)
            if len(serve) == len(self.pending):
                self.pending = []
            else:  # sync mode: some ask for a version still on its way
                served = set(serve)
                self.pending = [i for i in self.pending if i not in served]
            work += 1
        return work

    def _poll_weights(self) -> int:
        message = self.weights.poll()
        if message is None or message.get("flags") & END:  # END: the stream closes; the stop word is on control
            return 0 if message is None else 1
        self.runner.load(message["params"], message.get("version"))
        self.weights.rearm()
        self.status = f"serving policy version {self.runner.version}"
        return 1

    def _serve(self, serve: list[int]) -> None:
        requests = self.server.requests
        spans, start = [], 0
        for i in serve:
            obs = requests[i]["obs"]
            self.batch_obs[start:start + len(obs)] = obs
            if self.batch_mask is not None:
                self.batch_mask[start:start + len(obs)] = requests[i]["action_mask"]
            spans.append((i, start, start + len(obs)))
            start += len(obs)
        self.runner.act(self.batch_obs[:start], {name: out[:start] for name, out in self.batch_out.items()},
                        None if self.batch_mask is None else self.batch_mask[:start])
        for i, a, b in spans:
            reply = self.server.reply_buffer(i)
            for name, out in self.batch_out.items():
                reply[name][...] = out[a:b]
            finish_reply(self.runner, requests[i], reply)
            self.server.reply(i)
            self.server.rearm(i)

    def _stop_pending(self) -> int:
        """After the stop word: answer each env group's next request with STOP; close once every
        group has had it and the parameter stream has closed (END)."""
        work = 0
        for i in self.pending:
            self.server.reply_buffer(i).set(flags=STOP)
            self.server.reply(i)
            self.stopped_envs.add(i)
            work += 1
        self.pending = []
        if len(self.stopped_envs) < len(self.server.env_ranks):
            return work
        if not self.weights.finished():
            self.status = "stopping: waiting for the parameter stream's last version"
            return work
        self.server.close(armed=[])
        self.weights.close()
        self.done = True
        self.status = "finished"
        return work + 1
