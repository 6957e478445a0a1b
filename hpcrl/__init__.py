"""hpcrl: distributed reinforcement learning for supercomputers, one SPMD program over MPI.

As a library (docs/python-api.md): `hpcrl.Config`, `hpcrl.run`, `hpcrl.load_policy`,
`hpcrl.evaluate`, from hpcrl/tools/api.py. They are looked up only when first used, so `import
hpcrl` and every `hpcrl.*` module import no more than before (no MPI, no torch).
"""

__version__ = "0.1.0"
API = ("Config", "ConfigError", "run", "load_policy", "evaluate")
__all__ = ["__version__", *API]


def __getattr__(name: str):
    if name in API:
        from hpcrl.tools import api
        return getattr(api, name)
    raise AttributeError(f"module 'hpcrl' has no attribute {name!r}")
