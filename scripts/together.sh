#!/usr/bin/env bash
# Runs independent test passes at the same time, each with its output in its
# own log, prints each log whole as its pass ends, with its wall time, and
# exits non-zero when any pass failed (after all have ended).
#
#   scripts/together.sh LOGDIR NAME 'COMMAND' [NAME 'COMMAND' ...]
#
# make test runs its three Python passes (pytest on torch 1.13 and 2.x, and
# the end-to-end tests on torch 2.x) through it: each alone kept the 2-core
# CI machine's CPUs only 48-64 % busy, since its tests mostly wait on the
# processes they start, and one after another they took 8.4 minutes.
set -uo pipefail
if [ $# -lt 3 ] || [ $(($# % 2)) -ne 1 ]; then
	echo "usage: $0 LOGDIR NAME 'COMMAND' [NAME 'COMMAND' ...]" >&2
	exit 2
fi
dir=$1
shift
mkdir -p "$dir"
declare -A name started
order=()
while [ $# -gt 0 ]; do
	log="$dir/$1.log"
	bash -c "$2" >"$log" 2>&1 &
	name[$!]=$1
	started[$!]=$SECONDS
	order+=("$1")
	echo "== started $1 (log: $log)"
	shift 2
done
# Each pass is killed with this script (make's ^C, CI's timeout).
trap 'kill "${!name[@]}" 2>/dev/null' EXIT
failed=()
for _ in "${order[@]}"; do
	wait -n -p pid
	rc=$?
	n=${name[$pid]}
	echo "== $n ended; its output:"
	cat "$dir/$n.log"
	if [ "$rc" -eq 0 ]; then
		echo "== $n passed in $((SECONDS - started[$pid])) s"
	else
		echo "== $n FAILED (exit $rc) in $((SECONDS - started[$pid])) s"
		failed+=("$n")
	fi
	unset "name[$pid]"
done
trap - EXIT
if [ ${#failed[@]} -gt 0 ]; then
	echo "== failed: ${failed[*]}"
	exit 1
fi
