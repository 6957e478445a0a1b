"""What a run's repeatability rests on: the verdict `hpcrl inspect` prints (does this config repeat
bit for bit, and on which layouts), the provenance a checkpoint records (package versions and the
layout's shape), and the warning a resume gives when the packages changed under it.

Pure: package versions are read from the installed distributions' metadata, never by importing
them (inspect runs without torch). The guarantee itself is made elsewhere: draws keyed by what
they are for (core/seeds.py), forward passes in fixed blocks (workers/policy_holder.py), batches
assembled in a fixed order (workers/batch_source.py); docs/reproducibility.md says it for users.
"""
from __future__ import annotations

import platform
from importlib import metadata

from hpcrl.core.dataflow import algorithm_of

# the packages whose arithmetic a run's bits depend on
PACKAGES = ("torch", "numpy", "gymnasium")

# The metrics columns that measure how a run went on its machine, not what it computed: the only
# ones in which two runs of a repeatable config may differ (workers/trainer_stats.py writes them).
MEASURED_COLUMNS = ("wall_time", "fps", "env_wait_fraction", "env_credit_wait_fraction", "sample_slots_max",
                    "learner_rss_mib")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def provenance(cfg, layout) -> dict:
    """What a checkpoint records beside the weights: the package versions and the layout's shape
    (`layout`: hpcrl.core.layout.Layout), which the bits of a repeated run depend on."""
    return {**package_versions(), "world_size": int(layout.world_size),
            "learners": len(layout.learners), "inference_ranks": len(layout.inference),
            "env_ranks": len(layout.envs), "envs": len(layout.envs) * cfg.env.num_envs,
            "inference_block": cfg.run.inference_block, "deterministic": cfg.run.deterministic,
            "torch_threads": cfg.run.torch_threads}


def changed_packages(saved: dict) -> list[str]:
    """The packages whose version differs from a checkpoint's provenance, as "torch 2.13.0 -> 2.14.0"."""
    now = package_versions()
    return [f"{name} {saved[name]} -> {now[name]}" for name in ("python", *PACKAGES)
            if name in saved and saved[name] != now[name]]


def repeatability(cfg) -> tuple[bool, str]:
    """(whether a run of `cfg` repeats bit for bit, the sentence that says on what). `cfg`: a
    validated Config."""
    a, r = cfg.algo, cfg.run
    devices = {cfg.roles.learner.device, cfg.roles.inference.device, cfg.roles.env.device}
    replay = algorithm_of(cfg).replay
    if replay and a.mode != "sync":
        return False, (f"no: async {a.name} inserts records into replay in arrival order, collected with "
                       f"whichever version the actors met; only its serial runs repeat (algo.mode sync repeats)")
    if a.mode != "sync":
        return False, ("no: async mode trains on fragments in arrival order, with weights of whichever "
                       "version they met; only its serial runs repeat")
    if devices != {"cpu"}:
        return False, ("not guaranteed: CUDA's kernels are not checked for repeatability here; the CPU "
                       "layouts of this config repeat")
    if not r.deterministic and cfg.roles.inference.ranks == 0 and not cfg.roles.inference.per_node:
        return True, ("yes on this layout: inline policies compute each env rank's request alone, so the same "
                      "config, seed and layout give bit-identical weights and metric rows; "
                      + ("other env-rank counts train otherwise" if replay else
                         "set run.deterministic and run.inference_block for the same weights on layouts with "
                         "other env-rank counts"))
    if not r.deterministic:
        return False, ("no: run.deterministic is false, so a policy server's forward passes depend on which "
                       "requests arrive together; set it true to repeat (about 7% fewer frames/s, "
                       "bench/determinism.py); serial runs repeat either way")
    same = "yes: the same config, seed and layout give bit-identical weights and metric rows"
    if replay:  # (its actors' exploration draws are per env rank: other env-rank counts explore otherwise)
        return True, f"{same} (sync replay rounds); other env-rank counts train otherwise"
    if r.inference_block is None:
        return True, (f"{same}; set run.inference_block for the same weights on layouts with other "
                      f"env-rank counts")
    return True, (f"{same}; forward passes of {r.inference_block} envs: the same weights on other env-rank "
                  f"counts, given the same envs in all and learners")
