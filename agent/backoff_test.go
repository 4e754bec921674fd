package agent

import (
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/backoff"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/join"
)

// TestBackoffCapUnderStore: a node waiting out its backoff must not make
// the next round time out without it.
func TestBackoffCapUnderStore(t *testing.T) {
	a := &Agent{cfg: Config{Rendezvous: Rendezvous{Backend: join.Hosted, JoinTimeout: 20 * time.Second}}}
	if got := a.backoff().Max; got != 10*time.Second {
		t.Errorf("cap with a 20s join timeout: %v, want 10s", got)
	}
	a.cfg.Rendezvous.Backend = join.Standalone
	if got := a.backoff().Max; got != backoff.Max {
		t.Errorf("standalone cap: %v, want %v", got, backoff.Max)
	}
}
