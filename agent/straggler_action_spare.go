package agent

import (
	"context"
	"fmt"
	"strings"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// jobStatus reads the job as `ddp-agent status` would show it, through
// a client of its own for this one read: the rendezvous keeps its client
// to itself, and these reads are rare (a drain's spare count, a follower's
// look every few seconds under --straggler-action drain).
func (a *Agent) jobStatus(ctx context.Context, s *session) (*rdzv.Status, error) {
	cfg := a.cfg.Rendezvous
	cli, err := store.Dial(ctx, store.ClientConfig{Endpoints: strings.Split(s.j.endpoint, ","), TLS: cfg.TLS, Logger: a.log})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	return rdzv.ReadStatus(ctx, cli, cfg.Prefix, s.runID)
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
