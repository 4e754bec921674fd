#!/bin/bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/ddp-agent/prolog.sh, with
# epilog.sh beside it, which runs this file by that name): runs the node's
# health checks before a job starts on it, as root, on every node of the job.
# The checks are the scripts that `ddp-agent run --plugin exec,command=CHECK`
# runs during the job, and follow the exec plugin's contract
# (docs/plugin-sdk.md#the-exec-plugin): the first line of standard output is
# the message, and the exit code says what to do:
#
#   0 ok; 1 warning (logged); 2 error that a restart of the workers would fix
#   (logged: there are no workers yet); 3 drain the node;
#   other codes, a signal, or running past the timeout: warning.
#
# ddp-agent has no command that runs an exec check on its own (its bundled
# plugins are served to the agent over go-plugin and refuse to run by hand),
# so this script runs the check scripts directly, with the same contract.
#
# A check exiting 3 drains the node with the check's message as the reason
# and fails the prolog, so Slurm requeues the job. Slurm then holds it
# (Reason=launch_failed_requeued_held, until `scontrol release JOB`) unless
# slurm.conf has SchedulerParameters=nohold_on_prolog_fail, with which the
# job goes back to the queue and runs on another node (README.md).
#
# Settings: the site's file, $DDP_AGENT_SLURM_DEFAULTS (default
# /etc/default/ddp-agent-slurm), is sourced when it exists; epilog.sh and the
# sbatch scripts read the same file.
#   DDP_AGENT_CHECKS_DIR   the checks: every executable file in it, in name
#                          order (default /etc/ddp-agent/checks.d)
#   DDP_AGENT_CHECK_TIMEOUT  seconds each check may take (default 10; keep the
#                          sum well below slurm.conf's PrologEpilogTimeout)
#   DDP_AGENT_SCONTROL     the scontrol command (default scontrol)

set -u
export PATH="${PATH:+$PATH:}/usr/sbin:/usr/bin:/sbin:/bin" # slurmd's environment may have none
defaults=${DDP_AGENT_SLURM_DEFAULTS:-/etc/default/ddp-agent-slurm}
# shellcheck source=/dev/null
[ -r "$defaults" ] && . "$defaults"

DDP_AGENT_CHECKS_DIR=${DDP_AGENT_CHECKS_DIR:-/etc/ddp-agent/checks.d}
DDP_AGENT_CHECK_TIMEOUT=${DDP_AGENT_CHECK_TIMEOUT:-10}
DDP_AGENT_SCONTROL=${DDP_AGENT_SCONTROL:-scontrol}
node=${SLURMD_NODENAME:-$(hostname -s)}
context=${SLURM_SCRIPT_CONTEXT:-prolog}

log() {
	logger -t "ddp-agent-$context" -- "$*" 2>/dev/null || true
	echo "ddp-agent-$context: $*" >&2
}

drain() {
	log "draining $node: $1"
	"$DDP_AGENT_SCONTROL" update NodeName="$node" State=DRAIN Reason="ddp-agent: ${1:0:200}" ||
		log "scontrol update NodeName=$node State=DRAIN failed"
}

# run_checks runs every check; it returns 3 when one asked for a drain.
run_checks() {
	local check name out rc pid tmp worst=0
	[ -d "$DDP_AGENT_CHECKS_DIR" ] || return 0
	tmp=$(mktemp) || return 0
	for check in "$DDP_AGENT_CHECKS_DIR"/*; do
		if [ ! -f "$check" ] || [ ! -x "$check" ]; then
			continue
		fi
		name=${check##*/}
		# As the exec plugin does: the check runs in a process group of its
		# own (timeout makes one and kills all of it on timeout), which is
		# killed when the check exits, so its background children go too;
		# the message is the first line of its first 1 KiB of output.
		timeout -s KILL "$DDP_AGENT_CHECK_TIMEOUT" "$check" </dev/null >"$tmp" 2>/dev/null &
		pid=$!
		wait "$pid"
		rc=$?
		kill -KILL -- "-$pid" 2>/dev/null
		out=$(head -c 1024 "$tmp" | head -n 1 | tr -cd '[:print:]')
		case "$rc" in
		0) ;;
		1 | 2) log "check $name: warning (exit $rc): $out" ;;
		3)
			drain "check $name: $out"
			worst=3
			;;
		124 | 137) log "check $name: warning: ran past ${DDP_AGENT_CHECK_TIMEOUT}s and was killed" ;;
		*) log "check $name: warning: exit $rc: $out" ;;
		esac
	done
	rm -f -- "$tmp"
	return "$worst"
}

run_checks
rc=$?
if [ "$rc" -eq 3 ]; then
	# A failed prolog requeues the job (the node is drained already); with
	# nohold_on_prolog_fail it is not held, and runs on another node.
	exit 1
fi
exit 0
