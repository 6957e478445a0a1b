"""The three roles a rank can play: env (actor), inference (policy server), learner (trainer).

Submodules are imported by the wiring (hpcrl.run) only where needed, so env ranks with remote
inference never import torch.
"""
