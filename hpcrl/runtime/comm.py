"""Everything MPI: start-up, communicators, tags, and the nonblocking channels of the hot path.

The only module that imports mpi4py (besides the entry point's abort hook, which comes from here).
All sample traffic is upper-case buffer calls on preallocated `Message` buffers; lower-case
(pickled) calls carry only the rare start-up control messages.
"""
from __future__ import annotations

import atexit
import enum
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Callable, Sequence

import mpi4py

from hpcrl.core.startup import CLOCK

# MPI: Horovod runs its own background thread that calls MPI, so request full thread support
# before MPI_Init, which importing mpi4py.MPI performs.
mpi4py.rc.thread_level = "multiple"
mpi4py.rc.errors = "exception"  # MPI errors raise (and so reach the abort hook) instead of aborting mutely
from mpi4py import MPI  # noqa: E402

CLOCK.mark("mpi_init")

import numpy as np  # noqa: E402

from hpcrl.core.messages import Message  # noqa: E402
from hpcrl.runtime import traffic  # noqa: E402

JOB = MPI.COMM_WORLD  # every rank of the job; a run's own world (a population member's block of
# ranks, runtime/job.py) is a communicator passed to what needs it, never a global rebound


class Tag(enum.IntEnum):
    """Point-to-point tags; one per message kind."""

    OBS_REQUEST = 101
    ACTION_REPLY = 102


GROUP_TAG_STRIDE = 1_000  # env group g's requests and replies use tag + g * stride (one channel each)


def group_tag(tag: Tag, group: int) -> int:
    return int(tag) + GROUP_TAG_STRIDE * group


def group_tag_problem(groups: int) -> str | None:
    """Each env group gets its own tag pair; MPI only promises tags up to 32767 (MPI_TAG_UB)."""
    # (the job's: a population member's world, a split of it, has no predefined attributes)
    highest, bound = group_tag(Tag.ACTION_REPLY, groups - 1), JOB.Get_attr(MPI.TAG_UB)
    if highest <= bound:
        return None
    return (f"env.groups: {groups} groups need MPI tags up to {highest}, above this MPI's limit of {bound} "
            f"(MPI_TAG_UB); use at most {(bound - int(Tag.ACTION_REPLY)) // GROUP_TAG_STRIDE + 1} groups")


ABORT_GRACE_S = 10.0  # after MPI_Abort: a rank the abort cannot reach (a node cut off) exits by itself
OPEN_MPI_LAUNCHERS = frozenset({"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted", "prte"})


def abort_job(code: int = 1) -> None:
    """End every rank of the job now (MPI_Abort); safe from any thread under THREAD_MULTIPLE. A
    rank that the abort does not end within ABORT_GRACE_S (its launcher cannot reach it) exits by
    itself: a rank must never outlive the job it asked to end."""
    timer = threading.Timer(ABORT_GRACE_S, os._exit, (code,))
    timer.daemon = True
    timer.start()
    JOB.Abort(code)


def leave_cut_off_job(code: int = 1) -> None:
    """A peer is lost (`liveness`): end this rank without waiting on anything across the network.

    Under Open MPI's own launcher (mpirun, its orted daemons) this rank first stops the launcher
    process that started it: mpirun's abort waits for the daemon across the cut until TCP gives up
    (about 15 minutes with Linux's default tcp_retries2), and a daemon on a cut-off node would
    outlive its ranks. The other ranks on the same side stop theirs too (they heard END), so the
    launcher's command returns within seconds and no daemon is left on any node. Under any other
    launcher (srun, another MPI) this is MPI_Abort, and the exit after the grace all the same."""
    parent = os.getppid()
    if _command_name(parent) in OPEN_MPI_LAUNCHERS:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.kill(parent, signal.SIGKILL)
        except OSError:
            pass  # another rank of this node stopped it first
        os._exit(code)
    abort_job(code)


