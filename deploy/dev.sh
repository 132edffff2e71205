#!/usr/bin/env bash
# Tessera developer entry point.
#
#   deploy/dev.sh demo   install dependencies, build into build/, run `tessera demo`
#   deploy/dev.sh test   install dependencies, build into build/, run ctest (not slow, not gpu)
#   deploy/dev.sh deps   install dependencies only (Debian packages, and .venv from PyPI)
#   deploy/dev.sh build  configure and build only
#
# Works from a fresh Debian 12 machine as root (or with sudo). Every step is idempotent.
# LibTorch is the one inside PyPI's CUDA-enabled torch wheel, installed into $TESSERA_VENV
# (default .venv) with the Python packages the tests compare against (Note [One LibTorch] in
# CMakeLists.txt). CUDA is compiled in whenever /usr/local/cuda (or nvcc on PATH) is there.
#
# Note [Build cache]: a cold build takes ~50 minutes on 2 cores. ccache keeps it warm across
# clones: CMakeLists.txt runs it with CCACHE_BASEDIR=<source dir> and CCACHE_NOHASHDIR, so a
# fresh clone in another folder (CI) compiles the same relative command lines and hits the
# entries an earlier build of the same sources left in ~/.cache/ccache. GCC's precompiled header
# is not byte-reproducible, so the units that use it hit only when the header's own creation
# hits, and that creation hashes differently in a build folder that already holds one: the
# first fresh clone of a change recompiles them, later fresh clones hit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TESSERA_BUILD_DIR:-$ROOT/build}"
VENV="${TESSERA_VENV:-$ROOT/.venv}"
JOBS="${TESSERA_JOBS:-$(nproc)}"

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libgloo-dev
  libcaf-dev libssl-dev
  libcapnp-dev capnproto
  libboost-dev
  libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libreadline-dev libpcre2-dev libjemalloc-dev libcairo2-dev fonts-dejavu-core libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-venv
  iproute2 openssl openssh-client openssh-server  # tests/deploy: namespace hosts, TLS, sshd
)
# PyPI, into $VENV. torch is pinned to the GPU image's version (deploy/cuda-image.sh), so both
# builds compile against one LibTorch; pyarrow's Arrow C++ reads parquet datasets (Note [Arrow from
# pyarrow] in CMakeLists.txt); the rest are the references the tests compare against (peft: LoRA).
PY_PACKAGES=(torch==2.11.0 transformers==5.24.0 safetensors==0.8.0 numpy==2.4.6 pyarrow==26.0.1 pandas==3.1.1 tensorboard==2.21.0 peft==0.21.2
             datasets==4.4.1)
# verl v0.5.0 itself, the reference the parity tests run (its protocol, core_algos, reward
# scorers, tools and agent loops): without its dependency list (it pins numpy<2 and pulls Ray,
# vLLM...); these are the few its protocol, core_algos and agent loops import (the tests stub Ray
# and the servers' web stack).
PY_NODEPS_PACKAGES=(verl==0.5.0 tensordict==0.9.1 pyvers==0.1.0 cloudpickle==3.1.3 omegaconf==2.4.0
                    hydra-core==1.3.2 antlr4-python3-runtime==4.9.3 cachetools==6.2.1 codetiming==1.4.0)
# Optional: clang + libFuzzer runtime for tests/fuzz. Installed when available.
OPTIONAL_PACKAGES=(clang-14 libclang-rt-14-dev)

say() { printf '\033[1m[dev.sh]\033[0m %s\n' "$*"; }

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

install_deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  local opt_missing=()
  for p in "${OPTIONAL_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || opt_missing+=("$p")
  done
  if [[ ${#missing[@]} -eq 0 && ${#opt_missing[@]} -eq 0 ]]; then
    say "all Debian packages already installed"
  else
    say "installing Debian packages: ${missing[*]} ${opt_missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -q
    if [[ ${#missing[@]} -gt 0 ]]; then
      as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
    if [[ ${#opt_missing[@]} -gt 0 ]]; then
      as_root apt-get install -y -q --no-install-recommends "${opt_missing[@]}" \
        || say "optional packages unavailable (${opt_missing[*]}); fuzz targets will be skipped"
    fi
  fi
}

python_site() { "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

install_python() {
  local stamp="$VENV/.tessera-packages" want="${PY_PACKAGES[*]} ${PY_NODEPS_PACKAGES[*]}"
  if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    say "Python packages already installed in $VENV"
    return
  fi
  say "installing into $VENV: $want"
  # The interpreter on PATH (Debian's, or a pyenv one) makes the venv; Debian's needs python3-venv.
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${PY_NODEPS_PACKAGES[@]}"
  printf '%s' "$want" > "$stamp"
}

cuda_args() {
  # CUDA is compiled in when a toolkit is present (CMake's TESSERA_WITH_CUDA=AUTO finds it).
  if [[ -d /usr/local/cuda/bin ]]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
}

configure_and_build() {
  export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
  local extra=()
  if command -v clang++-14 >/dev/null 2>&1; then extra+=(-DTESSERA_FUZZ_CLANG=clang++-14); fi
  say "configuring into $BUILD_DIR"
  cuda_args
  local site
  site="$(python_site)"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE="${TESSERA_BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$site/torch/share/cmake" \
    -DTESSERA_PYTHON="$VENV/bin/python" \
    "${extra[@]}" ${TESSERA_CMAKE_ARGS:-}
  say "building with $JOBS jobs"
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

run_tests() {
  say "running ctest (excluding labels slow and gpu)"
  cd "$BUILD_DIR"
  ctest --output-on-failure -LE 'slow|gpu' -j "$JOBS" --timeout 900
}

mode="${1:-}"
case "$mode" in
  deps)  install_deps; install_python ;;
  build) configure_and_build ;;
  test)  install_deps; install_python; configure_and_build; run_tests ;;
  demo)  install_deps; install_python; configure_and_build; say "running tessera demo"; shift; "$BUILD_DIR/bin/tessera" demo "$@" ;;
  *) echo "usage: deploy/dev.sh demo|test|deps|build" >&2; exit 2 ;;
esac
