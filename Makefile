# Two commands do all set-up on a fresh Debian 12 machine (see README.md):
#   make demo   set up, then train CartPole on 4 MPI ranks (2 env, 1 inference, 1 learner)
#   make test   set up, then run the test suite (real mpirun jobs of 1, 2, 4 and 6 ranks)
PY := .venv/bin/python
RANKS ?= 4
CONFIG ?= jobs/cartpole_ppo.yaml

.PHONY: setup demo test clean
setup:
	@bash scripts/setup.sh

demo: setup
	bash scripts/mpirun.sh -n $(RANKS) $(PY) -m hpcrl run $(CONFIG) --overwrite

test: setup
	$(PY) -m pytest tests

clean:
	rm -rf runs .pytest_cache
