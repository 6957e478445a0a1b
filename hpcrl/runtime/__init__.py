"""The runtime: MPI communicators and the channels between workers (comm), the launch that wires
a rank's workers and polls them (launch), and the watchdog. The only package that imports mpi4py."""
