#!/usr/bin/env bash
# Installs what `make demo` and `make test` need on a fresh Debian 12 machine:
# a Go toolchain (>= 1.26, which etcd v3.7 needs), the Go modules, gcc, and Debian's PyTorch (python3-torch,
# CPU, gloo), pytest and pip for /usr/bin/python3. Prints the Go binary to use.
# Safe to run again: it installs only what is missing.
#   scripts/deps.sh go    only the Go toolchain, modules and gcc (for make build)
#   scripts/deps.sh       everything (for make test, demo, bench)
set -euo pipefail
what=${1:-all}
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

if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
	apt_install "PyTorch for $PYTHON" "python3-torch python3-pytest"
fi
if ! "$PYTHON" -c 'import pytest' 2>/dev/null; then
	apt_install "pytest for $PYTHON" "python3-pytest"
fi
# The install test runs `pip install --no-build-isolation ./python` offline.
if ! "$PYTHON" -m pip --version >/dev/null 2>&1 || ! "$PYTHON" -c 'import setuptools, wheel' 2>/dev/null; then
	apt_install "pip, setuptools and wheel for $PYTHON" "python3-pip python3-setuptools python3-wheel"
fi
echo "$GO_BIN"
