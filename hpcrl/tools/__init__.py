"""The command line and the tools around a run: plan, sbatch, inspect, plot, eval, the config
reference. None of them imports mpi4py, except `hpcrl run`, which hands over to the runtime."""
