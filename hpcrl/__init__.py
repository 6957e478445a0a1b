"""hpcrl: distributed reinforcement learning for supercomputers, one SPMD program over MPI."""

__version__ = "0.1.0"
