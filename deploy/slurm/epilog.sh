#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/ddp-agent/epilog.sh, installed
# beside /etc/slurm/ddp-agent/prolog.sh, which it runs by that name): runs as
# root on every node of a job when it ends.
#
# 1. A node whose `ddp-agent run` exited 3 left the job because it should be
#    drained (a GPU that needs a reset, a drain-node health finding,
#    --straggler-action drain). ddp-agent.sbatch leaves a note,
#    $DDP_AGENT_DRAIN_DIR/ddp-agent-drain.<job>.<node> (default /tmp); this
#    drains the node with that reason and removes the note. Only a regular
#    file owned by the job's user (or root) counts.
# 2. Then it runs the same health checks as the prolog (prolog.sh, in this
#    script's directory), so a node that broke during the job is drained
#    before the next one lands on it.
#
# It exits 0: the node is drained through scontrol with a reason, rather than
# through Slurm's generic "Epilog error". Except when prolog.sh is missing or
# cannot run: then the post-job checks did not run, and it exits 1 with a
# message, so that Slurm drains the node ("Epilog error") rather than let the
# next job land on a node nothing checked.
#
# Settings: the site's file, $DDP_AGENT_SLURM_DEFAULTS (default
# /etc/default/ddp-agent-slurm), sourced when it exists, as by prolog.sh and
# the sbatch scripts: DDP_AGENT_DRAIN_DIR (default /tmp) must be the same here
# as in the job, which is why the site sets it there and not the user.

set -u
defaults=${DDP_AGENT_SLURM_DEFAULTS:-/etc/default/ddp-agent-slurm}
# shellcheck source=/dev/null
[ -r "$defaults" ] && . "$defaults"

DDP_AGENT_DRAIN_DIR=${DDP_AGENT_DRAIN_DIR:-/tmp}
DDP_AGENT_SCONTROL=${DDP_AGENT_SCONTROL:-scontrol}
node=${SLURMD_NODENAME:-$(hostname -s)}
job=${SLURM_JOB_ID:-}

if [ -n "$job" ]; then
	note="$DDP_AGENT_DRAIN_DIR/ddp-agent-drain.$job.$node"
	if [ -f "$note" ] && [ ! -L "$note" ]; then
		owner=$(stat -c %u "$note")
		if [ "$owner" = "${SLURM_JOB_UID:-0}" ] || [ "$owner" = 0 ]; then
			reason=$(head -c 200 "$note" | head -n 1 | tr -cd '[:print:]')
			echo "ddp-agent-epilog: draining $node: ${reason:-ddp-agent exit 3}" >&2
			logger -t ddp-agent-epilog -- "draining $node: ${reason:-ddp-agent exit 3}" 2>/dev/null || true
			"$DDP_AGENT_SCONTROL" update NodeName="$node" State=DRAIN Reason="ddp-agent: ${reason:-exit 3 in job $job}" ||
				echo "ddp-agent-epilog: scontrol update NodeName=$node State=DRAIN failed" >&2
		fi
		rm -f -- "$note"
	fi
fi

# fail says why the post-job checks did not run, and exits 1 (see above).
fail() {
	echo "ddp-agent-epilog: $1; failing so that Slurm drains $node" >&2
	logger -t ddp-agent-epilog -- "$1; failing so that Slurm drains $node" 2>/dev/null || true
	exit 1
}

prolog="$(dirname -- "$0")/prolog.sh"
if [ ! -f "$prolog" ] || [ ! -x "$prolog" ]; then
	fail "$prolog is missing or not executable (install prolog.sh and epilog.sh side by side, in /etc/slurm/ddp-agent/): the post-job checks did not run"
fi
"$prolog"
rc=$?
# 0: all well; 1: a check asked for a drain and the prolog drained the node
# with its reason. Anything else means the checks could not run (a shell
# that cannot start it, a signal).
if [ "$rc" -gt 1 ]; then
	fail "$prolog failed (exit $rc): the post-job checks may not have run"
fi
exit 0
