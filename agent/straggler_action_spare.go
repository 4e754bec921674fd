package agent

import (
	"context"
	"fmt"
	"strings"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// countSpares counts the nodes that wait in the job's rendezvous as
// spares (live, not members of the running generation: the job was full
// when they came), as `ddp-agent status` would show them. It reads the
// store through a client of its own: the rendezvous keeps its client to
// itself, and this read happens once, for a drain.
func (a *Agent) countSpares(ctx context.Context, s *session) (int, error) {
	cfg := a.cfg.Rendezvous
	cli, err := store.Dial(ctx, store.ClientConfig{Endpoints: strings.Split(s.j.endpoint, ","), TLS: cfg.TLS, Logger: a.log})
	if err != nil {
		return 0, fmt.Errorf("count spares: %w", err)
	}
	defer cli.Close()
	st, err := rdzv.ReadStatus(ctx, cli, cfg.Prefix, s.runID)
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
