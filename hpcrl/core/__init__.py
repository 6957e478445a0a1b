"""The pure core: config, layout, message layouts, seeds. numpy and yaml only: no MPI, no torch,
no h5py, so every rank, `hpcrl plan` and the tests can use it anywhere."""
