// Package join joins this node to its job: it opens the rendezvous backend
// the command line chose (Backend), with what the etcd backends need
// around it: the embedded store hosted or dialed, its TLS, its replicas on
// other nodes. The agent calls Open once per run and uses what it returns
// (Joined) until Close; the rounds themselves are package rdzv's.
//
// It lives under agent/rdzv because it is the rendezvous' assembly: the
// etcd client and the store's members stay inside agent/rdzv, and the
// agent's root holds only the run loop. (A name like jobstore would fit
// only the two etcd backends: static and standalone have no store.)
package join

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// Backend is how this node meets the others of its job, chosen once from
// the command line (cmd/ddp-agent's runConfig).
type Backend int

const (
	// Static: ranks fixed by NodeRank and NNodesMax (--rdzv-backend
	// static, or no --rdzv-endpoint); no store, no elasticity. The zero
	// Backend.
	Static Backend = iota
	// Standalone: a single node that meets nobody (--standalone): no
	// store, its state and the workers' key-value store in the agent's
	// memory, a fresh loopback port for the workers' master every round.
	Standalone
	// Hosted: through an embedded etcd that one of the job's agents hosts
	// (c10d): the one Endpoints[0] names, or as IsHost says.
	Hosted
	// External: through an etcd the agent does not host (--rdzv-backend
	// etcd); its security is the user's.
	External
)

var backendNames = [...]string{Static: "static", Standalone: "standalone", Hosted: "hosted etcd", External: "external etcd"}

func (b Backend) String() string {
	if b < 0 || int(b) >= len(backendNames) {
		return fmt.Sprintf("Backend(%d)", int(b))
	}
	return backendNames[b]
}

// UsesStore reports whether the backend meets the other nodes through an
// etcd store (Hosted, External).
func (b Backend) UsesStore() bool { return b == Hosted || b == External }

// Config says how this node joins the job (agent.Rendezvous).
type Config struct {
	Backend   Backend
	Endpoints []string // the store's (Hosted, External); the first decides who hosts it
	IsHost    *bool    // Hosted: whether this agent hosts the store; nil: by address
	TLS       *store.TLSFiles

	NodeRank             int // Static only
	NNodesMin, NNodesMax int
	MasterAddr           string // Static only; "" is loopback
	MasterPort           int    // 0: a free port for every attempt
	LocalAddr            string // how the other nodes reach this one; "" is found
	Token                string // shared secret checked on join; "" none
	Prefix               string // where jobs live in the store
	JoinTimeout          time.Duration
	LastCall             time.Duration // wait for more nodes once MIN have joined
	TTL                  time.Duration // a silent node's lease
	// StoreTimeout: a store that answers nothing this long fails the
	// agent; 0: rdzv.DefaultStoreTimeout.
	StoreTimeout time.Duration
	// StoreQuota: the bytes a hosted store may hold; 0: etcd's default.
	StoreQuota int64
}

// Node is this node's part of the job, from the rest of the agent's
// configuration.
type Node struct {
	JobID       string // checked with rdzv.CheckID under a store
	NProc       int    // workers on this node
	MaxRestarts int
	GPUs        *rdzv.NodeGPUs // for the node's entry; nil without NVML
	// AgentStore: this agent serves the workers' store when its node is
	// group rank 0 (--spares); group rank 0's choice holds for the job.
	AgentStore bool
}

// Rendezvous is what a joined backend does: *rdzv.Static or *rdzv.Membership.
type Rendezvous interface {
	// Next blocks until this node is part of the job's next generation.
	Next(ctx context.Context) (*rdzv.Round, error)
	// Fail reports a local fault in round r; *rdzv.JobFailedError when no
	// restarts are left.
	Fail(ctx context.Context, r *rdzv.Round, reason string) error
	// Succeed reports that this node's workers of round r all finished.
	Succeed(ctx context.Context, r *rdzv.Round) error
	// Leave takes this node out of the job for good.
	Leave(reason string)
	// CheckPeers looks for another node whose agent is gone, and ends the
	// round with it lost when one is; it reports whether one was, or
	// whether it could not tell.
	CheckPeers(ctx context.Context) rdzv.PeerCheck
	// OfferStore makes this node's next joins offer port for the
	// workers' store, should it become group rank 0: the store it serves
	// already, to workers that carry on into the next round; 0 goes back
	// to the configured port, or a free one.
	OfferStore(port int)
	// Running is whether the job has a generation running, which this
	// node's join would end (the members stop to take it in).
	Running(ctx context.Context) (bool, error)
	// OthersDone waits up to d for every other node of round r to have
	// finished its workers, and reports whether they all have.
	OthersDone(ctx context.Context, r *rdzv.Round, d time.Duration) bool
}