def finish(status: int) -> None:
    """End this rank's process with `status` once its run is over: the exit handlers (Horovod's
    shutdown among them), then MPI_Finalize, then the exit itself, without the interpreter's
    teardown. That teardown (every module destroyed one by one, libtorch's static destructors)
    took 0.5-0.6 s on every rank here, after the run had finished; nothing is left for it to do:
    every file is closed and every thread of the run stopped by then (the run directory's lock is
    released by the exit, as by any exit)."""
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # what Python's own exit runs first (logging's flush, Horovod's shutdown)
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def host_names(world) -> list[str]:
    """Start-up control message (pickled): every rank's host name, for messages that name a node."""
    return all_gather_objects(world, socket.gethostname())


_FAILURE_REPORTS: list[Callable[[int, str, str], None]] = []
REPORT_GRACE_S = 2.0  # the longest a failing rank waits for its reports before it aborts the job


def report_failures(report: Callable[[int, str, str], None]) -> None:
    """Also call `report(rank, doing, error)` when this rank fails (the run directory's status),
    before the abort. A report that fails, or hangs (a file system gone), never keeps the job
    from ending: each runs in a thread of its own, waited for REPORT_GRACE_S at most."""
    _FAILURE_REPORTS.append(report)


def _report_failure(rank: int, doing: str, error: str) -> None:
    def quietly(report) -> None:
        try:
            report(rank, doing, error)
        except Exception:  # noqa: BLE001 (a full disk, a run directory gone: the abort matters more)
            pass

    threads = [threading.Thread(target=quietly, args=(r,), name="hpcrl-failure-report", daemon=True)
               for r in _FAILURE_REPORTS]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + REPORT_GRACE_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def install_abort_hook(describe: Callable[[], str]) -> None:
    """An uncaught exception on any rank prints its rank and error, then aborts the whole job.

    Without this, the other ranks wait forever on the dead one (as `python -m mpi4py` avoids).
    """
    def hook(exc_type, exc, tb):
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        doing, error = describe(), f"{exc_type.__name__}: {exc}"
        sys.stderr.write(f"{text}\nhpcrl: rank {JOB.Get_rank()} ({doing}) failed: {error}\nhpcrl: aborting the job\n")
        sys.stderr.flush()
        sys.stdout.flush()
        _report_failure(JOB.Get_rank(), doing, error)
        abort_job(1)

    sys.excepthook = hook


def thread_level_problem(rank: int) -> str | None:
    """A learner runs Horovod's background thread beside hpcrl's own MPI calls: below
    MPI_THREAD_MULTIPLE that is undefined behaviour, so say what to change instead of running."""
    provided = MPI.Query_thread()
    if provided >= MPI.THREAD_MULTIPLE:
        return None
    name = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED", MPI.THREAD_SERIALIZED: "SERIALIZED"}
    return (f"rank {rank} is a learner, and its MPI gives thread level MPI_THREAD_{name.get(provided, provided)}; "
            f"learners run Horovod's thread beside hpcrl's MPI calls and need MPI_THREAD_MULTIPLE: with (Cray) "
            f"MPICH export MPICH_MAX_THREAD_SAFETY=multiple (the scripts of hpcrl sbatch do), unset "
            f"MPI4PY_RC_THREAD_LEVEL, or use an MPI built with thread-multiple support")


WAIT_SLEEP_S = 0.002  # the sleep between tests of a polled wait (start-up, end of run)


def wait_sleeping(request, sleep_s: float = WAIT_SLEEP_S) -> None:
    """Wait for `request`, sleeping between tests. Open MPI's blocking waits spin (yielding when
    oversubscribed): at start-up every rank waits about a second for rank 0's checks, and 3 ranks
    spinning beside it on 2 cores took half its CPU (a loop of rank 0's took 0.12-0.24 s beside
    blocking waits, 0.08 s beside this one, 4 ranks on this 2-core machine)."""
    while not request.Test():
        time.sleep(sleep_s)


def broadcast_object(world, obj, root: int = 0):
    """Start-up control message (pickled): the validated config, or the error that stops the job.
    The ranks wait for `root` in a sleeping barrier; the broadcast then finds it there."""
    wait_sleeping(world.Ibarrier())
    return world.bcast(obj, root=root)


def all_gather_objects(world, obj) -> list:
    """Start-up control message (pickled): one small object from every rank, to every rank
    (after a sleeping barrier, as broadcast_object)."""
    wait_sleeping(world.Ibarrier())
    return world.allgather(obj)


