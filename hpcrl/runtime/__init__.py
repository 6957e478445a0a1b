"""The runtime: the transport, and the only package that imports mpi4py. Communicators and
channels (comm), the sample, parameter and control streams, the peers' liveness, the watchdog,
the stop signals, the cross-node counts, and what a message costs in CPU (message_costs, for
`hpcrl tune`). The launch that checks, wires and polls a rank's workers sits above the workers,
in hpcrl.launch."""
