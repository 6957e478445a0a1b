"""The workers a rank can run: actor (env rank, with its algorithm's record writer), policy server
(inference), trainer (learner, with its batch source).

Submodules are imported through the registry (hpcrl.launch.registry) by the wiring
(hpcrl.launch.wiring) only where their role runs, so actors with remote inference never import
torch, and only the trainer's averaging (averaging.py) imports horovod, and only where a
policy has several trainers.
"""
