package watch

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

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
	KV    KV
	JobID string
	Token string // --rdzv-token; "": the leader's relay makes a random secret and publishes it in KV
}

// KV is the job-wide store the relay plan uses: the agent's control.KV,
// or a sidecar's endpoint carried through its workers.
type KV interface {
	// Set stores value under key.
	Set(ctx context.Context, key string, value []byte) error
	// Get blocks until key exists or ctx is done.
	Get(ctx context.Context, key string) ([]byte, error)
}

// relayWait bounds a follower's wait for the leader's relay address; past
// it, the node analyzes its own ranks.
const relayWait = 10 * time.Second

// plan is this node's part in one attempt's analysis: the ranks it
// analyzes, [base, base+size), or where it forwards its records instead
// (fwd, on a follower); asker (on the leader) asks the followers for
// their stacks; done ends this node's part (nil: nothing to end).
type plan struct {
	base, size int
	fwd        forwarder
	asker      stackAsker
	done       func()
}

// planner decides who analyzes what in each attempt, across nodes, and
// runs this node's side of it: the leader's relay server, or a follower's
// connection to the leader (its records, its workers' states, its stacks
// for the leader's hangs). It lives as long as the Watch; its funcs are
// the Watch's, so that it can be tested without one.
type planner struct {
	log *slog.Logger
	// handler takes what the followers send the leader.
	handler relay.Handler
	// stacks is a follower's answer to the leader's hang h: this node's
	// Python stacks among h's missing ranks; false when h is of no
	// attempt running here.
	stacks func(ctx context.Context, h telemetry.Hang) (map[int]string, bool)
	// states is ws, workers of this node, with their GPU and host
	// evidence read now; nil when there is none to read.
	states func(ws []telemetry.Worker) []telemetry.Worker
	// onRemote, if set, is told of the leader's hang once this node's
	// stacks for it are sent (Config.OnRemoteHang).
	onRemote func(telemetry.Hang)
	relay    leaderRelay // the leader's relay server, once needed
}

// leaderRelay is the leader's relay server, started on first need and
// kept for the agent's life (the leader may change between generations,
// and this agent lead again), unless a later generation has this node
// reached at another address: the server then moves there.
type leaderRelay struct {
	mu  sync.Mutex
	srv *relay.Server
	ep  relay.Endpoint // what it publishes: its address, certificate fingerprint and, without --rdzv-token, its secret
}

func (l *leaderRelay) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.srv != nil {
		l.srv.Close()
	}
}

// serve returns the server listening on host, starting it (and stopping
// one on another address) if need be, and what to publish for it.
func (l *leaderRelay) serve(host, jobID, rdzvToken string, h relay.Handler, log *slog.Logger) (*relay.Server, relay.Endpoint, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.srv != nil {
		if cur, _, _ := net.SplitHostPort(l.srv.Addr()); cur == host {
			return l.srv, l.ep, nil
		}
		log.Info("relay: this node is now reached at another address; moving the relay there", "from", l.srv.Addr(), "to", host)
		l.srv.Close()
		l.srv, l.ep = nil, relay.Endpoint{}
	}
	// A secret per server: a random one is never reused at a new address.
	token, publish := relay.LeaderToken(jobID, rdzvToken)
	srv, err := relay.Listen(net.JoinHostPort(host, "0"), token, h, log)
	if err != nil {
		return nil, relay.Endpoint{}, err
	}
	ep := relay.Endpoint{Addr: srv.Addr(), Fingerprint: srv.Fingerprint()}
	secret := "derived from --rdzv-token"
	if publish {
		ep.Secret, secret = token, "random, published in the store"
	}
	log.Info("relay: listening for the other nodes' records (HTTPS)", "addr", ep.Addr, "fingerprint", ep.Fingerprint, "secret", secret)
	l.srv, l.ep = srv, ep
	return srv, ep, nil
}

// LeaderKey is where the leader publishes its relay endpoint for
// generation gen. Not under "<job>/<gen>/", where the workers' own keys
// live (package control scopes them there): a worker must not be able to
// read the secret or point the followers elsewhere.
func LeaderKey(job string, gen uint64) string {
	return job + "/_agent/" + strconv.FormatUint(gen, 10) + "/telemetry-leader"
}

