"""The pure core: config, the algorithm registry (dataflow), layout and sizing, message layouts,
policies, seeds, why a run stops. numpy and yaml only: no MPI, no torch, no h5py, so every rank,
`hpcrl plan` and the tests can use it anywhere."""
