package agent

import (
	"context"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// Under --spares the first attempt's workers start warm: before this node
// joins the rendezvous, its agent starts them as warm spares
// (supervisor.StartWarm), and the round's group gives them their ranks.
// Where the job has a generation running, the node waits for their
// imports before it joins: the job learns of the node when it joins, so
// the others train on meanwhile and stop only for its workers' script and
// state, not for their interpreter and torch (1.4-1.7 s for torch alone
// on the 2-core VM). Where it has none (the job's start), the node joins
// at once and the imports overlap the rendezvous: waiting for them there
// spread the nodes' joins by their import times (seconds apart under
// load), and a node past the round's last call missed the first round,
// to rescale the job moments later.

// warmBound bounds the wait for the warm workers' imports before a node
// joins a running job: past it the node joins anyway, and a worker not
// ready yet takes its rank when it is.
const warmBound = 2 * time.Minute

// attemptDir is attempt n's directory: its workers' error files, logs and
// stacks.
func (r *run) attemptDir(n int) string { return filepath.Join(r.runDir, "attempt_"+strconv.Itoa(n)) }

// startWarm starts the first attempt's workers warm, under --spares, and
// returns their group; nil without spares, or where a worker's placement
// binds it with a command prefix (numactl), which a running process cannot
// take.
func (r *run) startWarm(ctx context.Context) *supervisor.Group {
	if r.cfg.Spares == 0 || len(r.cfg.SpareCommand) == 0 {
		return nil
	}
	// A provisional spec: the round's values come with each worker's rank.
	spec := r.spec(&rdzv.Round{}, r.attemptDir(0))
	if spec.Place != nil {
		for lr := range spec.NProc {
			if len(spec.Place(lr).Prefix) > 0 {
				r.log.Info("workers start after the rendezvous, not warm before it: their placement binds them with a command",
					"local_rank", lr)
				return nil
			}
		}
	}
	bound := time.Duration(0)
	running, err := r.j.rz.Running(ctx)
	if err != nil { // the rendezvous that follows says more
		r.log.Warn("could not tell whether the job is running; joining without waiting for the warm workers", "err", err)
	}
	if running {
		bound = warmBound
	}
	g := supervisor.New(spec, r.log)
	t := time.Now()
	n := g.StartWarm(ctx, spec.NProc, bound)
	if running {
		r.log.Info("workers started warm, before this node joins the running job", "ready", n, "nproc", spec.NProc,
			"took", time.Since(t).Round(time.Millisecond))
	} else {
		r.log.Info("workers start warm while this node joins the rendezvous", "nproc", spec.NProc)
	}
	return g
}

// adoptWarm is attempt n's group: warm's, given the round's spec, when
// the first attempt's workers started warm; else a new one.
func (r *run) adoptWarm(warm *supervisor.Group, spec *supervisor.Spec, n int) *supervisor.Group {
	if warm == nil {
		return supervisor.New(spec, r.log)
	}
	if err := warm.Adopt(spec); err != nil || n != 0 {
		r.log.Warn("warm workers not used; starting the workers afresh", "attempt", n, "err", err)
		warm.Stop(syscall.SIGKILL, 0)
		return supervisor.New(spec, r.log)
	}
	return warm
}