// plan decides this node's part in attempt a: on a single node, or
// without a job-wide store, it analyzes its own ranks; with several
// nodes, the agent of group rank 0 (the leader) analyzes all of them, the
// others forwarding their records to it through package relay. Anything
// that fails on the way leaves a node analyzing its own ranks. It blocks
// at most relayWait (a follower waiting for the leader's address).
func (p *planner) plan(ctx context.Context, a Attempt) plan {
	local := plan{base: a.RankOffset, size: len(a.Workers)}
	if a.NNodes <= 1 || a.KV == nil {
		return local
	}
	key := LeaderKey(a.JobID, a.Gen)
	if a.GroupRank == 0 {
		return p.lead(ctx, a, key, local)
	}
	return p.follow(ctx, a, key, local)
}

// follow reads the leader's endpoint and dials it; failing that, this
// node analyzes its own ranks.
func (p *planner) follow(ctx context.Context, a Attempt, key string, local plan) plan {
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
	raw, err := a.KV.Get(gctx, key)
	if err != nil {
		p.log.Warn("stall analysis of this node's ranks only: no relay address from the leader", "err", err)
		return local
	}
	ep, err := relay.DecodeEndpoint(raw)
	if err != nil {
		p.log.Warn("stall analysis of this node's ranks only: the leader's relay endpoint in the store is malformed", "key", key, "err", err)
		return local
	}
	token, err := relay.FollowerToken(ep, a.JobID, a.Token)
	if err != nil {
		p.log.Warn("stall analysis of this node's ranks only", "addr", ep.Addr, "err", err)
		return local
	}
	host, _ := os.Hostname()
	cl, err := relay.Dial(gctx, relay.ClientConfig{Addr: ep.Addr, Fingerprint: ep.Fingerprint, Node: relayNode(host, a.GroupRank),
		Token: token, Log: p.log})
	if err != nil {
		p.log.Warn("stall analysis of this node's ranks only: cannot reach the leader's relay", "addr", ep.Addr, "err", err)
		return local
	}
	hctx, stop := context.WithCancel(ctx)
	go p.answerHangs(hctx, cl)
	go p.sendStates(hctx, cl, a.Workers)
	return plan{fwd: cl, done: func() { stop(); cl.Close() }}
}

// lead starts the leader's relay server on the address the agents use
// for the rendezvous, if it has none there yet, and publishes its
// endpoint for the followers.
func (p *planner) lead(ctx context.Context, a Attempt, key string, local plan) plan {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a host name to resolve: Begin must not block long
	host, err := relay.BindHost(rctx, a.MasterAddr)
	cancel()
	if err != nil {
		p.log.Warn("stall analysis of this node's ranks only: no address to listen on for the other nodes' records", "err", err)
		return local
	}
	srv, ep, err := p.relay.serve(host, a.JobID, a.Token, p.handler, p.log)
	if err != nil {
		p.log.Warn("stall analysis of this node's ranks only: cannot listen for the other nodes' records", "err", err)
		return local
	}
	value, err := ep.Encode()
	if err != nil {
		p.log.Warn("stall analysis of this node's ranks only: cannot publish the relay address", "err", err)
		return local
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.KV.Set(sctx, key, value); err != nil {
		p.log.Warn("stall analysis of this node's ranks only: cannot publish the relay address", "err", err)
		return local
	}
	return plan{base: 0, size: a.WorldSize, asker: srv}
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
func (p *planner) answerHangs(ctx context.Context, fwd forwarder) {
	for {
		select {
		case <-ctx.Done():
			return
		case h, ok := <-fwd.Hangs():
			if !ok {
				return
			}
			stacks, ok := p.stacks(ctx, h)
			if !ok {
				continue
			}
			fwd.SendStacks(stacks)
			if p.onRemote != nil {
				p.onRemote(h)
			}
		}
	}
}

// stateEvery is how often a follower sends its workers' GPU and host
// states.
const stateEvery = 10 * time.Second

// sendStates is a follower's side of persistent stragglers: the leader
// cannot read this node's NVML or /proc, so the workers go to it again
// every stateEvery with their GPUs' states and slowdowns, until ctx ends.
func (p *planner) sendStates(ctx context.Context, fwd forwarder, local []telemetry.Worker) {
	if p.states == nil {
		return
	}
	t := time.NewTicker(stateEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fwd.SendWorkers(p.states(slices.Clone(local)))
	}
}
