package rdzv

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Next blocks until this node is a member of a closed round, and returns
// the round. It joins the open round, or asks for one when the job runs
// without this node and has room (a rescale), or waits as a spare when the
// job is full. It fails with *JoinTimeoutError when too few nodes come
// within the join timeout, *JobFailedError when the job failed, and
// ErrJobSucceeded when the job is over.
func (e *Membership) Next(ctx context.Context) (*Round, error) {
	deadline := time.Now().Add(e.cfg.JoinTimeout)
	spare := false
	silent := e.newSilence()
	// retry waits a moment after a store error, unless the deadline passed
	// or the store has answered nothing for too long.
	retry := func(err error) error {
		if full := e.storeFull(err); full != nil {
			return full
		}
		if time.Now().After(deadline) {
			return err
		}
		if err := silent.tooLong(err); err != nil {
			e.markStoreLost()
			return err
		}
		e.log.Warn("rendezvous store request failed; retrying", "err", err)
		if !sleep(ctx, 500*time.Millisecond) {
			return context.Cause(ctx)
		}
		return nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, context.Cause(ctx)
		}
		qctx, cancel := silent.bound(ctx)
		err := e.ensureLease(qctx)
		cancel()
		if err != nil {
			if err := retry(err); err != nil {
				return nil, err
			}
			continue
		}
		qctx, cancel = silent.bound(ctx)
		st, rev, read, err := e.readState(qctx)
		cancel()
		if err != nil {
			if err := retry(err); err != nil {
				return nil, err
			}
			continue
		}
		silent.heard()
		e.noteAnswer(time.Now(), nil) // a later Next counts silence from its own start again
		switch st.Phase {
		case Failed, Succeeded:
			if e.lastGenSeen() == 0 && st.Since.Before(e.opened) {
				// This agent never ran in this job, which ended before it
				// came: a new run reusing the id of one that ended.
				fresh, err := e.restartEndedJob(ctx, st, rev)
				if err != nil {
					if err := retry(err); err != nil {
						return nil, err
					}
					continue
				}
				if fresh {
					continue
				}
			}
			if st.Phase == Failed {
				return nil, &JobFailedError{Reason: st.Reason}
			}
			return nil, ErrJobSucceeded
		case Running:
			me, member, err := e.assignment(ctx, st, e.node)
			if err != nil {
				if err := retry(err); err != nil {
					return nil, err
				}
				continue
			}
			if member && st.Generation >= e.lastGenSeen() {
				return e.startRound(st, me, rev, read), nil
			}
			isSpare, err := e.claimPlace(ctx, st, rev, member)
			if err != nil {
				if err := retry(err); err != nil {
					return nil, err
				}
				continue
			}
			if isSpare {
				if !spare {
					e.log.Info("the job is full; standing by as a spare", "generation", st.Generation, "nodes", st.Nodes())
					spare = true
				}
				deadline = time.Now().Add(e.cfg.JoinTimeout) // a spare of a healthy job waits as long as the job runs
				if err := e.waitStateChange(ctx, read); err != nil {
					return nil, err
				}
			}
		case Joining:
			spare = false
			r, err := e.joinRound(ctx, st, rev, read, deadline)
			var jt *JoinTimeoutError
			switch {
			case err == nil && r == nil:
			case err == nil, errors.As(err, &jt), ctx.Err() != nil:
				return r, err
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				// The store dropped our lease before our keep-alive
				// noticed; register again.
				e.markLeaseLost()
			default:
				if err := retry(err); err != nil {
					return nil, err
				}
			}
		}
	}
}

// claimPlace asks for a place in the job, which runs generation st
// without this node (member: this node was in it, but lost its lease):
// it moves the job to a new generation when this node lost its place, the
// job has room for it (a scale-up), or a member of the full job is gone.
// It reports spare when the job is full and healthy, and moves nothing.
func (e *Membership) claimPlace(ctx context.Context, st *State, rev int64, member bool) (spare bool, err error) {
	switch {
	case member:
		// This node ran this generation and lost it (its lease
		// expired) before anyone moved the job on.
		_, err = e.bump(ctx, st.Generation, rejoinMove(e.node))
		return false, err
	case st.Nodes() < e.cfg.NNodesMax:
		_, err = e.bump(ctx, st.Generation, joinMove(e.node, e.cfg.Host, st.Nodes()))
		return false, err
	}
	// A full job whose members are gone (a run killed without leaving,
	// whose leases ran out) must not keep spares out.
	gone, err := e.missingMembers(ctx, st)
	if err != nil {
		return false, err
	}
	if len(gone) > 0 {
		// Its entry is gone: how it left is in the entry's last value (a
		// member that left cleanly, drained for a straggler say, is no
		// fault to count against the restarts).
		d := e.departedSince(ctx, rev, gone[0])
		_, err = e.bump(ctx, st.Generation, d.move)
		return false, err
	}
	return true, nil
}

func (e *Membership) lastGenSeen() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastGen
}

// waitStateChange blocks until the state key changes after revision rev,
// a node entry is deleted (a spare must notice a full job losing a member
// that nobody else is left to report), or this node's lease is lost.
func (e *Membership) waitStateChange(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, lost := e.leaseChan()
	wch := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(stateKey), clientv3.WithRev(rev+1))
	nch := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(nodesDir), clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	select {
	case <-wch: // an event, or the watch broke: either way, read the state again
		return nil
	case <-nch:
		return nil
	case <-lost:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