def node_of_rank(world) -> np.ndarray:
    """Rank of `world` -> node id (the lowest such rank on the same shared-memory node)."""
    node_comm = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    leader = node_comm.allreduce(world.Get_rank(), op=MPI.MIN)
    node_comm.Free()
    out = np.empty(world.Get_size(), dtype=np.int64)
    world.Allgather(np.array([leader], dtype=np.int64), out)
    return out


def local_rank(comm) -> int:
    """This rank's place among the ranks of `comm` on its node (what Horovod calls the local rank:
    a GPU per local rank). Collective over `comm`."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def sub_communicator(world, member: bool, key: int | None = None):
    """Collective over `world`: a communicator of the ranks with member=True (None elsewhere)."""
    comm = world.Split(0 if member else MPI.UNDEFINED, world.Get_rank() if key is None else key)
    return comm if member else None


def stream_communicator(world):
    """Collective over `world`: a duplicate of it for one stream, so the stream's tags are its own
    and no other traffic can match its receives (ranks are the world ranks)."""
    return world.Dup()


def wait_all(requests: Sequence) -> None:
    MPI.Request.Waitall([r for r in requests if r is not None])


def cancel_all(requests: Sequence) -> None:
    """Cancel posted receives and complete them, so none is left behind at shutdown."""
    for r in requests:
        if r is not None and r != MPI.REQUEST_NULL:
            r.Cancel()
    wait_all(requests)


class RequestServer:
    """Inference side of env <-> inference: per (env rank, env group), one persistent receive for
    its requests and one persistent send for its replies (no request objects built per step)."""

    def __init__(self, comm, env_ranks: Sequence[int], groups: Sequence[int], requests: Sequence[Message],
                 replies: Sequence[Message]):
        """`comm`: the inference stream's communicator (a duplicate of the run's world: ranks are its ranks)."""
        self.env_ranks = list(env_ranks)
        self.requests = list(requests)
        self.replies = list(replies)
        self._recv = [comm.Recv_init(m.buffer, source=r, tag=group_tag(Tag.OBS_REQUEST, g))
                      for r, g, m in zip(self.env_ranks, groups, self.requests)]
        self._send = [comm.Send_init(m.buffer, dest=r, tag=group_tag(Tag.ACTION_REPLY, g))
                      for r, g, m in zip(self.env_ranks, groups, self.replies)]
        self._remote = traffic.remote(comm, self.env_ranks)
        MPI.Prequest.Startall(self._recv)

    def ready(self) -> list[int]:
        """Indices of env ranks whose request arrived since the last call. A completed persistent
        receive goes inactive and is reported once; the caller keeps it until it `rearm`s it."""
        done = MPI.Request.Testsome(self._recv)
        return list(done) if done else []

    def rearm(self, i: int) -> None:
        self._recv[i].Start()

    def reply_buffer(self, i: int) -> Message:
        """Reply buffer i, free to fill: its previous send has completed."""
        self._send[i].Wait()  # done already in practice (env i read that reply before asking again)
        return self.replies[i]

    def reply(self, i: int) -> None:
        """Send reply buffer i (filled after `reply_buffer(i)`)."""
        self._send[i].Start()
        if self._remote[i]:
            traffic.count(traffic.REPLIES, self.replies[i].buffer.nbytes)

    def close(self, armed: Sequence[int]) -> None:
        """Complete outstanding replies and cancel the receives still posted (`armed`)."""
        wait_all(self._send)
        cancel_all([self._recv[i] for i in armed])
        for r in self._recv + self._send:
            r.Free()


class RequestClient:
    """Env side of env <-> inference: a persistent receive for the reply and a persistent send
    for a request without final observations (the common step); requests that carry final
    observations of truncated episodes go as a longer one-off Isend."""

    def __init__(self, comm, inference_rank: int, request: Message, reply: Message, group: int = 0):
        self.comm = comm
        self.peer = inference_rank
        self.request, self.reply = request, reply
        self.plain_nbytes = request.spec.group_offset("final_obs")
        self.request_tag = group_tag(Tag.OBS_REQUEST, group)
        self._recv = comm.Recv_init(reply.buffer, source=self.peer, tag=group_tag(Tag.ACTION_REPLY, group))
        self._send_plain = comm.Send_init([request.buffer[:self.plain_nbytes], MPI.BYTE], dest=self.peer,
                                          tag=self.request_tag)
        self._active: list = []
        self._remote = traffic.remote(comm, [self.peer])[0]

    def send(self, nbytes: int) -> None:
        # Start the receive first so the reply never waits in an unexpected-message queue.
        if nbytes == self.plain_nbytes:
            self._active = [self._recv, self._send_plain]
            MPI.Prequest.Startall(self._active)
        else:
            self._recv.Start()
            self._active = [self._recv, self.comm.Isend([self.request.buffer[:nbytes], MPI.BYTE], dest=self.peer,
                                                        tag=self.request_tag)]
        if self._remote:
            traffic.count(traffic.REQUESTS, nbytes)

    def test(self) -> bool:
        """True once the reply is in the reply buffer."""
        return bool(self._active) and MPI.Request.Testall(self._active)

    def close(self) -> None:
        for r in (self._recv, self._send_plain):
            r.Free()


class LocalWeightSubscriber:
    """Serial mode: the env role reads the learner's published weights in the same process."""

    def __init__(self, publisher):
        self.publisher = publisher  # a hpcrl.runtime.params.ParameterPublisher
        self._seen = None

    def poll(self) -> Message | None:
        message = self.publisher.message
        if message is None or message.get("version") == self._seen:
            return None
        self._seen = message.get("version")
        return message

    def rearm(self) -> None:
        pass

    def finished(self) -> bool:
        return True  # nothing is in flight inside one process

    def close(self) -> None:
        pass


