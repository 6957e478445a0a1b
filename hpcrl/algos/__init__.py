"""Learning algorithms (numpy / torch, no MPI): advantage estimation and the PPO update."""
