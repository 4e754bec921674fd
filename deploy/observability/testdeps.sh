#!/usr/bin/env bash
# Installs the real tools deploy/observability's test runs, when missing, and
# prints where they are, one "name=path" a line:
#   promtool=/usr/bin/promtool
#   prometheus=/usr/bin/prometheus
#   jaeger=/work/main/.cache/deploy/jaeger
#
# Prometheus and promtool: Debian's prometheus package (apt-get, as root).
# The package enables a prometheus service; nothing here starts it (the
# test runs its own prometheus on free ports).
# Jaeger v1.76.0 (Jaeger v2, an OpenTelemetry Collector build): built from
# the Go module pinned in tools/go.mod (a separate module, so Jaeger's
# dependencies stay out of the agent's go.mod) into $DDP_AGENT_DEPLOY_CACHE
# (default .cache/deploy at the repository root). The first build takes
# several minutes and ~1 GB of module cache; later runs reuse the binary.
#
# Network: apt's mirrors and the Go module proxy only, and only for what is
# missing. Safe to run again.
#
#   deploy/observability/testdeps.sh
#   DDP_AGENT_DEPLOY_TESTS=1 go test ./deploy/observability/
#
#   deploy/observability/testdeps.sh jaeger   only the Jaeger build, no apt
#     (.ci/run builds it while make test downloads, and runs apt itself)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${DDP_AGENT_DEPLOY_CACHE:-$root/.cache/deploy}
say() { echo "testdeps: $*" >&2; }
only=${1:-}

if [ "$only" != jaeger ] && { ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; }; then
	if [ "$(id -u)" != 0 ]; then
		say "promtool or prometheus missing; run as root, or: sudo apt-get install -y prometheus"
		exit 1
	fi
	say "installing Debian's prometheus package"
	export DEBIAN_FRONTEND=noninteractive
	# The package's service must not start here (a container has no init
	# anyway); a policy-rc.d that says 101 keeps invoke-rc.d from trying.
	policy=/usr/sbin/policy-rc.d
	added=
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added=1
	fi
	status=0
	{ apt-get install -y -qq --no-install-recommends prometheus >&2 ||
		{ apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends prometheus >&2; }; } || status=$?
	[ -n "$added" ] && rm -f "$policy"
	[ "$status" = 0 ] || exit "$status"
fi

jaeger=$cache/jaeger
if [ ! -x "$jaeger" ]; then
	go=${GO:-}
	if [ -z "$go" ]; then
		go=$("$root/scripts/deps.sh" go 2>/dev/null || true)
		[ -x "$go" ] || go=$(command -v go || echo /usr/local/go/bin/go)
	fi
	say "building Jaeger (tools/go.mod) into $jaeger; this takes minutes the first time"
	mkdir -p "$cache"
	(cd "$here/tools" && nice -n 10 "$go" build -o "$jaeger.tmp" github.com/jaegertracing/jaeger/cmd/jaeger)
	mv -f "$jaeger.tmp" "$jaeger"
fi

echo "promtool=$(command -v promtool)"
echo "prometheus=$(command -v prometheus)"
echo "jaeger=$jaeger"
