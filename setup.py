"""Build of the C extension hpcrl._kernels (src_ext/); all other metadata is in pyproject.toml.

optional=True: without a C compiler the package still installs and hpcrl.algos.kernels falls
back to the numpy implementations.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("hpcrl._kernels", ["src_ext/kernels.c"], extra_compile_args=["-O3"],
                             optional=True)])
