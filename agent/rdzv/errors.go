package rdzv

import (
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// ForeignJobError: the store was started for another job.
type ForeignJobError struct{ Endpoint, Hosted, Mine string }

func (e *ForeignJobError) Error() string {
	return fmt.Sprintf("refused: the rendezvous store at %s was started for job %q, and this agent's --rdzv-id is %q; give the same --rdzv-id to every node of a job", e.Endpoint, e.Hosted, e.Mine)
}

// ErrTokenMismatch: the job was created with another token (or none).
var ErrTokenMismatch = errors.New("refused: the rendezvous token does not match the job's (check --rdzv-token or DDP_AGENT_RDZV_TOKEN on every node)")

// JobFailedError: the job failed, here or on another node, and no
// restarts were left.
type JobFailedError struct{ Reason string }

func (e *JobFailedError) Error() string { return "job failed: " + e.Reason }

// ErrJobSucceeded: the job's workers all finished while this agent waited
// to join it.
var ErrJobSucceeded = errors.New("the job already finished")

// JoinTimeoutError: too few nodes joined within the join timeout.
type JoinTimeoutError struct {
	Joined, Min int
	Timeout     time.Duration
	Generation  uint64
}

func (e *JoinTimeoutError) Error() string {
	return fmt.Sprintf("rendezvous timed out: %d of the %d nodes needed joined generation %d within %v (join_timeout in --rdzv-conf)", e.Joined, e.Min, e.Generation, e.Timeout)
}

// StoreLostError: the store answered no request for Config.StoreTimeout.
type StoreLostError struct {
	Endpoint string
	For      time.Duration
	Err      error
}

func (e *StoreLostError) Error() string {
	return fmt.Sprintf("the rendezvous store at %s answered nothing for %v (its host is gone, or too few of its members are left for a quorum): %v",
		e.Endpoint, e.For.Round(time.Second), e.Err)
}

func (e *StoreLostError) Unwrap() error { return e.Err }

// StoreFullError: the store refuses writes for its size (etcd's NOSPACE
// alarm). Retrying cannot help: etcd refuses every write until someone
// frees space and disarms the alarm, so the agent ends with this instead
// of retrying forever.
type StoreFullError struct {
	Hosted bool  // the job's agents host the store (c10d), rather than an etcd of the user's
	Err    error // names the store's endpoint
}

func (e *StoreFullError) Error() string {
	how := "raise its --quota-backend-bytes, compact and defragment it, and disarm its NOSPACE alarm"
	if e.Hosted {
		how = "give the job a larger store_quota in --rdzv-conf (default 2GiB; it must hold two generations of what the workers write through the agent's key-value store)"
	}
	return fmt.Sprintf("the rendezvous store is full (%v); %s", e.Err, how)
}

func (e *StoreFullError) Unwrap() error { return e.Err }

// storeFull returns err as a *StoreFullError when the store refused it for
// its size, and nil otherwise.
func (e *Membership) storeFull(err error) error {
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		return nil
	}
	return &StoreFullError{Hosted: e.cfg.Hosted, Err: err}
}
