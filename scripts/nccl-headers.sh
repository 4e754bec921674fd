#!/usr/bin/env bash
# Caches the real nccl.h of several NCCL releases, for the layout test of
# shim/nccl (layout_test.go): the shim declares NCCL's types itself, and
# the test compiles them side by side with each cached header.
#
#   scripts/nccl-headers.sh [VERSION...]    default: the list below
#
# Each VERSION is a release of PyPI's nvidia-nccl-cu12 wheel. Its nccl.h goes
# to $DDP_AGENT_NCCL_HEADERS/VERSION/nccl.h (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/ddp-agent/nccl-headers); the wheel (100-300
# MB) is fetched with `pip download --no-deps` into a temporary directory,
# only nccl.h is kept, and the wheel is deleted. A version already cached is
# not fetched again, so a second run costs nothing. Prints the cache
# directory on stdout.
#
# The default list: every release from the oldest the shim supports for
# layouts (2.18, whose ncclConfig_t the shim declares) to the newest, one
# patch release per minor (the newest of each; the config struct and enums
# change only between minors).
set -euo pipefail

PYTHON=${PYTHON:-/usr/bin/python3}
DIR=${DDP_AGENT_NCCL_HEADERS:-${XDG_CACHE_HOME:-$HOME/.cache}/ddp-agent/nccl-headers}
VERSIONS=(2.18.3 2.19.3 2.20.5 2.21.5 2.22.3 2.23.4 2.24.3 2.25.1 2.26.5 2.27.7 2.28.9 2.29.7 2.30.7 2.31.2 2.32.3)
[ $# -gt 0 ] && VERSIONS=("$@")
say() { echo "nccl-headers: $*" >&2; }

mkdir -p "$DIR"
missing=()
for v in "${VERSIONS[@]}"; do
	[ -s "$DIR/$v/nccl.h" ] || missing+=("$v")
done
if [ ${#missing[@]} -eq 0 ]; then
	say "all ${#VERSIONS[@]} headers cached in $DIR"
	echo "$DIR"
	exit 0
fi
if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
	say "$PYTHON has no pip (scripts/deps.sh installs python3-pip); cannot fetch ${missing[*]}"
	exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/nccl-headers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for v in "${missing[@]}"; do
	start=$SECONDS
	# This machine's own wheel (x86_64 or aarch64): nccl.h is the same in each.
	"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check \
		-d "$tmp/$v" "nvidia-nccl-cu12==$v" >&2
	whl=$(ls "$tmp/$v"/*.whl)
	mkdir -p "$DIR/$v"
	"$PYTHON" - "$whl" "$DIR/$v/nccl.h.tmp" <<'EOF'
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.endswith("/include/nccl.h")]
    if len(names) != 1:
        sys.exit(f"{sys.argv[1]}: want one include/nccl.h, found {names}")
    with open(sys.argv[2], "wb") as out:
        out.write(z.read(names[0]))
EOF
	mv "$DIR/$v/nccl.h.tmp" "$DIR/$v/nccl.h"
	size=$(du -m "$whl" | cut -f1)
	rm -rf "${tmp:?}/$v"
	say "$v: nccl.h cached ($size MB wheel, $((SECONDS - start)) s)"
done
echo "$DIR"
