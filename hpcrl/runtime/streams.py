"""The sample stream: many senders (actors) -> one receiver (a trainer), flow-controlled by credits.

Why credits: a standard-mode send below the transport's eager limit (4 KiB on Open MPI's shared
memory, 8-64 KiB on many fabrics) completes at once whether or not a receive is posted, so
without flow control records pile up in the receiver's unexpected-message queue with no bound.
Here the receiver owns `slots` preallocated record buffers. Each credit it grants is a slot
with a receive already posted for it, so every record in flight has a place to land: the memory
the stream holds is `slots` records, whatever the eager limit and the fan-in. A sender without
credit waits (the actor says it is waiting on its trainer: a wait on a peer, not a hang).

Protocol, on the stream's own communicator (tags are local constants):
- the receiver posts one `Irecv(ANY_SOURCE)` per granted slot and sends each sender its credits
  (int64 [count, flags]) on CREDIT; a sender holds at most `per_sender` credits, so slots go
  round-robin to the senders that have fewest;
- a record releases its slot when the consumer is done with it, which grants the slot anew;
- a sender's last record carries the STOP flag (its goodbye); the receiver answers with a
  FAREWELL credit message and grants that sender nothing more. Credit messages from one rank on
  one tag arrive in order, so a sender that has its farewell has received every credit sent to
  it: no message is left unmatched when both sides close.
"""
from __future__ import annotations

import enum
from collections import deque
from typing import Sequence

import numpy as np
from mpi4py import MPI

from hpcrl.core.messages import STOP, Message
from hpcrl.runtime import traffic

FAREWELL = 1  # credit-message flag: the receiver has the sender's goodbye; nothing more will come


class SampleTag(enum.IntEnum):
    RECORD = 1
    CREDIT = 2


class SampleReceiver:
    """Receiver side (trainer): `slots` record buffers shared by all `senders` (world ranks
    mapped to this communicator's ranks by the caller)."""

    def __init__(self, comm, senders: Sequence[int], slots: Sequence[Message], per_sender: int = 2):
        self.comm = comm
        self.senders = list(senders)
        self.slots = list(slots)
        self.per_sender = per_sender
        self._recv: list = [MPI.REQUEST_NULL] * len(self.slots)
        self._statuses = [MPI.Status() for _ in self.slots]
        self.free = deque(range(len(self.slots)))
        self.credits = {s: 0 for s in self.senders}  # granted and not used yet
        self.wanting = deque(self.senders)  # senders below per_sender, in round-robin order
        self.closed: set[int] = set()  # senders whose goodbye is in
        self.source = [-1] * len(self.slots)  # sender of the record in each slot
        self._credit_buf = {s: np.zeros(2, dtype=np.int64) for s in self.senders}
        self._credit_req = {s: MPI.REQUEST_NULL for s in self.senders}
        self._owed = {s: [0, 0] for s in self.senders}  # credits and flags not sent yet
        self.held_max = 0  # the most slots ever holding records or awaiting them (<= len(slots))
        self._remote = dict(zip(self.senders, traffic.remote(comm, self.senders)))
        self._grant()

    # --- consumer side ---------------------------------------------------------------------------
    def ready(self) -> list[int]:
        """Slots whose record has arrived since the last call (held until `release`)."""
        done = MPI.Request.Testsome(self._recv, self._statuses) if self._active_receives else None
        if not done:
            self._flush_credits()
            return []
        for k, i in enumerate(done):
            source = self._statuses[k].Get_source()  # MPI fills statuses in completion order
            self.source[i] = source
            self.credits[source] -= 1
            self._want(source)
        self._grant()
        return list(done)

    def release(self, slot: int) -> None:
        """The consumer is done with this slot's record: grant the slot to a sender again."""
        if self.slots[slot].get("flags") & STOP:
            self._farewell(self.source[slot])
        self.source[slot] = -1
        self.free.append(slot)
        self._grant()

    def discard_arrivals(self) -> int:
        """After the stop word: release every record that has arrived, unread (a goodbye among them
        is answered with its farewell); the count of them."""
        ready = self.ready()
        for slot in ready:
            self.release(slot)
        return len(ready)

    def all_closed(self) -> bool:
        """Every sender's goodbye is in."""
        return len(self.closed) == len(self.senders)

    def in_flight(self) -> int:
        """Slots granted (a receive posted) or holding an arrived record."""
        return len(self.slots) - len(self.free)

    def close(self) -> None:
        """Cancel the receives of credits nobody will use, and finish every credit message."""
        for s in self.senders:
            while self._owed[s][0] or self._owed[s][1]:
                self._credit_req[s].Wait()
                self._send_owed(s)
        MPI.Request.Waitall(list(self._credit_req.values()))
        for r in self._recv:
            if r != MPI.REQUEST_NULL:
                r.Cancel()
        MPI.Request.Waitall(self._recv)

    # --- credits ---------------------------------------------------------------------------------
    @property
    def _active_receives(self) -> bool:
        return len(self.free) < len(self.slots)

    def _want(self, sender: int) -> None:
        if sender not in self.closed and self.credits[sender] == self.per_sender - 1:
            self.wanting.append(sender)  # it just dropped below its share

    def _grant(self) -> None:
        while self.free and self.wanting:
            sender = self.wanting.popleft()
            slot = self.free.popleft()
            self._recv[slot] = self.comm.Irecv(self.slots[slot].buffer, source=MPI.ANY_SOURCE, tag=SampleTag.RECORD)
            self.credits[sender] += 1
            self._owed[sender][0] += 1
            if self.credits[sender] < self.per_sender:
                self.wanting.append(sender)
        self.held_max = max(self.held_max, self.in_flight())
        self._flush_credits()

    def _farewell(self, sender: int) -> None:
        self.closed.add(sender)
        if sender in self.wanting:
            self.wanting.remove(sender)  # once per sender, at shutdown
        self._owed[sender][1] |= FAREWELL
        self._flush_credits()

    def _flush_credits(self) -> None:
        for s, (count, flags) in self._owed.items():
            if (count or flags) and self._credit_req[s].Test():
                self._send_owed(s)

    def _send_owed(self, sender: int) -> None:
        self._credit_buf[sender][:] = self._owed[sender]
        self._owed[sender] = [0, 0]
        self._credit_req[sender] = self.comm.Isend(self._credit_buf[sender], dest=sender, tag=SampleTag.CREDIT)
        if self._remote[sender]:
            traffic.count(traffic.CREDITS, self._credit_buf[sender].nbytes)


