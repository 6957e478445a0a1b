"""Learning algorithms (numpy / torch, no MPI): GAE and V-trace, the PPO and DQN trainer steps,
DQN's targets, priorities, exploration and prioritized replay, and the C kernels (kernels.py) with
their numpy references."""
