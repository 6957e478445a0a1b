"""The workers a rank can run: actor (env), policy server (inference), trainer (learner).

Submodules are imported by the launch (hpcrl.launch.run) only where needed, so actors with
remote inference never import torch, and only the trainer's averaging (averaging.py) imports
horovod, and only where a policy has several trainers.
"""
