#!/usr/bin/env bash
# Build Tessera with CUDA + NCCL on the GPU image and run its GPU checks.
#
#   deploy/cuda-image.sh fetch DIR     (on a Debian 12 machine) download the .debs the image lacks
#   deploy/cuda-image.sh configure     unpack DIR's .debs under a private prefix, configure build-cuda/
#   deploy/cuda-image.sh build [TGT]   ninja -k 0 (all targets, or the named ones)
#   deploy/cuda-image.sh test [ARGS]   ctest ARGS in build-cuda/ (e.g. -L gpu) with the exports below
#   deploy/cuda-image.sh env           print the exports that run build-cuda/ binaries
#
# The image is Ubuntu 24.04 with CUDA 13 in /usr/local/cuda and PyTorch (a CUDA LibTorch, C++11
# ABI) plus its NCCL in a Python venv; it has Boost, GTest, benchmark, fmt, spdlog, yaml-cpp,
# CLI11 and nlohmann-json, but no CAF, Cap'n Proto, jemalloc, PCRE2, readline, cairo or utf8proc, and
# nothing can be fetched there. So those come as Debian 12 .debs (`fetch`, copied along), unpacked
# with dpkg -x under $TESSERA_DEPS_PREFIX (never over /: the image's /lib is a symlink). Tessera
# links the venv's LibTorch and the venv's NCCL (the one LibTorch itself loads: one libnccl.so.2
# per process). LibTorch 2.11 bundles fmt 12 headers in its include dir, which the image's spdlog
# 1.12 cannot compile against (and Tessera is written against Debian's fmt 9): the image's own fmt 9
# headers go first as -I (searched before LibTorch's -isystem dirs). LibTorch ships no Gloo
# headers (ProcessGroupGloo.hpp includes them): Debian's libgloo-dev provides them; the Gloo code
# itself is LibTorch's. Environment: TESSERA_DEBS (the .deb folder, default .devdeps),
# TESSERA_DEPS_PREFIX (default /opt/tessera-deps), TESSERA_SHARED_DIR (golden fixtures).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TESSERA_BUILD_DIR:-$ROOT/build-cuda}"
DEBS="${TESSERA_DEBS:-$ROOT/.devdeps}"
PREFIX="${TESSERA_DEPS_PREFIX:-/opt/tessera-deps}"
LIBDIR="$PREFIX/usr/lib/x86_64-linux-gnu"
PACKAGES=(libcaf-dev libcaf-core0.17 libcaf-io0.17 libcaf-openssl0.17 capnproto libcapnp-0.9.2
          libcapnp-dev libjemalloc-dev libjemalloc2 libpcre2-dev libpcre2-8-0 libreadline-dev
          libreadline8 libgloo-dev libutf8proc-dev libutf8proc2
          libcairo2-dev libcairo2 libpixman-1-0 libfontconfig1 libfreetype6 libpng16-16 libx11-6
          libxcb1 libxcb-render0 libxcb-shm0 libxext6 libxrender1 libxau6 libxdmcp6 libbsd0
          libmd0 libbrotli1 libexpat1)

say() { printf '[cuda-image] %s\n' "$*"; }

python_site() { python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))'; }

export_env() {
  local site
  site="$(python_site)"
  export PATH="/usr/local/cuda/bin:$PATH"
  export LD_LIBRARY_PATH="$LIBDIR:$PREFIX/lib/x86_64-linux-gnu:$site/torch/lib:$site/nvidia/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_PATH="$LIBDIR/pkgconfig"
  # The venv's libtorch.so exports its own copies of libstdc++'s std::filesystem functions; a
  # binary built by the image's g++ 13 binds to them first (libtorch.so precedes libstdc++ in its
  # NEEDED list) and std::filesystem::remove_all jumps to a null pointer there. Preloading the
  # system libstdc++ makes every process bind to the real ones.
  export LD_PRELOAD="$(g++ -print-file-name=libstdc++.so.6)${LD_PRELOAD:+:$LD_PRELOAD}"
}

unpack() {
  [[ -d "$DEBS" ]] || { say "no .deb folder $DEBS (run 'fetch' on a Debian 12 machine)"; exit 1; }
  mkdir -p "$PREFIX"
  for p in "${PACKAGES[@]}"; do
    local f=("$DEBS/${p}"_*.deb)
    [[ -e "${f[0]}" ]] || { say "missing ${p}_*.deb in $DEBS"; exit 1; }
    dpkg -x "${f[0]}" "$PREFIX"
  done
  # The unpacked files still name /usr: point Cap'n Proto's config, PCRE2's .pc file and the
  # readline link (absolute, into /lib) at the prefix.
  sed -i "s|/usr/|$PREFIX/usr/|g" "$LIBDIR/cmake/CapnProto/CapnProtoConfig.cmake"
  sed -i "s|^prefix=/usr|prefix=$PREFIX/usr|" "$LIBDIR/pkgconfig/libpcre2-8.pc"
  ln -sfn "$PREFIX/lib/x86_64-linux-gnu/libreadline.so.8" "$LIBDIR/libreadline.so"
  mkdir -p "$PREFIX/fmt/include"
  ln -sfn /usr/include/fmt "$PREFIX/fmt/include/fmt"
}

case "${1:-}" in
  fetch)
    mkdir -p "${2:?fetch DIR}"
    (cd "$2" && apt-get download "${PACKAGES[@]}")
    ;;
  configure)
    unpack
    export_env
    site="$(python_site)"
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTESSERA_WITH_CUDA=ON -DTESSERA_CUDA_ARCHITECTURES=90 \
      -DCMAKE_PREFIX_PATH="$PREFIX/usr;$site/torch/share/cmake" \
      -DNCCL_LIBRARY="$site/nvidia/nccl/lib/libnccl.so.2" \
      -DNCCL_INCLUDE_DIR="$site/nvidia/nccl/include" \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_CXX_FLAGS="-I$PREFIX/fmt/include" \
      -DTESSERA_PYTHON="$(command -v python3)" \
      ${TESSERA_SHARED_DIR:+-DTESSERA_SHARED_DIR="$TESSERA_SHARED_DIR"}
    ;;
  build)
    shift
    export_env
    ninja -C "$BUILD_DIR" -k 0 "$@"
    ;;
  test)
    shift
    export_env
    (cd "$BUILD_DIR" && ctest --output-on-failure "$@")
    ;;
  env)
    export_env
    printf 'export PATH=%q LD_LIBRARY_PATH=%q LD_PRELOAD=%q\n' "$PATH" "$LD_LIBRARY_PATH" "$LD_PRELOAD"
    ;;
  *)
    sed -n '2,8p' "$0"
    exit 2
    ;;
esac
