"""The command line and the tools around a run: plan, sbatch, tune, inspect, plot, eval, the
config reference. They reach MPI only through the runtime: `hpcrl run` hands over to the launch,
and `hpcrl tune` times stream messages with MPI as a singleton and measures gradient averaging
under `mpirun -n 2`; the others start no MPI at all."""
