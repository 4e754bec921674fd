#!/usr/bin/env bash
# Installs what deploy/slurm/slurm_test.go needs on Debian 12: Slurm
# (slurm-wlm: slurmctld, slurmd, sbatch, ...; 22.05) and MUNGE, from Debian.
# It only installs packages: the test runs its own munged, slurmctld and two
# slurmd on a temporary configuration, and leaves the system's services and
# /etc/slurm alone. Safe to run again: it installs only what is missing.
# Needs root (as the test does: slurmd starts job steps as the job's user).
set -euo pipefail

missing=()
for tool in slurmctld slurmd sbatch srun scontrol squeue scancel sinfo; do
	command -v "$tool" >/dev/null || { missing+=(slurm-wlm); break; }
done
for tool in munged munge; do
	command -v "$tool" >/dev/null || { missing+=(munge); break; }
done
if [ "${#missing[@]}" -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "testdeps: missing ${missing[*]}; run as root: apt-get install -y ${missing[*]}" >&2
	exit 1
fi
echo "testdeps: installing ${missing[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# The packages' postinst scripts start services only where systemd (or an
# init script runner) is there to; the test starts its own daemons either way.
apt-get install -y -qq "${missing[@]}" >&2
