#!/usr/bin/env bash
# Pack a build into one archive that runs on GPU machines which have PyTorch but none of Tessera's
# other libraries (the GPU image: Ubuntu 24.04, CUDA 13, PyTorch in a venv, no package registry).
#
#   deploy/bundle.sh OUT.tar.gz [BINARY...]   (default BINARY: tessera; names in $BUILD_DIR/bin)
#
# The archive holds tessera-bundle/{bin,lib,env.sh}: the binaries (stripped), every shared library
# they load except glibc's, libstdc++/libgcc's and PyTorch's own (LibTorch, its CUDA libraries and
# NCCL come from the target's `torch`), and env.sh. On the target:
#
#   tar xzf tessera.tar.gz && source tessera-bundle/env.sh && tessera train ...
#
# env.sh finds `torch` through $TESSERA_PYTHON (default python3) and stops with one line when it
# is missing or is not the version the build linked (LibTorch has no stable ABI). The target needs
# glibc >= the build machine's (Debian 12: 2.36; Ubuntu 24.04 has 2.39). The GPU checks from a
# bundle: `deploy/bundle.sh OUT.tar.gz tessera worker_test trainer_device_test ...`, then run the
# test binaries after sourcing env.sh (TESSERA_SHARED_DIR names the golden fixtures).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TESSERA_BUILD_DIR:-$ROOT/build}"
OUT="${1:?usage: deploy/bundle.sh OUT.tar.gz [BINARY...]}"
shift
BINS=("$@")
[[ ${#BINS[@]} -gt 0 ]] || BINS=(tessera)
PY="${TESSERA_PYTHON:-$ROOT/.venv/bin/python}"
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)')"

say() { printf '[bundle] %s\n' "$*"; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
dest="$stage/tessera-bundle"
mkdir -p "$dest/bin" "$dest/lib"
for b in "${BINS[@]}"; do
  [[ -x "$BUILD_DIR/bin/$b" ]] || { say "no binary $BUILD_DIR/bin/$b (build it first)"; exit 1; }
  cp "$BUILD_DIR/bin/$b" "$dest/bin/"
  strip "$dest/bin/$b"
done

# What the target provides: the C runtime, the compiler's runtime, and PyTorch with its CUDA
# libraries (torch/lib, nvidia/*, the CUDA runtime). Everything else travels.
provided='/(torch|nvidia)/|/cuda[^/]*/|/(ld-linux[^/]*|libc|libm|libdl|librt|libpthread|libutil|libresolv|libstdc\+\+|libgcc_s)\.so'
for b in "${BINS[@]}"; do
  ldd "$BUILD_DIR/bin/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
  if ldd "$BUILD_DIR/bin/$b" | grep -q 'not found'; then
    say "$b: $(ldd "$BUILD_DIR/bin/$b" | grep 'not found' | head -1 | xargs) here"
    exit 1
  fi
done | sort -u | while read -r soname path; do
  [[ "$path" =~ $provided ]] && continue
  cp -L "$path" "$dest/lib/$soname"
done

cat > "$dest/env.sh" <<EOF
# Source me: puts the bundled binaries on PATH and the bundled libraries, then the target's
# LibTorch, its CUDA libraries and NCCL, on the loader's path.
_tb="\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)"
_tpy="\${TESSERA_PYTHON:-python3}"
if ! _tsite="\$("\$_tpy" -c 'import os, torch; assert torch.__version__ == "$TORCH_VERSION", torch.__version__; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>&1)"; then
  echo "tessera-bundle: \$_tpy needs torch==$TORCH_VERSION (this build's LibTorch): \${_tsite##*$'\\n'}" >&2
  return 1 2>/dev/null || exit 1
fi
_tlibs="\$_tb/lib:\$_tsite/torch/lib"
for _td in "\$_tsite"/nvidia/*/lib "\$_tsite"/nvidia/cu*/lib /usr/local/cuda/lib64; do
  [[ -d "\$_td" ]] && _tlibs="\$_tlibs:\$_td"
done
export PATH="\$_tb/bin:\$PATH"
export LD_LIBRARY_PATH="\$_tlibs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
# libtorch.so carries its own copies of some std::filesystem functions; preloading the system
# libstdc++ makes every library bind to the real ones (deploy/cuda-image.sh has the story).
_tstd="\$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print \$NF; exit}')"
[[ -n "\$_tstd" ]] && export LD_PRELOAD="\$_tstd\${LD_PRELOAD:+:\$LD_PRELOAD}"
unset _tb _tpy _tsite _tlibs _td _tstd
EOF

tar -C "$stage" -czf "$OUT" tessera-bundle
say "$OUT: ${BINS[*]} and $(ls "$dest/lib" | wc -l) libraries, for torch==$TORCH_VERSION ($(du -h "$OUT" | cut -f1))"
