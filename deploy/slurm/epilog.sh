#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/ddp-agent-epilog.sh, installed
# next to ddp-agent-prolog.sh): runs as root on every node of a job when it
# ends.
#
# 1. A node whose `ddp-agent run` exited 3 left the job because it should be
#    drained (a GPU that needs a reset, a drain-node health finding,
#    --straggler-action drain). ddp-agent.sbatch leaves a note,
#    $DDP_AGENT_DRAIN_DIR/ddp-agent-drain.<job>.<node> (default /tmp); this
#    drains the node with that reason and removes the note. Only a regular
#    file owned by the job's user (or root) counts.
# 2. Then it runs the same health checks as the prolog (prolog.sh, next to
#    this script), so a node that broke during the job is drained before the
#    next one lands on it.
#
# It exits 0: the node is drained through scontrol with a reason, rather than
# through Slurm's generic "Epilog error".

set -u
# shellcheck source=/dev/null
[ -r /etc/default/ddp-agent-slurm ] && . /etc/default/ddp-agent-slurm

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

"$(dirname -- "$0")/prolog.sh"
exit 0
