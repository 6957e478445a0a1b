"""Run under mpirun: a real `hpcrl run` whose learner root also writes every fragment it trains on
to OUT/fragments.npz (the trainer step is wrapped to copy them first), so a test can compare what
the policy server's hidden states produced with an in-process rollout."""
import sys

import numpy as np

from hpcrl.algos import ppo
from hpcrl.tools.cli import main

out, argv = sys.argv[1], sys.argv[2:]
seen: list[dict] = []
train = ppo.PPOStep.__call__


def record_then_train(self, fragments, *args, **kwargs):
    seen.extend({name: array.copy() for name, array in f.arrays.items()} for f in fragments)
    np.savez(f"{out}/fragments.npz", **{f"{i}/{name}": a for i, f in enumerate(seen) for name, a in f.items()})
    return train(self, fragments, *args, **kwargs)


ppo.PPOStep.__call__ = record_then_train
sys.exit(main(["run", *argv]))