def allreduce_sum(comm, values: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    comm.Allreduce(values, out, op=MPI.SUM)
    return out


def broadcast_ints(comm, values: list[int], sleep_s: float | None = None) -> list[int]:
    """The root's decisions, in one message, on every rank of comm; `sleep_s`: the others sleep
    between tests meanwhile (where the root may keep them waiting long), instead of spinning."""
    buf = np.array(values, dtype=np.int64)
    if sleep_s is None:
        comm.Bcast(buf, root=0)
    else:
        wait_sleeping(comm.Ibcast(buf, root=0), sleep_s)
    return [int(v) for v in buf]


def broadcast_object_on(comm, obj):
    """Start-up control message (pickled) from rank 0 of `comm` to the rest of it."""
    return comm.bcast(obj, root=0)


def allreduce_min_max(comm, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = np.empty_like(low), np.empty_like(high)
    comm.Allreduce(low, lo, op=MPI.MIN)
    comm.Allreduce(high, hi, op=MPI.MAX)
    return lo, hi


def gather_to_root(comm, values: np.ndarray) -> np.ndarray | None:
    out = np.empty((comm.Get_size(), *values.shape), dtype=values.dtype) if comm.Get_rank() == 0 else None
    comm.Gather(values, out, root=0)
    return out


def gather_polled(comm, values: np.ndarray, root: int = 0) -> np.ndarray | None:
    """Every rank's `values` stacked on `root` (None elsewhere), at the end of a run: polled, not
    waited on, so the watchdog and the liveness threads keep judging while slow ranks arrive."""
    out = np.empty((comm.Get_size(), *values.shape), dtype=values.dtype) if comm.Get_rank() == root else None
    wait_sleeping(comm.Igather(np.ascontiguousarray(values), out, root=root))
    return out


def sum_polled(comm, values: np.ndarray, root: int = 0) -> np.ndarray | None:
    """Every rank's `values` summed on `root` (None elsewhere), polled as gather_polled."""
    out = np.zeros_like(values) if comm.Get_rank() == root else None
    wait_sleeping(comm.Ireduce(np.ascontiguousarray(values), out, root=root))  # mpi4py's default op: a sum
    return out


def gather_objects_to_root(comm, obj) -> list | None:
    """Pickled objects of every rank of `comm` at its rank 0 (a checkpoint's policies: rare, small)."""
    return comm.gather(obj, root=0)
