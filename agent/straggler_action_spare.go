package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
)

// jobStatus reads the job as `ddp-agent status` would show it, through
// the session's store client (which follows the store's members and
// carries the job's certificates); these reads are rare (a drain's spare
// count, a follower's look every few seconds under --straggler-action
// drain).
func (a *Agent) jobStatus(ctx context.Context, s *session) (*rdzv.Status, error) {
	if s.j.cli == nil {
		return nil, errors.New("no rendezvous store to read the job from")
	}
	return rdzv.ReadStatus(ctx, s.j.cli, a.cfg.Rendezvous.Prefix, s.runID)
}

// countSpares counts the nodes that wait in the job's rendezvous as
// spares (live, not members of the running generation: the job was full
// when they came), as `ddp-agent status` would show them.
func (a *Agent) countSpares(ctx context.Context, s *session) (int, error) {
	st, err := a.jobStatus(ctx, s)
	if err != nil {
		return 0, fmt.Errorf("count spares: %w", err)
	}
	n := 0
	for _, ns := range st.Nodes {
		if ns.Role == rdzv.RoleSpare {
			n++
		}
	}
	return n, nil
}
