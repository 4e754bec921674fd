package rdzv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// Config configures one agent's side of an etcd rendezvous.
type Config struct {
	JobID  string
	Prefix string // Prefix(root, JobID)
	// Hosted: this agent started the store for this job, so the store
	// belongs to the job and an agent of another job is refused.
	Hosted bool
	// Keeper, when set, says whether this agent keeps the store up at the
	// end of the job, waiting for the others to leave first (with a
	// replicated store, the agent with the oldest member); nil: Hosted.
	Keeper func() bool
	// StoreTimeout: a store that answers no request for this long ends
	// the wait for a round with *StoreLostError; 0: DefaultStoreTimeout.
	StoreTimeout time.Duration
	// Endpoint names the store in messages.
	Endpoint string

	Host  string // hostname, for people
	Addr  string // address other nodes reach this one at
	NProc int
	GPUs  *NodeGPUs // published in the node entry; nil without NVML

	NNodesMin, NNodesMax int
	MaxRestarts          int
	Token                string // shared secret; "" = none

	JoinTimeout time.Duration // a round that does not reach NNodesMin in this time fails
	LastCall    time.Duration // after NNodesMin joined, how long to wait for more
	WaitingSaid time.Duration // how often a round short of NNodesMin says how many joined (default 30 s)
	TTL         time.Duration // lease TTL; keep-alives go every TTL/3
	MasterPort  int           // fixed workers' store port; 0 = a free one per round
	AgentStore  bool          // this agent serves the workers' store if it becomes group rank 0

	Logger *slog.Logger
}

// DefaultStoreTimeout is Config.StoreTimeout's default: a replicated
// store replaces a lost leader within about a second, so a store silent
// for this long has no quorum left.
const DefaultStoreTimeout = 10 * time.Second

// keeps reports whether this agent keeps the store up to the end.
func (c *Config) keeps() bool {
	if c.Keeper != nil {
		return c.Keeper()
	}
	return c.Hosted
}

// revokeTimeout bounds Close's revocation of the lease: a store that does
// not answer lets the lease expire on its own, as before.
const revokeTimeout = 2 * time.Second

// opTimeout bounds one request to the store, so an unreachable store is an
// error and never a hang.
const opTimeout = 10 * time.Second

// Membership is one agent's membership in a job's rendezvous. Open it, then call
// Next for every generation the agent runs workers in.
type Membership struct {
	cfg  Config
	cli  *clientv3.Client
	log  *slog.Logger
	node string // this agent's node id
	mac  string

	probe   net.Listener
	probeWG sync.WaitGroup
	// bg bounds what outlives a call: the rounds' watches. Close ends it.
	bg     context.Context
	stopBG context.CancelFunc

	mu      sync.Mutex
	lease   *nodeLease // nil until Open registers; replaced when lost
	state   NodeState
	jobDone bool // Succeed saw every member's workers finish: no one needs the store but to leave
	// waited: waitOthersGone ran to its end once (Succeed's); Drain's,
	// after it, would wait for the same agents again.
	waited  bool
	lastGen uint64 // the last generation this node ran, +1 (0: none yet)
	opened  time.Time
	// unanswered: when a request Fail sent, which the store left without
	// an answer, was sent; zero once the store answered one. Next's count
	// of the store's silence starts there (silence.go).
	unanswered time.Time
	storeLost  bool // Next gave up on the store
	offered    int  // OfferStore's port; 0 none
}

// Open joins the job's rendezvous: it checks that the store belongs to
// this job and the token matches, creates the job if this is its first
// agent, and registers this node on a fresh lease.
func Open(ctx context.Context, cli *store.Client, cfg Config) (*Membership, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Membership{cfg: cfg, cli: cli.Etcd(), log: cfg.Logger, node: newNodeID(cfg.Host), mac: tokenMAC(cfg.Token, cfg.JobID), state: NodeActive, opened: time.Now()}
	if err := e.checkHost(ctx); err != nil {
		return nil, err
	}
	if err := e.createOrCheckJob(ctx); err != nil {
		return nil, err
	}
	e.bg, e.stopBG = context.WithCancel(context.Background())
	l, err := net.Listen("tcp", net.JoinHostPort(cfg.Addr, "0"))
	if err != nil {
		return nil, fmt.Errorf("liveness probe listener on %s: %w", cfg.Addr, err)
	}
	e.probe = l
	e.probeWG.Add(1)
	go e.serveProbe()
	if err := e.register(ctx); err != nil {
		e.Close()
		return nil, err
	}
	e.log.Info("joined rendezvous", "job", cfg.JobID, "store", cfg.Endpoint, "node", e.node, "addr", cfg.Addr, "nnodes", fmt.Sprintf("%d:%d", cfg.NNodesMin, cfg.NNodesMax))
	return e, nil
}

// Node is this agent's node id.
func (e *Membership) Node() string { return e.node }

func newNodeID(host string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	h := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, host)
	if h == "" {
		h = "node"
	}
	return fmt.Sprintf("%s-%d-%s", h, os.Getpid(), hex.EncodeToString(b))
}

func (e *Membership) key(k string) string { return e.cfg.Prefix + k }

// Close stops keeping the lease alive, revokes it (waiting at most
// revokeTimeout) and closes the probe port. It does not close the client,
// which the caller owns.
//
// Revoking takes this node's entry out of the store at once instead of
// after the lease's TTL: the agent that keeps the store up waits, at the
// end of a job, until the other agents' entries are gone, and a finished
// multi-node job took the TTL plus a poll (7-10 s) to exit after "all
// workers succeeded". Peers of a job still running see the node gone at
// once too, as they would after the TTL.
func (e *Membership) Close() {
	e.stopBG()
	e.mu.Lock()
	l, done := e.lease, e.jobDone
	e.mu.Unlock()
	if l != nil {
		// The last agent out of a finished job skips it: the others are
		// gone, and with them the store's quorum.
		skip := done && e.cfg.keeps()
		select {
		case <-l.Done(): // expired, or the store is gone: nothing to revoke
			skip = true
		default:
		}
		if l.revoked.Load() { // by Leave
			skip = true
		}
		l.end()
		if !skip {
			ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
			if _, err := e.cli.Revoke(ctx, l.Lease()); err != nil {
				e.log.Debug("revoke lease at close", "err", err)
			}
			cancel()
		}
	}
	if e.probe != nil {
		e.probe.Close()
		e.probeWG.Wait()
	}
}