class SampleSender:
    """Sender side (actor): record buffers to fill in turn, sent only with a credit."""

    def __init__(self, comm, receiver: int, buffers: Sequence[Message]):
        self.comm = comm
        self.peer = receiver
        self.buffers = list(buffers)
        self._send = [self.comm.Send_init(m.buffer, dest=receiver, tag=SampleTag.RECORD) for m in self.buffers]
        self._next = 0
        self.credits = 0
        self.farewell = False
        self._credit_buf = np.zeros(2, dtype=np.int64)
        self._credit_recv = self.comm.Recv_init(self._credit_buf, source=receiver, tag=SampleTag.CREDIT)
        self._credit_recv.Start()
        self._remote = traffic.remote(comm, [receiver])[0]

    def current(self) -> Message:
        """The buffer being filled."""
        return self.buffers[self._next]

    def can_send(self) -> bool:
        """A credit is in hand and the buffer to fill next is free (its previous send is done)."""
        self._take_credits()
        return self.credits > 0 and self._send[(self._next + 1) % len(self.buffers)].Test()

    def send(self) -> Message:
        """Send the current buffer (after `can_send`); returns the next one to fill."""
        self.credits -= 1
        self._send[self._next].Start()
        if self._remote:
            traffic.count(traffic.RECORDS, self.buffers[self._next].buffer.nbytes)
        self._next = (self._next + 1) % len(self.buffers)
        return self.buffers[self._next]

    def say_goodbye(self, sender_id: int) -> None:
        """Send the last record: a STOP-flagged header (after `can_send`)."""
        self.current().set(env_rank=sender_id, frames=0, flags=STOP)
        self.send()

    def closed(self) -> bool:
        """After the goodbye: True once the farewell is in and every send has completed."""
        self._take_credits()
        return self.farewell and MPI.Request.Testall(self._send)

    def close(self) -> None:
        for r in self._send + [self._credit_recv]:
            r.Free()

    def _take_credits(self) -> None:
        while not self.farewell and self._credit_recv.Test():
            self.credits += int(self._credit_buf[0])
            if self._credit_buf[1] & FAREWELL:
                self.farewell = True
            else:
                self._credit_recv.Start()
