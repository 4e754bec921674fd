package agent

import (
	"context"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/join"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// joined is the job this agent joined (package join), as the run uses it.
type joined struct {
	rz join.Rendezvous
	// kv backs the control socket's KVSet/KVGet: the job-wide store, or
	// nil for the agent's in-memory one.
	kv control.KV
	// nodeLocalKV: the workers of other nodes cannot see kv, so they must
	// bootstrap through torch's store (DDP_AGENT_BOOTSTRAP=external).
	nodeLocalKV bool
	endpoint    string // the store, for logs and `ddp-agent status`
	// cli is the store's client (nil without a store), for the agent's
	// own reads of the job's status.
	cli   *store.Client
	close func()
}

// openRendezvous joins the job runID with the backend of
// Config.Rendezvous (join.Open).
func (a *Agent) openRendezvous(ctx context.Context, runID string) (*joined, error) {
	j, err := join.Open(ctx, a.cfg.Rendezvous,
		join.Node{JobID: runID, NProc: a.cfg.NProcPerNode, MaxRestarts: a.cfg.MaxRestarts, GPUs: a.nodeGPUs()}, a.log)
	if err != nil {
		return nil, err
	}
	out := &joined{rz: j.Rendezvous, nodeLocalKV: j.NodeLocalKV, endpoint: j.Endpoint, cli: j.Client, close: j.Close}
	if j.KV != nil { // a nil *store.KV must not become a non-nil control.KV
		out.kv = j.KV
	}
	return out, nil
}
