"""What hpcrl's streams cost in CPU, measured in one process (`hpcrl tune`): a request and its reply
through the inference stream's channels, and a record through the sample stream with its
credits, this process at both ends. Both ends' Python and MPI work land on this one core, which
is what the tuner's model charges per message (the wire between nodes comes on top; see
docs/plan-and-tune.md's notes on the model). MPI starts as a singleton when the process was not launched by
mpirun.
"""
from __future__ import annotations

import time

from mpi4py import MPI

from hpcrl.core.messages import MessageSpec
from hpcrl.runtime.comm import RequestClient, RequestServer
from hpcrl.runtime.streams import SampleReceiver, SampleSender


def request_seconds(request: MessageSpec, reply: MessageSpec, seconds: float) -> float:
    """CPU seconds of one request and its reply (client and server code paths together)."""
    comm = MPI.COMM_WORLD.Dup()
    me = comm.Get_rank()
    server = RequestServer(comm, [me], [0], [request.allocate()], [reply.allocate()])
    client = RequestClient(comm, me, request.allocate(), reply.allocate())
    count, start, wall = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - wall < seconds or count < 10:
        client.send(client.plain_nbytes)
        while not server.ready():
            pass
        server.reply_buffer(0)
        server.reply(0)
        server.rearm(0)
        while not client.test():
            pass
        count += 1
    spent = time.process_time() - start
    client.close()
    server.close(armed=[0])
    comm.Free()
    return spent / count


def record_seconds(record: MessageSpec, seconds: float) -> float:
    """CPU seconds of one record through the sample stream (sender, receiver and credits)."""
    comm = MPI.COMM_WORLD.Dup()
    me = comm.Get_rank()
    receiver = SampleReceiver(comm, [me], [record.allocate() for _ in range(2)], per_sender=2)
    sender = SampleSender(comm, me, [record.allocate() for _ in range(2)])
    count, start, wall = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - wall < seconds or count < 10:
        while not sender.can_send():
            _take_arrivals(receiver)
        sender.send()
        while not _take_arrivals(receiver):
            pass
        count += 1
    spent = time.process_time() - start
    while not sender.can_send():  # the goodbye takes a credit like any record; then the farewell
        _take_arrivals(receiver)
    sender.say_goodbye(me)
    while not (receiver.all_closed() and sender.closed()):
        _take_arrivals(receiver)
    sender.close()
    receiver.close()
    comm.Free()
    return spent / count


def _take_arrivals(receiver: SampleReceiver) -> int:
    """Release every record that has arrived (its slot becomes a credit again); how many."""
    arrived = receiver.ready()
    for slot in arrived:
        receiver.release(slot)
    return len(arrived)
