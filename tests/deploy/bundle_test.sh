#!/usr/bin/env bash
# bundle.sh: the archive runs `tessera` with nothing from the build machine but glibc, the
# compiler's runtime and the target's torch (every other library the binary loads comes from the
# bundle), and env.sh refuses a Python without this build's torch in one line.
set -euo pipefail
DEPLOY=$1
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$DEPLOY/bundle.sh" "$DIR/t.tar.gz" tessera >/dev/null
tar -C "$DIR" -xzf "$DIR/t.tar.gz"
B="$DIR/tessera-bundle"
run() { env -i HOME="$DIR" PATH=/usr/bin:/bin TESSERA_PYTHON="$TESSERA_PYTHON" bash -c "source '$B/env.sh' && $1"; }

[[ $(run 'command -v tessera') == "$B/bin/tessera" ]] || fail "env.sh does not put the bundle's tessera first"
outside=$(run 'ldd "$(command -v tessera)"' | awk '$2 == "=>" {print $3}' \
  | grep -v -E "^$B/lib/|/(torch|nvidia)/|/(libc|libm|libdl|librt|libpthread|libutil|libstdc\+\+|libgcc_s)\.so" || true)
[[ -z "$outside" ]] || fail "libraries loaded from outside the bundle: $outside"
config=$(run 'tessera config train 2>/dev/null' || true)
grep -q '^trainer:' <<<"$config" || fail "tessera config train printed no config"

err=$(env -i PATH=/usr/bin:/bin TESSERA_PYTHON=/bin/false bash -c "source '$B/env.sh'" 2>&1) && fail "a Python without torch was accepted"
[[ $(wc -l <<<"$err") == 1 && "$err" == *"needs torch=="* ]] || fail "env.sh error is not one line naming torch: $err"
echo "bundle.sh: OK"
