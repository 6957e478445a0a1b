"""Files of a run directory: HDF5 checkpoints and metrics, and the run directory itself (start,
resume, repair after a hard stop). h5py; torch only where checkpoint tensors are made."""
