"""The runtime, the only package that imports mpi4py. Its transport: communicators and channels
(comm), the sample, parameter and control streams, the peers' liveness, the watchdog, the stop
signals. Above the workers, in the launch layer (docs/architecture.md): the launch that checks,
wires and polls a rank's workers (launch) and the topology (wiring)."""
