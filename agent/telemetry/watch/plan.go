package watch

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/relay"
)

// Attempt is what Begin needs of an attempt that has just started.
type Attempt struct {
	Gen        uint64
	GroupRank  int    // this node's
	NNodes     int    // in this generation
	WorldSize  int    // ranks in the job
	RankOffset int    // the global rank of this node's local rank 0
	MasterAddr string // this generation's master: where the leader's relay is reached
	// Done is closed when the rendezvous round ends: a follower stops
	// waiting for the leader's relay address then.
	Done     <-chan struct{}
	Workers  []telemetry.Worker // this node's, by local rank
	StackDir string             // where the workers' ddp_agent writes its stacks
	// KV is the job-wide store the leader publishes its relay address in;
	// nil without one (each node then analyzes its own ranks).
	KV    control.KV
	JobID string
	Token string // --rdzv-token; "" derives the relay's token from the job id alone
}

// relayWait bounds a follower's wait for the leader's relay address; past
// it, the node analyzes its own ranks.
const relayWait = 10 * time.Second

// Begin starts watching an attempt. It decides who analyzes what: on a
// single node, or without a job-wide store, this agent its own ranks; with
// several nodes, the agent of group rank 0 (the leader) all of them, the
// others forwarding their records to it through package relay. It blocks
// at most relayWait (a follower waiting for the leader's address). End
// ends the attempt.
func (s *Watch) Begin(ctx context.Context, a Attempt) {
	s.start(a.Gen, s.plan(ctx, a), a.Workers, a.RankOffset, a.StackDir)
}

// analysis is who analyzes what in one attempt, and the func that ends
// this node's part of it (nil: nothing to end).
type analysis struct {
	base, size int
	fwd        forwarder
	asker      stackAsker
	done       func()
}

// leaderRelay is the leader's relay server, started on first need and
// kept for the agent's life (the leader may change between generations).
type leaderRelay struct {
	mu  sync.Mutex
	srv *relay.Server
}

func (l *leaderRelay) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.srv != nil {
		l.srv.Close()
	}
}

func (s *Watch) plan(ctx context.Context, a Attempt) analysis {
	local := analysis{base: a.RankOffset, size: len(a.Workers)}
	if a.NNodes <= 1 || a.KV == nil {
		return local
	}
	token := relay.JobToken(a.JobID, a.Token)
	key := a.JobID + "/" + strconv.FormatUint(a.Gen, 10) + "/ddp-agent/telemetry-leader"
	if a.GroupRank == 0 {
		return s.lead(ctx, a, key, token, local)
	}
	// Bounded, and cut short when the round ends (the leader failed to
	// start its workers, say): the caller has yet to watch the round.
	gctx, cancel := context.WithTimeout(ctx, relayWait)
	defer cancel()
	go func() {
		select {
		case <-a.Done:
			cancel()
		case <-gctx.Done():
		}
	}()
	addr, err := a.KV.Get(gctx, key)
	if err != nil {
		s.log.Warn("stall analysis of this node's ranks only: no relay address from the leader", "err", err)
		return local
	}
	host, _ := os.Hostname()
	cl, err := relay.Dial(gctx, relay.ClientConfig{Addr: string(addr), Node: relayNode(host, a.GroupRank), Token: token, Log: s.log})
	if err != nil {
		s.log.Warn("stall analysis of this node's ranks only: cannot reach the leader's relay", "addr", string(addr), "err", err)
		return local
	}
	hctx, stop := context.WithCancel(ctx)
	go s.answerHangs(hctx, cl)
	go s.sendStates(hctx, cl, a.Workers)
	return analysis{fwd: cl, done: func() { stop(); cl.Close() }}
}

// lead starts the leader's relay server, if it has none yet, and
// publishes its address for the followers.
func (s *Watch) lead(ctx context.Context, a Attempt, key, token string, local analysis) analysis {
	s.relay.mu.Lock()
	srv := s.relay.srv
	if srv == nil {
		var err error
		if srv, err = relay.Listen(net.JoinHostPort("", "0"), token, s, s.log); err != nil {
			s.relay.mu.Unlock()
			s.log.Warn("stall analysis of this node's ranks only: cannot listen for the other nodes' records", "err", err)
			return local
		}
		s.relay.srv = srv
	}
	s.relay.mu.Unlock()
	_, port, _ := net.SplitHostPort(srv.Addr())
	addr := net.JoinHostPort(a.MasterAddr, port)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.KV.Set(sctx, key, []byte(addr)); err != nil {
		s.log.Warn("stall analysis of this node's ranks only: cannot publish the relay address", "err", err)
		return local
	}
	return analysis{base: 0, size: a.WorldSize, asker: srv}
}

// relayNode names this node to the leader.
func relayNode(host string, groupRank int) string {
	if host == "" {
		host = "node"
	}
	return fmt.Sprintf("%s-g%d", host, groupRank)
}

// answerHangs is a follower's side of a hang: the leader asks for the
// stacks of its missing ranks, this node sends those of its own.
func (s *Watch) answerHangs(ctx context.Context, fwd forwarder) {
	for {
		select {
		case <-ctx.Done():
			return
		case h, ok := <-fwd.Hangs():
			if !ok {
				return
			}
			at := s.current()
			if at == nil || at.gen != h.Gen {
				continue
			}
			fwd.SendStacks(s.stacks(ctx, at, h.Missing))
		}
	}
}