// Joined is an open rendezvous and what goes with it; the caller owns it
// and calls Close once.
type Joined struct {
	Rendezvous Rendezvous
	// KV is the job-wide store for the workers' key-value requests; nil
	// without a store (the agent keeps one in memory).
	KV *store.KV
	// NodeLocalKV: the workers of other nodes cannot see the agent's
	// in-memory store, so they must bootstrap through torch's store
	// (DDP_AGENT_BOOTSTRAP=external).
	NodeLocalKV bool
	Endpoint    string        // the store, for logs and `ddp-agent status`; "" none
	Client      *store.Client // the store's client, for the agent's own reads; nil none
	// Replicated: this agent takes part in keeping the embedded store's
	// members (it starts one when the store has too few).
	Replicated bool
	close      func()
}

// Close leaves the store: it drains the rendezvous, hands this agent's
// store member over and closes the client, within about 25 seconds.
func (j *Joined) Close() { j.close() }

// Open joins the job as node, with the backend cfg chose. Under a store it
// blocks while it hosts or dials it: a store hosted by another agent not
// up yet is retried for cfg.JoinTimeout. ctx bounds the opening only.
//
// --standalone once hosted an embedded etcd on loopback too. A store for
// one node buys nothing (no other node reads it; `ddp-agent status` is for
// multi-node jobs) and its timers kept an idle agent at 0.9 % of a core,
// against torchrun's 0.1 % (docs/benchmarks.md): the node's state and the
// workers' key-value store live in the agent's memory instead.
func Open(ctx context.Context, cfg Config, node Node, log *slog.Logger) (*Joined, error) {
	switch cfg.Backend {
	case Static, Standalone:
		return &Joined{
			Rendezvous: &rdzv.Static{NodeRank: cfg.NodeRank, NNodes: cfg.NNodesMax, NProc: node.NProc,
				MaxRestarts: node.MaxRestarts, MasterAddr: masterAddr(cfg), MasterPort: cfg.MasterPort,
				AgentStore: node.AgentStore},
			NodeLocalKV: cfg.NNodesMax > 1,
			close:       func() {},
		}, nil
	case Hosted, External:
		return (&opener{cfg: cfg, node: node, log: log, lookupIP: net.LookupIP}).open(ctx)
	}
	return nil, fmt.Errorf("join job %q: unknown rendezvous backend %v", node.JobID, cfg.Backend)
}

// newKV is the workers' key-value store in the job's store: kept bounded
// when the job's agents host it; an etcd of the user's is compacted as its
// owner chose.
func newKV(b Backend, cli *store.Client, prefix string) *store.KV {
	if b == Hosted {
		return store.NewHostedKV(cli, prefix)
	}
	return store.NewKV(cli, prefix)
}

func masterAddr(cfg Config) string {
	if cfg.MasterAddr != "" {
		return cfg.MasterAddr
	}
	return "127.0.0.1"
}

// findStore hosts the store or dials it; it hosts it after all when the
// endpoint's name comes to resolve to this host while it dials
// (dialStore). The member it started, if any, is returned even with an
// error, for the caller to close.
func (o *opener) findStore(ctx context.Context, sec *storeSecurity, replicated bool) (*store.Server, []string, *store.Client, error) {
	for {
		srv, endpoints, taken, err := o.hostStore(ctx, sec, replicated)
		if err != nil {
			return srv, nil, nil, err
		}
		cli, err := o.dialStore(ctx, endpoints, srv != nil, taken, sec.client)
		if errors.Is(err, errHostItNow) {
			o.log.Info("the rendezvous endpoint resolves to this host now; hosting the store", "endpoint", endpoints[0])
			continue
		}
		return srv, endpoints, cli, err
	}
}

// handOverTimeout bounds handing this agent's store member over as it
// leaves a running job; finishedHandOverTimeout when its own workers
// finished, where a store that does not answer has most likely lost the
// members of agents that finished and left.
const (
	handOverTimeout         = 10 * time.Second
	finishedHandOverTimeout = 3 * time.Second
)

// opener opens an etcd backend.
type opener struct {
	cfg  Config
	node Node
	log  *slog.Logger
	// lookupIP resolves the endpoint's host (net.LookupIP; a test's name
	// that resolves only after a while).
	lookupIP func(host string) ([]net.IP, error)
}

