package rdzv

import (
	"errors"
	"fmt"
	"time"
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
