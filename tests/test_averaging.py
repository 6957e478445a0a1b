"""The trainers' averaging (workers/averaging.py): none for a lone learner, and the verdict on
whether averaging pays. (The Horovod path runs in the multi-learner runs of test_mpi_runs.)"""

import torch

from hpcrl.workers.averaging import AveragingCost, NoAveraging, start_averaging


def test_averaging_that_costs_more_than_splitting_saves_names_the_alternative():
    cost = AveragingCost(trainers=2, averaging_s=3e-3, computing_s=1e-3)
    assert cost.most_saved_s == 1e-3 and not cost.pays
    text = cost.describe(policies=1)
    assert text.startswith("gradient averaging over 2 learners: 3.00 ms per gradient step against 1.00 ms")
    assert "saves at most 1.00 ms, less than averaging costs: roles.learner.ranks: 1" in text


def test_averaging_that_pays_is_reported_without_advice():
    cost = AveragingCost(trainers=4, averaging_s=1e-3, computing_s=1e-3)  # splitting saves up to 3 ms
    assert cost.pays and cost.describe(policies=2).endswith("saves at most 3.00 ms")


def test_a_lone_learner_steps_its_own_optimizer_and_reports_nothing():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    averaging = start_averaging(None, policies=2, block=1, policy=1)  # one trainer per policy: no comm needed
    assert isinstance(averaging, NoAveraging) and averaging.wrap(model, optimizer) is optimizer
    steps = []
    hooks = averaging.hooks(optimizer, lambda: steps.append(1))
    assert set(hooks) == {"apply_step"}
    before = model.weight.detach().clone()
    model(torch.ones(1, 3)).sum().backward()
    hooks["apply_step"]()
    assert steps == [1] and not torch.equal(before, model.weight)
    assert averaging.update_done() is None