func (o *opener) open(ctx context.Context) (*Joined, error) {
	cfg := o.cfg
	if err := rdzv.CheckID(o.node.JobID); err != nil {
		return nil, err
	}
	if cfg.Token == "" && cfg.NNodesMax > 1 {
		// As torchrun's store allows; said once, so nobody believes otherwise.
		o.log.Warn("no --rdzv-token: anyone who can reach the rendezvous store can read this job's keys and disrupt it " +
			"(stop its workers, end it); set --rdzv-token on every node, and use TLS (--rdzv-conf) across untrusted networks")
	}
	sec, err := o.storeSecurity()
	if err != nil {
		return nil, err
	}
	// What is open so far, closed in reverse on a failure and at the end:
	// the manager hands this agent's member over (closing it) before the
	// client it speaks through goes.
	var (
		srv  *store.Server
		cli  *store.Client
		reps *store.Replicas
	)
	closeAll := func(jobDone bool, handOver time.Duration) {
		member := srv
		switch {
		case reps != nil && jobDone:
			// Every node is done: nobody needs the store but to leave it,
			// and handing members over concurrently is what stalls.
			member = reps.Stop()
		case reps != nil:
			ctx, cancel := context.WithTimeout(context.Background(), handOver)
			var err error
			if member, err = reps.HandOver(ctx); err != nil {
				o.log.Info("store member not handed over; the others replace it once its lease ends", "err", err)
			}
			cancel()
		}
		// The client before the member: a member closed while this
		// client's watches are open waits etcd's request timeout (~6 s)
		// for them, and a finished job's exit waited with it.
		if cli != nil {
			cli.Close()
		}
		switch {
		case member != nil && jobDone:
			member.CloseNow()
		case member != nil:
			member.Close()
		}
		sec.close()
	}
	fail := func(err error) (*Joined, error) {
		closeAll(false, handOverTimeout)
		return nil, err
	}
	replicated := cfg.Backend == Hosted && cfg.NNodesMax >= storeReplicas
	var endpoints []string
	if srv, endpoints, cli, err = o.findStore(ctx, sec, replicated); err != nil {
		return fail(err)
	}
	if cfg.Backend == Hosted && srv == nil {
		// The agent that hosts the store chose by its --nnodes whether
		// the store takes members; that choice is the job's, as its
		// other settings are, whatever this agent's flags say.
		if replicated, err = cli.Replicable(ctx); err != nil {
			return fail(err)
		}
	}
	addr, err := o.localAddr(endpoints[0])
	if err != nil {
		return fail(err)
	}
	prefix := rdzv.Prefix(cfg.Prefix, o.node.JobID)
	var keeper func() bool
	if replicated {
		if reps, err = o.replicate(cli, srv, sec, prefix, addr); err != nil {
			return fail(err)
		}
		keeper = reps.Keeper
	}
	host, _ := os.Hostname()
	e, err := rdzv.Open(ctx, cli, rdzv.Config{
		JobID: o.node.JobID, Prefix: prefix, Hosted: srv != nil, Keeper: keeper, Endpoint: strings.Join(endpoints, ","),
		Host: host, Addr: addr, NProc: o.node.NProc, GPUs: o.node.GPUs,
		NNodesMin: cfg.NNodesMin, NNodesMax: cfg.NNodesMax, MaxRestarts: o.node.MaxRestarts, Token: cfg.Token,
		JoinTimeout: cfg.JoinTimeout, LastCall: cfg.LastCall, TTL: cfg.TTL, MasterPort: cfg.MasterPort,
		AgentStore: o.node.AgentStore, StoreTimeout: cfg.StoreTimeout, Logger: o.log,
	})
	if err != nil {
		return fail(err)
	}
	return &Joined{
		Rendezvous: e,
		KV:         newKV(cfg.Backend, cli, rdzv.KVPrefix(prefix)),
		Endpoint:   strings.Join(endpoints, ","),
		Client:     cli,
		Replicated: replicated,
		close: func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			e.Drain(ctx)
			cancel()
			e.Close()
			handOver := handOverTimeout
			if e.Succeeded() {
				// Its workers finished but it saw not every node's finish:
				// the others may have left already, their members with them.
				handOver = finishedHandOverTimeout
			}
			// A store that answered nothing for the store timeout takes
			// no handover: trying cost the agent's exit 3 s more.
			closeAll(e.JobDone() || e.StoreLost(), handOver)
		},
	}, nil
}
