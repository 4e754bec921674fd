package rdzv

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// readState returns the job's state, its mod revision (for compare-and-
// swap) and the revision it was read at (to watch from: the mod revision
// may be compacted away long before). A malformed
// state (a person or tool wrote garbage) is replaced by a fresh Joining
// state, so the job recovers instead of every agent failing on it.
func (e *Membership) readState(ctx context.Context) (*State, int64, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.key(stateKey))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("rendezvous store at %s: read state: %w", e.cfg.Endpoint, err)
	}
	if len(resp.Kvs) == 0 {
		return e.resetState(ctx, 0, fmt.Sprintf("state key %s was missing", e.key(stateKey)), resp.Header.Revision)
	}
	kv := resp.Kvs[0]
	var st State
	if err := decode(e.key(stateKey), kv.Value, &st); err != nil || st.check() != nil {
		if err == nil {
			err = fmt.Errorf("malformed value at %s: %w", e.key(stateKey), st.check())
		}
		e.log.Error("rendezvous state is malformed; starting a new generation", "err", err)
		return e.resetState(ctx, kv.ModRevision, err.Error(), resp.Header.Revision)
	}
	return &st, kv.ModRevision, resp.Header.Revision, nil
}

// Running is whether the job has a generation running, which a node that
// joins now ends: its members stop to take the node in. Read only; false
// where the store has no state yet or a malformed one (Next replaces
// that).
func (e *Membership) Running(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.key(stateKey))
	if err != nil {
		return false, fmt.Errorf("rendezvous store at %s: read state: %w", e.cfg.Endpoint, err)
	}
	var st State
	if len(resp.Kvs) == 0 || decode(e.key(stateKey), resp.Kvs[0].Value, &st) != nil || st.check() != nil {
		return false, nil
	}
	return st.Phase == Running, nil
}

// check rejects a state that parses but that no agent wrote: the members
// must have the ranks 0..n-1 once each, and at least one worker.
func (st *State) check() error {
	if !st.Phase.valid() {
		return fmt.Errorf("unknown phase %q", st.Phase)
	}
	if st.Failures < 0 || st.MaxRestarts < 0 {
		return fmt.Errorf("negative failures or max_restarts")
	}
	seen := make([]bool, len(st.Members))
	for _, m := range st.Members {
		if m.GroupRank < 0 || m.GroupRank >= len(st.Members) || seen[m.GroupRank] || m.NProc < 1 || m.Node == "" {
			return fmt.Errorf("bad member %+v", m)
		}
		seen[m.GroupRank] = true
	}
	if st.Phase == Running && st.Nodes() == 0 {
		return fmt.Errorf("running with no members")
	}
	if st.NNodes < 0 || (st.NNodes > 0 && (st.MembersKey == "" || st.AssignPrefix == "")) {
		return fmt.Errorf("nnodes %d without its member keys", st.NNodes)
	}
	return nil
}

func (p Phase) valid() bool {
	switch p {
	case Joining, Running, Failed, Succeeded:
		return true
	}
	return false
}

func (e *Membership) resetState(ctx context.Context, modRev int64, reason string, storeRev int64) (*State, int64, int64, error) {
	// Every generation was written at a revision at least as high as the
	// generation number, so one above the store's revision is new to all.
	st := State{Generation: uint64(storeRev) + 1, Phase: Joining, Run: newRunID(), Reason: reason, Since: time.Now(), MaxRestarts: e.cfg.MaxRestarts}
	// (a missing key compares as mod revision 0)
	txn, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(e.key(stateKey)), "=", modRev)).
		Then(clientv3.OpPut(e.key(stateKey), encode(st))).Commit()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("rendezvous store at %s: reset state: %w", e.cfg.Endpoint, err)
	}
	if !txn.Succeeded {
		return e.readState(ctx)
	}
	return &st, txn.Header.Revision, txn.Header.Revision, nil
}

// swapState writes next as the state if the state's mod revision is
// still rev, and reports whether it did.
func (e *Membership) swapState(ctx context.Context, rev int64, next *State) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	txn, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(e.key(stateKey)), "=", rev)).
		Then(clientv3.OpPut(e.key(stateKey), encode(next))).Commit()
	if err != nil {
		return false, err
	}
	return txn.Succeeded, nil
}
