#!/bin/sh
# deps.sh installs what examples/bench/mpi/run.py compares the shim with:
# OpenMPI 4.1 and mpi4py for the system python3, from Debian. Idempotent: it
# does nothing when mpirun and mpi4py are already there. Needs root (apt-get);
# kept apart from scripts/deps.sh because only this benchmark uses them.
set -eu
python=${PYTHON:-/usr/bin/python3}
if command -v mpirun >/dev/null 2>&1 && "$python" -c 'import mpi4py' 2>/dev/null; then
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "deps.sh: no apt-get; install OpenMPI and mpi4py for $python by hand" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q openmpi-bin libopenmpi-dev python3-mpi4py >/dev/null ||
	{ apt-get update -q >/dev/null && apt-get install -y -q openmpi-bin libopenmpi-dev python3-mpi4py >/dev/null; }
