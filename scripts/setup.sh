#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian 12 machine (root) or a developer's checkout:
#   Open MPI from Debian -> .venv with torch (CPU), mpi4py built against that MPI,
#   numpy/gymnasium/h5py/pyyaml/pytest -> Horovod 0.28.1 (PyTorch + MPI) from a wheel cache
#   -> hpcrl itself (editable) with every extra of pyproject.toml (test, atari, mujoco, box2d,
#   envpool, multiagent, marl, bench, docs, wandb). A second run only checks and returns in seconds.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
py="$venv/bin/python"
# Horovod takes minutes to compile; its wheel lives outside the checkout so fresh clones reuse it.
wheel_cache="${HPCRL_WHEEL_CACHE:-$HOME/.cache/hpcrl/wheels}"
torch_version="2.13.0"
horovod_version="0.28.1"
stamp="$venv/.hpcrl-setup-stamp"

log() { printf '[setup] %s\n' "$*" >&2; }

fingerprint() {
    cat "$repo/scripts/setup.sh" "$repo/pyproject.toml" "$repo/setup.py" "$repo"/src_ext/*.c | sha256sum | cut -d' ' -f1
}

# The checkout's own modules as bytecode (__pycache__/, ignored by git), brought up to date on every
# run: under PYTHONDONTWRITEBYTECODE=1 (set on some CI machines and containers) Python never caches
# them, and every rank of every job compiled hpcrl's ~100 modules again from source (0.3 s of
# processor time a rank here). Installed packages have theirs from pip.
compile_checkout() {
    "$py" -m compileall -q -j 0 "$repo/hpcrl" "$repo/tests" "$repo/bench" >/dev/null \
        || log "some files did not compile (a syntax error?); they are compiled again when imported"
}

if [[ -f "$stamp" && "$(cat "$stamp")" == "$(fingerprint)" ]] && command -v mpirun >/dev/null \
        && "$py" -c "import horovod.torch, mpi4py, hpcrl, hpcrl._kernels" 2>/dev/null; then
    compile_checkout
    exit 0
fi

# --- Debian packages: Open MPI (the one MPI that mpi4py and Horovod are both built against),
#     the compilers and CMake that Horovod's build needs, and strace (tests count system calls) ---
missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v mpicc >/dev/null || missing+=(libopenmpi-dev)
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v strace >/dev/null || missing+=(strace)
if (( ${#missing[@]} )); then
    if [[ $(id -u) -ne 0 ]]; then
        log "missing Debian packages: ${missing[*]}; install them (needs root), then re-run."
        exit 1
    fi
    log "installing from Debian: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- virtual environment ---
if [[ ! -x "$py" ]]; then
    log "creating $venv"
    python3 -m venv "$venv"
fi
pip() { "$py" -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip packaging setuptools wheel
# Pinned: an unpinned torch pulls the CUDA build (gigabytes); 2.13.0 resolves to the local CPU wheel.
pip install "torch==$torch_version"
# mpi4py from source so it links the same libmpi as Horovod (a binary wheel may bring its own MPI).
if ! "$py" -c "import mpi4py" 2>/dev/null; then
    log "building mpi4py against $(command -v mpicc)"
    pip install --no-binary=mpi4py "mpi4py>=4.0"
fi
pip install "numpy>=1.24" "gymnasium>=1.0" "h5py>=3.8" "pyyaml>=6.0" "pytest>=8" \
    "tensorboard>=2.14" "matplotlib>=3.7" "imageio>=2.31" "imageio-ffmpeg>=0.4.9"

# --- Horovod (PyTorch + MPI), built once into the wheel cache ---
if ! "$py" -c "import horovod.torch" 2>/dev/null; then
    mkdir -p "$wheel_cache"
    wheel=$(ls "$wheel_cache"/horovod-"$horovod_version"-*.whl 2>/dev/null | head -n1 || true)
    if [[ -z "$wheel" ]]; then
        log "building Horovod $horovod_version with PyTorch and MPI (about 3 minutes on 2 cores)"
        build=$(mktemp -d)
        pip download --no-deps --no-binary=:all: -d "$build" "horovod==$horovod_version"
        tar -xzf "$build"/horovod-"$horovod_version".tar.gz -C "$build"
        src="$build/horovod-$horovod_version"
        # torch 2.x headers need C++17; Horovod 0.28.1 still asks for C++14.
        sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' \
            "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
        # Gloo is off: we launch with mpirun/srun only, and Gloo's bundled CMake breaks with CMake 4.
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        MAKEFLAGS="-j$(nproc)" \
            "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$wheel_cache" "$src"
        rm -rf "$build"
        wheel=$(ls "$wheel_cache"/horovod-"$horovod_version"-*.whl | head -n1)
    fi
    log "installing $(basename "$wheel")"
    # Horovod's own runtime requirements first (minus the launcher extras we never use), so pip's
    # resolver finds nothing missing when the wheel goes in and prints no error line.
    pip install cloudpickle psutil "pyyaml>=6.0" packaging "cffi>=1.4.0"
    pip install --no-deps "$wheel"
fi

# --- hpcrl itself (editable; builds the C kernels of src_ext/ in place) with every extra of
#     pyproject.toml: tests, env families (atari, mujoco, box2d, envpool, multiagent, marl), the benchmarks'
#     baseline and the documentation site's MkDocs (pinned there).
#     The constraint keeps torch at its pin: no extra may swap it for another build. ---
extras=$("$py" -c 'import sys, tomllib; print(",".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]))' \
    "$repo/pyproject.toml")
printf 'torch==%s\n' "$torch_version" > "$venv/hpcrl-constraints.txt"
log "installing hpcrl with extras [$extras]"
pip install --no-build-isolation -c "$venv/hpcrl-constraints.txt" -e "$repo[$extras]"
# MiniGrid (Dict observations; tests and jobs/minigrid_doorkey.yaml) without its dependencies: it
# asks for pygame, whose module files pygame-ce (the box2d extra, which mpe2 needs) already provides,
# and two distributions of one module break each other. Its other needs (numpy, gymnasium) are in.
pip install --no-deps "minigrid==3.2.0"
"$py" -c "import horovod.torch, mkdocs, mpi4py, hpcrl, torch; assert torch.__version__.split('+')[0] == '$torch_version'" \
    || { log "set-up finished but imports fail (or torch is not $torch_version)"; exit 1; }
compile_checkout
fingerprint > "$stamp"
log "ready: $venv"
