#!/usr/bin/env bash
# Tessera developer entry point.
#
#   deploy/dev.sh demo   install Debian packages, build into build/, run `tessera demo`
#   deploy/dev.sh test   install Debian packages, build into build/, run ctest (not slow, not gpu)
#   deploy/dev.sh deps   install Debian packages only
#   deploy/dev.sh build  configure and build only
#
# Works from a fresh Debian 12 machine as root (or with sudo). Every step is idempotent.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TESSERA_BUILD_DIR:-$ROOT/build}"
JOBS="${TESSERA_JOBS:-$(nproc)}"

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libgloo-dev
  libtorch-dev libopenblas0-pthread
  libcaf-dev libssl-dev
  libcapnp-dev capnproto
  libboost-dev
  libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libreadline-dev libpcre2-dev libpng-dev libjemalloc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3
)
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
  # libtorch must use OpenBLAS, not netlib's reference BLAS (~30x slower for fp32).
  local blas
  blas="$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | awk '/^Value:/{print $2}')"
  if [[ -n "$blas" && "$blas" != *openblas* ]]; then
    local candidate
    candidate="$(update-alternatives --list libblas.so.3-x86_64-linux-gnu | grep openblas | head -n1 || true)"
    if [[ -n "$candidate" ]]; then
      say "pointing libblas.so.3 at OpenBLAS ($candidate)"
      as_root update-alternatives --set libblas.so.3-x86_64-linux-gnu "$candidate"
    fi
  fi
}

configure_and_build() {
  export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
  local extra=()
  if command -v clang++-14 >/dev/null 2>&1; then extra+=(-DTESSERA_FUZZ_CLANG=clang++-14); fi
  say "configuring into $BUILD_DIR"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE="${TESSERA_BUILD_TYPE:-RelWithDebInfo}" \
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
  deps)  install_deps ;;
  build) configure_and_build ;;
  test)  install_deps; configure_and_build; run_tests ;;
  demo)  install_deps; configure_and_build; say "running tessera demo"; shift; "$BUILD_DIR/bin/tessera" demo "$@" ;;
  *) echo "usage: deploy/dev.sh demo|test|deps|build" >&2; exit 2 ;;
esac
