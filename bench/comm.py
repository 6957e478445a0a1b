"""The project's channels against raw mpi4py on the same bytes, 2 ranks, as JSON:
- obs/action round trip: RequestClient/RequestServer (persistent receive, Testsome) against a raw
  Isend/Irecv ping-pong of a request and a reply of the same sizes;
- fragment bandwidth: the sample stream (SampleSender/SampleReceiver, credits) against raw Send/Recv of the same buffer.
Ratios are project time / raw time (target <= 1.25). Sizes: CartPole and Atari-like frames, 8 envs.

    .venv/bin/python bench/comm.py [--out FILE]      (starts itself under mpirun -n 2)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import under_mpi  # noqa: E402

CASES = [  # name, obs shape, obs dtype, round trips, fragments
    ("cartpole", (4,), "float32", 4000, 400),
    ("atari-like", (4, 84, 84), "uint8", 300, 20),
]
N, T = 8, 128


def spin(test) -> None:
    while not test():
        pass


def measure(name, obs_shape, obs_dtype, trips, fragments):
    import numpy as np

    from hpcrl.core.messages import STOP, fragment_spec, reply_spec, request_spec
    from hpcrl.runtime import comm
    from hpcrl.runtime.streams import SampleReceiver, SampleSender
    world = comm.WORLD
    rank = world.Get_rank()
    req, rep = request_spec(N, obs_shape, obs_dtype), reply_spec(N, (), "int64")
    frag = fragment_spec(T, N, obs_shape, obs_dtype, (), "int64")
    req_bytes = req.offsets["final_obs"]  # no truncated episodes in the step
    out = {}

    # --- project round trip: the inference stream, on its own communicator as in a run
    inference = comm.stream_communicator()
    world.Barrier()
    if rank == 0:
        client = comm.RequestClient(inference, 1, req.allocate(), rep.allocate())
        start = time.perf_counter()
        for _ in range(trips):
            client.send(req_bytes)
            spin(client.test)
        out["roundtrip_project_us"] = 1e6 * (time.perf_counter() - start) / trips
    else:
        server = comm.RequestServer(inference, [0], [0], [req.allocate()], [rep.allocate()])
        for _ in range(trips):
            spin(server.ready)
            server.reply_buffer(0)
            server.reply(0)
            server.rearm(0)
        server.close(armed=[0])
    # --- raw round trip, same bytes
    a, b = np.zeros(req_bytes, np.uint8), np.zeros(rep.nbytes, np.uint8)
    world.Barrier()
    if rank == 0:
        start = time.perf_counter()
        for _ in range(trips):
            r = world.Irecv(b, source=1, tag=1)
            world.Isend(a, dest=1, tag=0).Wait()
            r.Wait()
        out["roundtrip_raw_us"] = 1e6 * (time.perf_counter() - start) / trips
    else:
        for _ in range(trips):
            world.Irecv(a, source=0, tag=0).Wait()
            world.Isend(b, dest=0, tag=1).Wait()
    # --- project fragments: the sample stream (credit flow control, 2 slots per sender)
    stream = comm.stream_communicator()
    world.Barrier()
    if rank == 0:
        sender = SampleSender(stream, 1, [frag.allocate(), frag.allocate()])
        start = time.perf_counter()
        for _ in range(fragments):
            spin(sender.can_send)
            sender.send()
        spin(sender.can_send)
        sender.say_goodbye(0)
        spin(sender.closed)  # the farewell: the receiver has them all
        out["fragment_project_mb_s"] = fragments * frag.nbytes / (time.perf_counter() - start) / 1e6
        sender.close()
    else:
        receiver = SampleReceiver(stream, [0], [frag.allocate() for _ in range(2)])
        said_goodbye = False
        while not said_goodbye:
            for slot in receiver.ready():
                said_goodbye |= bool(receiver.slots[slot].get("flags") & STOP)
                receiver.release(slot)
        receiver.close()
    # --- raw fragments
    buf = np.zeros(frag.nbytes, np.uint8)
    world.Barrier()
    if rank == 0:
        start = time.perf_counter()
        for _ in range(fragments):
            world.Send(buf, dest=1, tag=3)
        world.Recv(np.zeros(1, np.uint8), source=1, tag=9)
        out["fragment_raw_mb_s"] = fragments * frag.nbytes / (time.perf_counter() - start) / 1e6
    else:
        for _ in range(fragments):
            world.Recv(buf, source=0, tag=3)
        world.Send(np.zeros(1, np.uint8), dest=0, tag=9)
    if rank == 0:
        return {"case": name, "request_bytes": req_bytes, "reply_bytes": rep.nbytes, "fragment_bytes": frag.nbytes,
                **{k: round(v, 2) for k, v in out.items()},
                "roundtrip_ratio": round(out["roundtrip_project_us"] / out["roundtrip_raw_us"], 2),
                "fragment_time_ratio": round(out["fragment_raw_mb_s"] / out["fragment_project_mb_s"], 2)}
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    args = parser.parse_args()
    under_mpi(2, __file__, args.out)
    results = [measure(*case) for case in CASES]
    from hpcrl.runtime import comm
    if comm.world_rank() == 0:
        from report import emit
        emit({"benchmark": "comm: project channels vs raw mpi4py, 2 ranks on one node", "results": results},
             args.out)


if __name__ == "__main__":
    main()
