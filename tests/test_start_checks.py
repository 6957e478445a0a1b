"""Start-up checks that keep a job from running on what MPI cannot give it: the thread level
Horovod needs, and tags within MPI_TAG_UB."""
from hpcrl.runtime import comm
from tests.conftest import mpirun, small_config, write_config


def test_a_learner_below_mpi_thread_multiple_is_a_config_error(tmp_path):
    path = str(write_config(tmp_path, small_config(tmp_path, roles={"inference": {"ranks": 0}})))
    result = mpirun(2, "run", path, extra_env={"MPI4PY_RC_THREAD_LEVEL": "serialized"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "MPI_THREAD_SERIALIZED" in result.stderr and "MPICH_MAX_THREAD_SAFETY=multiple" in result.stderr
    assert "Traceback" not in result.stderr


def test_env_groups_beyond_mpi_tag_ub_are_refused_with_the_largest_that_fits():
    from mpi4py import MPI
    bound = comm.JOB.Get_attr(MPI.TAG_UB)
    most = (bound - int(comm.Tag.ACTION_REPLY)) // comm.GROUP_TAG_STRIDE + 1
    assert comm.group_tag_problem(most) is None
    problem = comm.group_tag_problem(most + 1)
    assert f"above this MPI's limit of {bound}" in problem and f"use at most {most} groups" in problem
