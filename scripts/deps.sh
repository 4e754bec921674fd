#!/usr/bin/env bash
# Installs what `make demo` and `make test` need on a fresh Debian 12 machine:
# a Go toolchain (>= 1.26, which etcd v3.7 needs), the Go modules, gcc, and Debian's PyTorch (python3-torch,
# CPU, gloo), pytest and pip for /usr/bin/python3. Prints the Go binary to use.
# Safe to run again: it installs only what is missing.
#   scripts/deps.sh go      only the Go toolchain, modules and gcc (for make build)
#   scripts/deps.sh wheel   that and pip, setuptools and wheel for $PYTHON (make wheel)
#   scripts/deps.sh         that and Debian's PyTorch 1.13 for $PYTHON (make demo, bench)
#   scripts/deps.sh torch2  only the PyTorch 2.x venv (below); prints its python
#   scripts/deps.sh all     everything (make test): prints the Go binary
#
# The PyTorch 2.x venv is $DDP_AGENT_TORCH2_VENV, by default
# ${XDG_CACHE_HOME:-$HOME/.cache}/ddp-agent/torch2-venv, kept between runs: made
# with `python3 -m venv` (python3-venv) when missing, then pip installs from PyPI
# what it lacks of the newest torch 2.x (the CUDA build, ~5.6 GB, ~7 minutes the
# first time), pytest, numpy, setuptools, wheel, nvidia-nccl-cu12, and
# lightning and accelerate (the frameworks' end-to-end tests). When
# nothing is missing, pip is not run at all (no network needed).
set -euo pipefail
what=${1:-python}
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-/usr/bin/python3}
GO_MIN=${GO_MIN:-26}                      # minor version of Go 1.x that go.mod needs
GO_FETCH=go1.26.8               # fetched from the module proxy when no Go is found
say() { echo "deps: $*" >&2; }

need_root() {
	if [ "$(id -u)" != 0 ]; then
		say "missing: $1"
		say "run as root, or install it yourself: sudo apt-get install -y $2"
		exit 1
	fi
}

apt_install() {
	need_root "$1" "$2"
	say "installing $2 with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	# shellcheck disable=SC2086
	apt-get update -qq >&2 && apt-get install -y -qq $2 >&2
}

# torch2_missing VENV_PYTHON: prints the pip requirements the venv lacks, one
# a line (package metadata only: torch is not imported).
torch2_missing() {
	"$1" - <<'PY'
from importlib import metadata
def major(name):
    try:
        return int(metadata.version(name).split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return None
for req, ok in (("torch>=2", (major("torch") or 0) >= 2), ("pytest", major("pytest") is not None),
                ("numpy", major("numpy") is not None), ("setuptools>=61", (major("setuptools") or 0) >= 61),
                ("wheel", major("wheel") is not None), ("nvidia-nccl-cu12", major("nvidia-nccl-cu12") is not None),
                ("lightning", major("lightning") is not None), ("accelerate", major("accelerate") is not None)):
    if not ok:
        print(req)
PY
}

torch2_venv() {
	local venv=${DDP_AGENT_TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ddp-agent/torch2-venv}
	local py=$venv/bin/python missing
	if ! "$py" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; then
		if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
			say "$venv is not a venv (no pyvenv.cfg): remove it, or set DDP_AGENT_TORCH2_VENV"
			exit 1
		fi
		"$PYTHON" -c 'import ensurepip' 2>/dev/null || apt_install "venv for $PYTHON" "python3-venv"
		say "creating the PyTorch 2.x venv $venv"
		mkdir -p "$(dirname "$venv")"
		"$PYTHON" -m venv --clear "$venv" >&2
	fi
	missing=$(torch2_missing "$py")
	if [ -n "$missing" ]; then
		# shellcheck disable=SC2086
		say "installing into $venv from PyPI:" $missing
		# shellcheck disable=SC2086
		"$py" -m pip install -q --disable-pip-version-check $missing >&2
		missing=$(torch2_missing "$py")
		if [ -n "$missing" ]; then say "still missing in $venv:" $missing; exit 1; fi
	fi
	echo "$py"
}

if [ "$what" = torch2 ]; then torch2_venv; exit 0; fi

go_ok() {
	local v
	v=$("$1" env GOVERSION 2>/dev/null) || return 1
	v=${v#go1.}
	[ "${v%%.*}" -ge "$GO_MIN" ] 2>/dev/null
}

find_go() {
	for g in "${GO:-}" "$(command -v go || true)" /usr/local/go/bin/go "$PWD/.cache/go/bin/go"; do
		if [ -n "$g" ] && [ -x "$g" ] && go_ok "$g"; then echo "$g"; return 0; fi
	done
	return 1
}

if ! GO_BIN=$(find_go); then
	# No Go >= 1.26 (Debian 12's golang-go is 1.19): fetch the official
	# toolchain from the Go module proxy, as GOTOOLCHAIN=auto would.
	command -v curl >/dev/null && command -v unzip >/dev/null || apt_install "curl and unzip" "curl unzip ca-certificates"
	proxy=${GOPROXY:-https://proxy.golang.org}; proxy=${proxy%%,*}
	say "no Go >= 1.$GO_MIN found; fetching $GO_FETCH from $proxy into .cache/go"
	mkdir -p .cache
	curl -fsSL -o .cache/go.zip "$proxy/golang.org/toolchain/@v/v0.0.1-$GO_FETCH.linux-amd64.zip"
	rm -rf .cache/go .cache/golang.org
	unzip -q .cache/go.zip -d .cache
	mv ".cache/golang.org/toolchain@v0.0.1-$GO_FETCH.linux-amd64" .cache/go
	rm -rf .cache/go.zip .cache/golang.org
	GO_BIN=$PWD/.cache/go/bin/go
fi
"$GO_BIN" mod download >&2
# cgo: libddpshim.so, its reduction kernels, the race detector.
command -v gcc >/dev/null || apt_install "a C compiler (cgo: libddpshim.so, race detector)" "gcc libc6-dev"
if [ "$what" = go ]; then echo "$GO_BIN"; exit 0; fi

# make wheel, and the install tests: `pip install --no-build-isolation` offline.
pip_tools() {
	if ! "$PYTHON" -m pip --version >/dev/null 2>&1 || ! "$PYTHON" -c 'import setuptools, wheel' 2>/dev/null; then
		apt_install "pip, setuptools and wheel for $PYTHON" "python3-pip python3-setuptools python3-wheel"
	fi
}
if [ "$what" = wheel ]; then pip_tools; echo "$GO_BIN"; exit 0; fi

if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
	apt_install "PyTorch for $PYTHON" "python3-torch python3-pytest"
fi
if ! "$PYTHON" -c 'import pytest' 2>/dev/null; then
	apt_install "pytest for $PYTHON" "python3-pytest"
fi
# The install tests run `pip install --no-build-isolation ./python` offline.
pip_tools
# The plugins' end-to-end tests make a veth pair in a network namespace
# (they skip, saying why, without ip or root).
command -v ip >/dev/null || [ "$(id -u)" != 0 ] || apt_install "iproute2 (the nic plugin's veth tests)" "iproute2"
if [ "$what" = all ]; then
	torch2_venv >/dev/null
	# The real nccl.h of NCCL 2.18 to the newest, for shim/nccl's layout
	# test (cached; about 4 GB of wheels fetched the first time, headers kept).
	PYTHON=$PYTHON scripts/nccl-headers.sh >/dev/null
fi
echo "$GO_BIN"
