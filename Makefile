# Two commands do all set-up on a fresh Debian 12 machine (see README.md):
#   make demo   set up, then train CartPole on 4 MPI ranks (2 env, 1 inference, 1 learner)
#   make test   set up, then run the test suite (real mpirun jobs of 1, 2, 4 and 6 ranks)
#   make test-fast   set up, then the tests that launch no MPI job
PY := .venv/bin/python
RANKS ?= 4
CONFIG ?= jobs/cartpole_ppo.yaml

.PHONY: setup demo test test-fast clean
setup:
	@bash scripts/setup.sh

demo: setup
	bash scripts/mpirun.sh -n $(RANKS) $(PY) -m hpcrl run $(CONFIG) --overwrite

# Two passes. First the suite on 2 workers (a test's jobs leave the cores idle about half the time:
# start-up barriers, sleeping waits). Then scripts/test_alone.sh: the tests that mostly wait (SLURM,
# faults, bounds in seconds) side by side, and last the ratios of measured waits, alone.
test: setup
	$(PY) -m pytest -n 2 --dist worksteal -m "not (slurm or waits or alone)" tests
	PY=$(PY) bash scripts/test_alone.sh

# The tests that launch no MPI job, build no emulated node and train no agent to a return (markers
# set in tests/conftest.py and the modules): a minute or two, for the edit-test loop.
test-fast: setup
	$(PY) -m pytest -n 2 -m "not mpi and not multinode and not slurm and not learning" tests

clean:
	rm -rf runs .pytest_cache
