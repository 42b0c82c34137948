import os

# Keep torch and BLAS from fighting over the two cores of CI machines.
os.environ.setdefault("OMP_NUM_THREADS", "2")
