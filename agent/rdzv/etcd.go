package rdzv

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Config configures one agent's side of an etcd rendezvous.
type Config struct {
	JobID  string
	Prefix string // Prefix(root, JobID)
	// Hosted: this agent started the store for this job, so the store
	// belongs to the job and an agent of another job is refused.
	Hosted bool
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
	TTL         time.Duration // lease TTL; keep-alives go every TTL/3
	MasterPort  int           // fixed workers' store port; 0 = a free one per round

	Logger *slog.Logger
}

// opTimeout bounds one request to the store, so an unreachable store is an
// error and never a hang.
const opTimeout = 10 * time.Second

// Etcd is one agent's membership in a job's rendezvous. Open it, then call
// Next for every generation the agent runs workers in.
type Etcd struct {
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

	mu        sync.Mutex
	lease     clientv3.LeaseID
	leaseLost chan struct{} // closed when lease is lost
	stopKA    context.CancelFunc
	state     NodeState
	lastGen   uint64 // the last generation this node ran, +1 (0: none yet)
	opened    time.Time
}

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

// Open joins the job's rendezvous: it checks that the store belongs to
// this job and the token matches, creates the job if this is its first
// agent, and registers this node on a fresh lease.
func Open(ctx context.Context, cli *clientv3.Client, cfg Config) (*Etcd, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Etcd{cfg: cfg, cli: cli, log: cfg.Logger, node: newNodeID(cfg.Host), mac: tokenMAC(cfg.Token, cfg.JobID), state: NodeActive, opened: time.Now()}
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
func (e *Etcd) Node() string { return e.node }

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

func tokenMAC(token, id string) string {
	if token == "" {
		return ""
	}
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("ddp-agent rendezvous " + id))
	return hex.EncodeToString(m.Sum(nil))
}

func (e *Etcd) key(k string) string { return e.cfg.Prefix + k }

func (e *Etcd) checkHost(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if e.cfg.Hosted {
		txn, err := e.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(HostKey), "=", 0)).
			Then(clientv3.OpPut(HostKey, e.cfg.JobID)).
			Else(clientv3.OpGet(HostKey)).Commit()
		if err != nil {
			return fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
		}
		if txn.Succeeded {
			return nil
		}
		if kvs := txn.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 && string(kvs[0].Value) != e.cfg.JobID {
			return &ForeignJobError{Endpoint: e.cfg.Endpoint, Hosted: string(kvs[0].Value), Mine: e.cfg.JobID}
		}
		return nil
	}
	resp, err := e.cli.Get(ctx, HostKey)
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	if len(resp.Kvs) > 0 && string(resp.Kvs[0].Value) != e.cfg.JobID {
		return &ForeignJobError{Endpoint: e.cfg.Endpoint, Hosted: string(resp.Kvs[0].Value), Mine: e.cfg.JobID}
	}
	return nil
}

func (e *Etcd) createOrCheckJob(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	now := time.Now()
	job := JobInfo{ID: e.cfg.JobID, Created: now, NNodesMin: e.cfg.NNodesMin, NNodesMax: e.cfg.NNodesMax, MaxRestarts: e.cfg.MaxRestarts, TokenMAC: e.mac}
	st := State{Generation: 0, Phase: Joining, Reason: "job created", Since: now, MaxRestarts: e.cfg.MaxRestarts}
	txn, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.key(jobKey)), "=", 0)).
		Then(clientv3.OpPut(e.key(jobKey), encode(job)), clientv3.OpPut(e.key(stateKey), encode(st))).
		Else(clientv3.OpGet(e.key(jobKey))).Commit()
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: create job: %w", e.cfg.Endpoint, err)
	}
	if txn.Succeeded {
		e.log.Info("created job in rendezvous store", "job", e.cfg.JobID, "max_restarts", e.cfg.MaxRestarts)
		return nil
	}
	kvs := txn.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return fmt.Errorf("rendezvous store at %s: job %q vanished while joining", e.cfg.Endpoint, e.cfg.JobID)
	}
	var have JobInfo
	if err := decode(e.key(jobKey), kvs[0].Value, &have); err != nil {
		return fmt.Errorf("refused: %w", err)
	}
	if have.NNodesMin < 1 || have.NNodesMax < have.NNodesMin || have.MaxRestarts < 0 {
		return fmt.Errorf("refused: malformed value at %s: nnodes %d:%d, max_restarts %d", e.key(jobKey), have.NNodesMin, have.NNodesMax, have.MaxRestarts)
	}
	if !hmac.Equal([]byte(have.TokenMAC), []byte(e.mac)) {
		return ErrTokenMismatch
	}
	if have.NNodesMin != e.cfg.NNodesMin || have.NNodesMax != e.cfg.NNodesMax || have.MaxRestarts != e.cfg.MaxRestarts {
		e.log.Warn("this agent's settings differ from the job's; the job's apply",
			"job_nnodes", fmt.Sprintf("%d:%d", have.NNodesMin, have.NNodesMax), "job_max_restarts", have.MaxRestarts,
			"nnodes", fmt.Sprintf("%d:%d", e.cfg.NNodesMin, e.cfg.NNodesMax), "max_restarts", e.cfg.MaxRestarts)
		e.cfg.NNodesMin, e.cfg.NNodesMax, e.cfg.MaxRestarts = have.NNodesMin, have.NNodesMax, have.MaxRestarts
	}
	return nil
}

// serveProbe accepts and closes connections: while the agent lives its
// probe port accepts; once the process is gone the kernel refuses, which
// tells a round's leader the node is dead long before its lease expires.
func (e *Etcd) serveProbe() {
	defer e.probeWG.Done()
	for {
		c, err := e.probe.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

// register puts this node's entry on a fresh lease and keeps it alive.
func (e *Etcd) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	ttl := int64((e.cfg.TTL + time.Second - 1) / time.Second)
	g, err := e.cli.Grant(ctx, max(ttl, 1))
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: grant lease: %w", e.cfg.Endpoint, err)
	}
	// The node key goes in first: a lease that is kept alive without its
	// node key would make a node nobody can see die.
	if err := e.putNodeOn(ctx, g.ID, NodeActive, ""); err != nil {
		revokeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = e.cli.Revoke(revokeCtx, g.ID)
		cancel()
		return err
	}
	kaCtx, stopKA := context.WithCancel(context.Background())
	ka, err := e.cli.KeepAlive(kaCtx, g.ID)
	if err != nil {
		stopKA()
		return fmt.Errorf("rendezvous store at %s: keep lease alive: %w", e.cfg.Endpoint, err)
	}
	lost := make(chan struct{})
	e.mu.Lock()
	if e.stopKA != nil {
		e.stopKA()
	}
	e.lease, e.leaseLost, e.stopKA = g.ID, lost, stopKA
	e.mu.Unlock()
	go func() {
		for range ka { // the client closes ka when the lease expires or cannot be renewed in time
		}
		close(lost)
		e.mu.Lock()
		leaving := e.state != NodeActive
		e.mu.Unlock()
		if kaCtx.Err() == nil && !leaving {
			e.log.Warn("lost this node's lease on the rendezvous store", "store", e.cfg.Endpoint, "lease", fmt.Sprintf("%x", int64(g.ID)))
		}
	}()
	return nil
}

// markLeaseLost makes the current lease count as lost, for when the store
// says it no longer exists before the keep-alive loop noticed.
func (e *Etcd) markLeaseLost() {
	e.mu.Lock()
	stop := e.stopKA
	e.mu.Unlock()
	if stop != nil {
		stop() // ends the keep-alive loop, which closes leaseLost
	}
}

func (e *Etcd) putNode(ctx context.Context, st NodeState, reason string) error {
	lease, _ := e.leaseChan()
	return e.putNodeOn(ctx, lease, st, reason)
}

func (e *Etcd) putNodeOn(ctx context.Context, lease clientv3.LeaseID, st NodeState, reason string) error {
	info := NodeInfo{Node: e.node, Host: e.cfg.Host, Addr: e.cfg.Addr, PID: os.Getpid(), NProc: e.cfg.NProc,
		Lease: int64(lease), Probe: e.probe.Addr().String(), State: st, Reason: reason, Started: time.Now(), GPUs: e.cfg.GPUs}
	_, err := e.cli.Put(ctx, e.key(nodesDir+e.node), encode(info), clientv3.WithLease(lease))
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: register node: %w", e.cfg.Endpoint, err)
	}
	return nil
}

// leaseChan returns the channel closed when the current lease is lost.
func (e *Etcd) leaseChan() (clientv3.LeaseID, <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lease, e.leaseLost
}

// ensureLease registers again after the lease was lost (store restarted,
// node cut off for longer than the TTL): same node id, new lease.
func (e *Etcd) ensureLease(ctx context.Context) error {
	_, lost := e.leaseChan()
	select {
	case <-lost:
	default:
		return nil
	}
	e.log.Info("registering again with the rendezvous store", "store", e.cfg.Endpoint)
	return e.register(ctx)
}

// readState returns the job's state, its mod revision (for compare-and-
// swap) and the revision it was read at (to watch from: the mod revision
// may be compacted away long before). A malformed
// state (a person or tool wrote garbage) is replaced by a fresh Joining
// state, so the job recovers instead of every agent failing on it.
func (e *Etcd) readState(ctx context.Context) (*State, int64, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.key(stateKey))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("rendezvous store at %s: read state: %w", e.cfg.Endpoint, err)
	}
	if len(resp.Kvs) == 0 {
		return e.resetState(ctx, 0, fmt.Sprintf("state key %s was missing", e.key(stateKey)), resp.Header.Revision)
	}
	kv := resp.Kvs[0]
	var st State
	if err := decode(e.key(stateKey), kv.Value, &st); err != nil || st.check() != nil {
		if err == nil {
			err = fmt.Errorf("malformed value at %s: %w", e.key(stateKey), st.check())
		}
		e.log.Error("rendezvous state is malformed; starting a new generation", "err", err)
		return e.resetState(ctx, kv.ModRevision, err.Error(), resp.Header.Revision)
	}
	return &st, kv.ModRevision, resp.Header.Revision, nil
}

// check rejects a state that parses but that no agent wrote: the members
// must have the ranks 0..n-1 once each, and at least one worker.
func (st *State) check() error {
	if !st.Phase.valid() {
		return fmt.Errorf("unknown phase %q", st.Phase)
	}
	if st.Failures < 0 || st.MaxRestarts < 0 {
		return fmt.Errorf("negative failures or max_restarts")
	}
	seen := make([]bool, len(st.Members))
	for _, m := range st.Members {
		if m.GroupRank < 0 || m.GroupRank >= len(st.Members) || seen[m.GroupRank] || m.NProc < 1 || m.Node == "" {
			return fmt.Errorf("bad member %+v", m)
		}
		seen[m.GroupRank] = true
	}
	if st.Phase == Running && st.Nodes() == 0 {
		return fmt.Errorf("running with no members")
	}
	if st.NNodes < 0 || (st.NNodes > 0 && (st.MembersKey == "" || st.AssignPrefix == "")) {
		return fmt.Errorf("nnodes %d without its member keys", st.NNodes)
	}
	return nil
}

func (p Phase) valid() bool {
	switch p {
	case Joining, Running, Failed, Succeeded:
		return true
	}
	return false
}

func (e *Etcd) resetState(ctx context.Context, modRev int64, reason string, storeRev int64) (*State, int64, int64, error) {
	// Every generation was written at a revision at least as high as the
	// generation number, so one above the store's revision is new to all.
	st := State{Generation: uint64(storeRev) + 1, Phase: Joining, Reason: reason, Since: time.Now(), MaxRestarts: e.cfg.MaxRestarts}
	// (a missing key compares as mod revision 0)
	txn, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(e.key(stateKey)), "=", modRev)).
		Then(clientv3.OpPut(e.key(stateKey), encode(st))).Commit()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("rendezvous store at %s: reset state: %w", e.cfg.Endpoint, err)
	}
	if !txn.Succeeded {
		return e.readState(ctx)
	}
	return &st, txn.Header.Revision, txn.Header.Revision, nil
}

func (e *Etcd) lastGenSeen() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastGen
}

// Next blocks until this node is a member of a closed round, and returns
// the round. It joins the open round, or asks for one when the job runs
// without this node and has room (a rescale), or waits as a spare when the
// job is full. It fails with *JoinTimeoutError when too few nodes come
// within the join timeout, *JobFailedError when the job failed, and
// ErrJobSucceeded when the job is over.
func (e *Etcd) Next(ctx context.Context) (*Round, error) {
	deadline := time.Now().Add(e.cfg.JoinTimeout)
	spare := false
	// retry waits a moment after a store error, unless the deadline passed.
	retry := func(err error) error {
		if time.Now().After(deadline) {
			return err
		}
		e.log.Warn("rendezvous store request failed; retrying", "err", err)
		if !sleep(ctx, 500*time.Millisecond) {
			return context.Cause(ctx)
		}
		return nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, context.Cause(ctx)
		}
		if err := e.ensureLease(ctx); err != nil {
			if err := retry(err); err != nil {
				return nil, err
			}
			continue
		}
		st, rev, read, err := e.readState(ctx)
		if err != nil {
			if err := retry(err); err != nil {
				return nil, err
			}
			continue
		}
		switch st.Phase {
		case Failed, Succeeded:
			if e.lastGenSeen() == 0 && st.Since.Before(e.opened) {
				// This agent never ran in this job, which ended before it
				// came: a new run reusing the id of one that ended.
				fresh, err := e.restartEndedJob(ctx, st, rev)
				if err != nil {
					if err := retry(err); err != nil {
						return nil, err
					}
					continue
				}
				if fresh {
					continue
				}
			}
			if st.Phase == Failed {
				return nil, &JobFailedError{Reason: st.Reason}
			}
			return nil, ErrJobSucceeded
		case Running:
			me, member, err := e.assignment(ctx, st, e.node)
			if err != nil {
				if err := retry(err); err != nil {
					return nil, err
				}
				continue
			}
			if member && st.Generation >= e.lastGenSeen() {
				return e.startRound(st, me, rev, read), nil
			}
			var bumpErr error
			switch {
			case member:
				// This node ran this generation and lost it (its lease
				// expired) before anyone moved the job on.
				_, bumpErr = e.bump(ctx, st.Generation, fmt.Sprintf("node %s lost its lease and rejoined", e.node), true)
			case st.Nodes() < e.cfg.NNodesMax:
				_, bumpErr = e.bump(ctx, st.Generation, fmt.Sprintf("node %s (%s) joined; scaling up from %d nodes", e.node, e.cfg.Host, st.Nodes()), false)
			default:
				// A full job whose members are gone (a run killed without
				// leaving, whose leases ran out) must not keep spares out.
				gone, err := e.missingMembers(ctx, st)
				if err != nil {
					bumpErr = err
					break
				}
				if len(gone) > 0 {
					m := gone[0]
					_, bumpErr = e.bump(ctx, st.Generation, fmt.Sprintf("node %s (%s, group rank %d) lost: its agent is gone or cut off (lease ended)", m.Node, m.Host, m.GroupRank), true)
					break
				}
				if !spare {
					e.log.Info("the job is full; standing by as a spare", "generation", st.Generation, "nodes", st.Nodes())
					spare = true
				}
				deadline = time.Now().Add(e.cfg.JoinTimeout) // a spare of a healthy job waits as long as the job runs
				if err := e.waitStateChange(ctx, read); err != nil {
					return nil, err
				}
				continue
			}
			if bumpErr != nil {
				if err := retry(bumpErr); err != nil {
					return nil, err
				}
			}
		case Joining:
			spare = false
			r, err := e.joinRound(ctx, st, rev, read, deadline)
			var jt *JoinTimeoutError
			switch {
			case err == nil && r == nil:
			case err == nil, errors.As(err, &jt), ctx.Err() != nil:
				return r, err
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				// The store dropped our lease before our keep-alive
				// noticed; register again.
				e.markLeaseLost()
			default:
				if err := retry(err); err != nil {
					return nil, err
				}
			}
		}
	}
}

// assignment returns node's membership in the round of st, reading only
// that node's key.
func (e *Etcd) assignment(ctx context.Context, st *State, node string) (Member, bool, error) {
	if st.AssignPrefix == "" {
		m, ok := st.Member(node)
		return m, ok, nil
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	key := st.AssignPrefix + node
	resp, err := e.cli.Get(ctx, key)
	if err != nil {
		return Member{}, false, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	if len(resp.Kvs) == 0 {
		return Member{}, false, nil
	}
	var m Member
	if err := decode(key, resp.Kvs[0].Value, &m); err != nil || m.Node != node || m.GroupRank < 0 || m.GroupRank >= st.Nodes() || m.NProc < 1 {
		e.log.Warn("ignoring a malformed assignment", "key", key, "err", err)
		return Member{}, false, nil
	}
	return m, true, nil
}

// members returns the member list of the round of st (of the last closed
// round when st is Joining).
func (e *Etcd) members(ctx context.Context, st *State) ([]Member, error) {
	if st.MembersKey == "" {
		return st.Members, nil
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, st.MembersKey)
	if err != nil {
		return nil, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil // swept by a later round
	}
	var ms []Member
	if err := decode(st.MembersKey, resp.Kvs[0].Value, &ms); err != nil {
		e.log.Warn("ignoring a malformed member list", "err", err)
		return nil, nil
	}
	return ms, nil
}

// missingMembers returns the members of st whose node keys are gone.
func (e *Etcd) missingMembers(ctx context.Context, st *State) ([]Member, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.key(nodesDir), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	live := map[string]bool{}
	for _, kv := range resp.Kvs {
		live[strings.TrimPrefix(string(kv.Key), e.key(nodesDir))] = true
	}
	members, err := e.members(ctx, st)
	if err != nil {
		return nil, err
	}
	var gone []Member
	for _, m := range members {
		if !live[m.Node] {
			gone = append(gone, m)
		}
	}
	return gone, nil
}

// restartEndedJob starts a new run of a job that succeeded or failed,
// when no other agent of it is left: the id is being reused. It reports
// whether it did.
func (e *Etcd) restartEndedJob(ctx context.Context, st *State, rev int64) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.key(nodesDir), clientv3.WithPrefix())
	if err != nil {
		return false, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	for _, kv := range resp.Kvs {
		var n NodeInfo
		if string(kv.Key) != e.key(nodesDir+e.node) && decode(string(kv.Key), kv.Value, &n) == nil && n.State == NodeActive {
			return false, nil // an agent of the ended run is still leaving
		}
	}
	next := State{Generation: uint64(resp.Header.Revision) + 1, Phase: Joining, Since: time.Now(), MaxRestarts: e.cfg.MaxRestarts,
		Reason: fmt.Sprintf("new run of job %s (the last one %s: %s)", e.cfg.JobID, st.Phase, st.Reason)}
	ok, err := e.swapState(ctx, rev, &next)
	if err != nil {
		return false, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	if ok {
		e.log.Info("starting a new run of an ended job", "job", e.cfg.JobID, "last", st.Phase)
	}
	return true, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitStateChange blocks until the state key changes after revision rev,
// a node entry is deleted (a spare must notice a full job losing a member
// that nobody else is left to report), or this node's lease is lost.
func (e *Etcd) waitStateChange(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, lost := e.leaseChan()
	wch := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(stateKey), clientv3.WithRev(rev+1))
	nch := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(nodesDir), clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	select {
	case <-wch: // an event, or the watch broke: either way, read the state again
		return nil
	case <-nch:
		return nil
	case <-lost:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// joinRound puts this node's join key for the open round and waits until
// the round closes. The first node to join leads the round: it decides
// when to close it and writes the members. It returns (nil, nil) when the
// state moved on without making this node a member, for Next to look again.
func (e *Etcd) joinRound(ctx context.Context, st *State, rev, read int64, deadline time.Time) (*Round, error) {
	lease, lost := e.leaseChan()
	port := e.cfg.MasterPort
	if port == 0 {
		var err error
		if port, err = freePort(e.cfg.Addr); err != nil {
			return nil, err
		}
	}
	prefix := RoundPrefix(e.cfg.Prefix, st.Generation)
	me := JoinInfo{Node: e.node, Host: e.cfg.Host, Addr: e.cfg.Addr, NProc: e.cfg.NProc, MasterPort: port, Joined: time.Now()}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	// A plain put: it keeps the join order (the create revision) of a key
	// already there, and moves it to the current lease.
	_, err := e.cli.Put(octx, prefix+e.node, encode(me), clientv3.WithLease(lease))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("rendezvous store at %s: join generation %d: %w", e.cfg.Endpoint, st.Generation, err)
	}
	e.log.Debug("joined round", "generation", st.Generation, "reason", st.Reason)

	for {
		leader, electKey, readRev, err := e.electLeader(ctx, st.Generation, lease, prefix)
		if err != nil {
			return nil, err
		}
		if leader == "" { // our own key is gone: lease lost
			return nil, nil
		}
		if leader == prefix+e.node {
			if err := e.lead(ctx, st, rev, read, deadline, lost); err != nil {
				return nil, err
			}
			return nil, nil
		}
		changed, err := e.follow(ctx, read, electKey, readRev, deadline, lost, st)
		if err != nil {
			return nil, err
		}
		if changed {
			return nil, nil
		}
	}
}

// electLeader makes this node the round's leader if the round has none
// yet: the leader is whoever first creates leaders/<gen>, on its lease, so
// it goes when the leader does. One request per joiner, whatever the size
// of the round. It returns the leader's join key ("" when this node's own
// join key is gone: its lease was lost), the election key, and the
// revision read.
func (e *Etcd) electLeader(ctx context.Context, gen uint64, lease clientv3.LeaseID, prefix string) (string, string, int64, error) {
	key := e.key(leadersDir + genKey(gen))
	me := prefix + e.node
	for {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		txn, err := e.cli.Txn(octx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), clientv3.Compare(clientv3.CreateRevision(me), ">", 0)).
			Then(clientv3.OpPut(key, me, clientv3.WithLease(lease))).
			Else(clientv3.OpGet(key), clientv3.OpGet(me, clientv3.WithKeysOnly())).Commit()
		cancel()
		if err != nil {
			return "", "", 0, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
		}
		if txn.Succeeded {
			return me, key, txn.Header.Revision, nil
		}
		if len(txn.Responses[1].GetResponseRange().Kvs) == 0 {
			return "", key, txn.Header.Revision, nil
		}
		kvs := txn.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue // the leader left between the compare and the read
		}
		if leader := string(kvs[0].Value); strings.HasPrefix(leader, prefix) && len(leader) > len(prefix) {
			return leader, key, txn.Header.Revision, nil
		}
		// Not a join key of this round: someone else wrote it. Clear it
		// (only if unchanged) and elect again, or the round has no leader.
		e.log.Warn("removing a malformed round leader entry", "key", key)
		octx, cancel = context.WithTimeout(ctx, opTimeout)
		_, err = e.cli.Txn(octx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kvs[0].ModRevision)).Then(clientv3.OpDelete(key)).Commit()
		cancel()
		if err != nil {
			return "", "", 0, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
		}
	}
}

// follow waits for the state to change, or for the leader's election key
// to vanish with its lease (then another joiner leads). It reports whether the
// state changed.
func (e *Etcd) follow(ctx context.Context, stateRev int64, leaderKey string, rev int64, deadline time.Time, lost <-chan struct{}, st *State) (bool, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sw := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(stateKey), clientv3.WithRev(stateRev+1))
	lw := e.cli.Watch(clientv3.WithRequireLeader(wctx), leaderKey, clientv3.WithRev(rev+1))
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for {
		select {
		case <-sw:
			return true, nil
		case resp, ok := <-lw:
			if !ok || resp.Canceled || resp.Err() != nil {
				return false, nil
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return false, nil
				}
			}
		case <-lost:
			return true, nil
		case <-timeout.C:
			n, _ := e.countJoined(ctx, st.Generation)
			return false, &JoinTimeoutError{Joined: n, Min: e.cfg.NNodesMin, Timeout: e.cfg.JoinTimeout, Generation: st.Generation}
		case <-ctx.Done():
			return false, context.Cause(ctx)
		}
	}
}

func (e *Etcd) countJoined(ctx context.Context, gen uint64) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, RoundPrefix(e.cfg.Prefix, gen), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

// liveNode is a node entry as the leader tracks it.
type liveNode struct {
	NodeInfo
	probed time.Time
}

// lead runs the round as its leader until the state moves on: it tracks
// the joiners and the live nodes through watches, probes nodes that are
// registered but do not join, and closes the round when
//   - NNodesMax nodes joined; or
//   - at least NNodesMin joined and the last-call window passed since then; or
//   - at least NNodesMin joined, the job ran before, and every live node
//     joined: a re-formation after a fault waits for no one else.
func (e *Etcd) lead(ctx context.Context, st *State, stateRev, stateRead int64, deadline time.Time, lost <-chan struct{}) error {
	prefix := RoundPrefix(e.cfg.Prefix, st.Generation)
	nodesPrefix := e.key(nodesDir)
	gctx, cancel := context.WithTimeout(ctx, opTimeout)
	resp, err := e.cli.Txn(gctx).Then(clientv3.OpGet(prefix, clientv3.WithPrefix()), clientv3.OpGet(nodesPrefix, clientv3.WithPrefix())).Commit()
	cancel()
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	rev := resp.Header.Revision
	joiners := map[string]joiner{}
	nodes := map[string]*liveNode{}
	addJoiner := func(key string, value []byte, createRev int64) {
		var j JoinInfo
		if err := decode(key, value, &j); err != nil || j.NProc < 1 || key != prefix+j.Node {
			e.log.Warn("ignoring a malformed join entry", "key", key, "err", err)
			return
		}
		joiners[key] = joiner{JoinInfo: j, rev: createRev}
	}
	addNode := func(key string, value []byte) {
		var n NodeInfo
		if err := decode(key, value, &n); err != nil || n.Node == "" {
			e.log.Warn("ignoring a malformed node entry", "key", key, "err", err)
			return
		}
		nodes[key] = &liveNode{NodeInfo: n}
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		addJoiner(string(kv.Key), kv.Value, kv.CreateRevision)
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		addNode(string(kv.Key), kv.Value)
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	sw := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(stateKey), clientv3.WithRev(stateRead+1))
	jw := e.cli.Watch(clientv3.WithRequireLeader(wctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	nw := e.cli.Watch(clientv3.WithRequireLeader(wctx), nodesPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var minSince time.Time
	prev, err := e.members(ctx, st)
	if err != nil {
		return err
	}
	reformation := len(prev) > 0
	for {
		n := len(joiners)
		if n >= e.cfg.NNodesMin && minSince.IsZero() {
			minSince = time.Now()
		}
		if n < e.cfg.NNodesMin {
			minSince = time.Time{}
		}
		allLive := true
		joined := map[string]bool{}
		for _, j := range joiners {
			joined[j.Node] = true
		}
		var pending []*liveNode
		for _, ln := range nodes {
			if ln.State == NodeActive && !joined[ln.Node] {
				allLive = false
				pending = append(pending, ln)
			}
		}
		closeNow := ""
		switch {
		case n >= e.cfg.NNodesMax:
			closeNow = "all nodes joined"
		case n >= e.cfg.NNodesMin && reformation && allLive:
			closeNow = "every live node joined"
		case n >= e.cfg.NNodesMin && time.Since(minSince) >= e.cfg.LastCall:
			closeNow = "last call ended"
		}
		if closeNow != "" {
			return e.closeRound(ctx, st, stateRev, prev, joiners, closeNow)
		}
		if time.Now().After(deadline) {
			return &JoinTimeoutError{Joined: n, Min: e.cfg.NNodesMin, Timeout: e.cfg.JoinTimeout, Generation: st.Generation}
		}
		e.probePending(ctx, pending)

		select {
		case <-sw:
			return nil // the state moved on
		case resp, ok := <-jw:
			if !ok || resp.Canceled || resp.Err() != nil {
				return nil // let Next start over with fresh watches
			}
			for _, ev := range resp.Events {
				k := string(ev.Kv.Key)
				if ev.Type == clientv3.EventTypeDelete {
					delete(joiners, k)
				} else {
					addJoiner(k, ev.Kv.Value, ev.Kv.CreateRevision)
				}
			}
		case resp, ok := <-nw:
			if !ok || resp.Canceled || resp.Err() != nil {
				return nil
			}
			for _, ev := range resp.Events {
				k := string(ev.Kv.Key)
				if ev.Type == clientv3.EventTypeDelete {
					delete(nodes, k)
				} else {
					addNode(k, ev.Kv.Value)
				}
			}
		case <-tick.C:
		case <-lost:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// probePending dials the liveness port of registered nodes that have not
// joined the round. A refused connection means the agent process is gone
// (killed, crashed) while its lease has a few seconds left; revoking the
// lease lets the round close now instead of after the TTL. A node that
// does not answer at all (frozen, cut off) is left to its lease.
func (e *Etcd) probePending(ctx context.Context, pending []*liveNode) {
	for _, ln := range pending {
		if time.Since(ln.probed) < time.Second || ln.Probe == "" || ln.Lease == 0 {
			continue
		}
		ln.probed = time.Now()
		c, err := net.DialTimeout("tcp", ln.Probe, 300*time.Millisecond)
		if err == nil {
			c.Close()
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			continue
		}
		e.log.Warn("node is gone: its agent refuses connections; revoking its lease", "node", ln.Node, "host", ln.Host, "probe", ln.Probe)
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		_, err = e.cli.Revoke(rctx, clientv3.LeaseID(ln.Lease))
		cancel()
		if err != nil {
			e.log.Debug("revoke lease of a dead node", "node", ln.Node, "err", err)
		}
	}
}

// closeRound writes the members of the round, if the state is still the
// one the round opened with.
func (e *Etcd) closeRound(ctx context.Context, st *State, stateRev int64, prev []Member, joiners map[string]joiner, why string) error {
	list := make([]joiner, 0, len(joiners))
	for _, j := range joiners {
		list = append(list, j)
	}
	sort.Slice(list, func(a, b int) bool { return list[a].rev < list[b].rev })
	members := assign(prev, list, e.cfg.NNodesMax)
	port := 0
	for _, j := range list {
		if j.Node == members[0].Node {
			port = j.MasterPort
		}
	}
	gen := genKey(st.Generation)
	next := *st
	next.Phase = Running
	next.Since = time.Now()
	next.Members = nil
	next.NNodes = len(members)
	// Keyed by the closer too: should two leaders close the same round,
	// the loser's keys cannot overwrite the winner's.
	next.MembersKey = e.key(membersDir + gen + "/" + e.node)
	next.AssignPrefix = e.key(assignDir + gen + "/" + e.node + "/")
	next.WorldSize = members[len(members)-1].RankOffset + members[len(members)-1].NProc
	next.MasterAddr = members[0].Addr
	next.MasterPort = port
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	// The member keys go first, in batches that fit etcd's default limit
	// of 128 operations per transaction; the state that points at them
	// comes last, so whoever sees the round closed finds them.
	ops := []clientv3.Op{clientv3.OpPut(next.MembersKey, encode(members))}
	for _, m := range members {
		ops = append(ops, clientv3.OpPut(next.AssignPrefix+m.Node, encode(m)))
	}
	for len(ops) > 0 {
		n := min(len(ops), 100)
		if _, err := e.cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			return fmt.Errorf("rendezvous store at %s: close round %d: %w", e.cfg.Endpoint, st.Generation, err)
		}
		ops = ops[n:]
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(e.key(stateKey)), "=", stateRev)}
	// Every member must still be registered as the round closes: a member
	// lost just before would otherwise be written in and never missed.
	// etcd bounds the compares of one transaction (128 by default), so
	// large rounds rely on watchRound's first look at the members instead.
	if len(members) <= 100 {
		for _, m := range members {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(e.key(nodesDir+m.Node)), ">", 0))
		}
	}
	txn, err := e.cli.Txn(ctx).
		If(cmps...).
		Then(clientv3.OpPut(e.key(stateKey), encode(next)),
			// earlier rounds' join and done keys are no use to anyone now
			clientv3.OpDelete(e.key(roundsDir), clientv3.WithRange(RoundPrefix(e.cfg.Prefix, st.Generation))),
			clientv3.OpDelete(e.key(doneDir), clientv3.WithRange(e.key(doneDir+gen+"/"))),
			clientv3.OpDelete(e.key(leadersDir), clientv3.WithRange(e.key(leadersDir+gen))),
			// and so are the member keys of rounds before the last
			clientv3.OpDelete(e.key(membersDir), clientv3.WithRange(e.key(membersDir+gen))),
			clientv3.OpDelete(e.key(assignDir), clientv3.WithRange(e.key(assignDir+gen)))).
		Commit()
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: close round %d: %w", e.cfg.Endpoint, st.Generation, err)
	}
	if txn.Succeeded {
		e.log.Info("rendezvous round closed", "generation", st.Generation, "nodes", len(members), "world_size", next.WorldSize,
			"why", why, "took", time.Since(st.Since).Round(time.Millisecond))
	}
	return nil
}

// bump moves the job from running generation gen to the next one, unless
// someone already did. A fault counts against the job's restarts; when
// none are left the job fails instead.
func (e *Etcd) bump(ctx context.Context, gen uint64, reason string, fault bool) (*State, error) {
	for {
		st, rev, _, err := e.readState(ctx)
		if err != nil {
			return nil, err
		}
		if st.Generation != gen || st.Phase != Running {
			return st, nil
		}
		next, ok, err := e.bumpFrom(ctx, st, rev, reason, fault)
		if err != nil {
			return nil, err
		}
		if ok {
			return next, nil
		}
	}
}

// bumpFrom moves the job on from st, whose mod revision is rev, in one
// compare-and-swap without reading anything: when a lost member is seen
// by every other member at once, none of them reads the state first, and
// all but one fail the compare. It reports whether this call moved the job.
func (e *Etcd) bumpFrom(ctx context.Context, st *State, rev int64, reason string, fault bool) (*State, bool, error) {
	next := *st
	next.Generation++
	next.Phase = Joining
	next.Reason = reason
	next.Since = time.Now()
	next.WorldSize, next.MasterAddr, next.MasterPort = 0, "", 0
	if fault {
		next.Failures++
		if next.Failures > st.MaxRestarts {
			next.Phase = Failed
			next.Reason = fmt.Sprintf("%s; no restarts left (--max-restarts %d)", reason, st.MaxRestarts)
		}
	}
	ok, err := e.swapState(ctx, rev, &next)
	if err != nil {
		return nil, false, fmt.Errorf("rendezvous store at %s: new generation: %w", e.cfg.Endpoint, err)
	}
	if ok {
		e.log.Info("new generation", "generation", next.Generation, "phase", next.Phase, "reason", next.Reason,
			"failures", next.Failures, "max_restarts", next.MaxRestarts)
	}
	return &next, ok, nil
}

// swapState writes next as the state if the state's mod revision is
// still rev, and reports whether it did.
func (e *Etcd) swapState(ctx context.Context, rev int64, next *State) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	txn, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(e.key(stateKey)), "=", rev)).
		Then(clientv3.OpPut(e.key(stateKey), encode(next))).Commit()
	if err != nil {
		return false, err
	}
	return txn.Succeeded, nil
}

// Fail reports that round r failed here (a worker failed): the job moves
// to a new generation, which counts against --max-restarts. It returns
// *JobFailedError when no restarts were left. When the job already moved
// on (another node's fault came first), nothing more is counted.
func (e *Etcd) Fail(ctx context.Context, r *Round, reason string) error {
	st, err := e.bump(ctx, r.Generation, fmt.Sprintf("node %s (%s, group rank %d): %s", e.node, e.cfg.Host, r.GroupRank, reason), true)
	if err != nil {
		return err
	}
	if st.Phase == Failed {
		return &JobFailedError{Reason: st.Reason}
	}
	return nil
}

// Succeed records that this node's workers of round r all finished. The
// last member to finish marks the job succeeded. When this agent hosts the
// store it then waits, as torchrun's exit barrier does, until the other
// agents are gone or done, since they still need the store.
func (e *Etcd) Succeed(ctx context.Context, r *Round) error {
	e.mu.Lock()
	e.state = NodeSucceeded
	e.mu.Unlock()
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := e.putNode(octx, NodeSucceeded, ""); err != nil {
		return err
	}
	doneDir := e.key(doneDir + genKey(r.Generation) + "/")
	if _, err := e.cli.Put(octx, doneDir+e.node, time.Now().Format(time.RFC3339Nano)); err != nil {
		return fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	resp, err := e.cli.Get(octx, doneDir, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	if int(resp.Count) >= r.NNodes {
		// From the round's own state: if the job moved on meanwhile, the
		// compare fails and nothing is marked.
		next := *r.state
		next.Phase = Succeeded
		next.Reason = fmt.Sprintf("all %d nodes' workers finished", r.NNodes)
		next.Since = time.Now()
		if _, err := e.swapState(octx, r.stateMod, &next); err != nil {
			e.log.Warn("mark the job succeeded", "err", err)
		}
	}
	if e.cfg.Hosted {
		e.waitOthersGone(ctx, false)
	}
	return nil
}

// Drain, in the agent that hosts the store, waits a few seconds for the
// other agents to see that the job is over (failed) and leave, so none of
// them is left waiting on a store that vanished. It returns at once when
// this agent does not host the store or the job is not over.
func (e *Etcd) Drain(ctx context.Context) {
	if e.cfg.Hosted {
		e.waitOthersGone(ctx, true)
	}
}

// waitOthersGone blocks while other agents are registered and the job is
// not over for them, polling twice a second; it returns when ctx is done.
// With onlyIfOver it returns at once unless the job is over.
func (e *Etcd) waitOthersGone(ctx context.Context, onlyIfOver bool) {
	logged := false
	var overSince time.Time
	for {
		gctx, cancel := context.WithTimeout(ctx, opTimeout)
		resp, err := e.cli.Txn(gctx).Then(clientv3.OpGet(e.key(nodesDir), clientv3.WithPrefix()), clientv3.OpGet(e.key(stateKey))).Commit()
		cancel()
		if err != nil {
			return
		}
		// Once the job is over, the others only need a moment to see it
		// and leave; do not wait on one that is stuck.
		var st State
		over, known := false, false
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 && decode("", kvs[0].Value, &st) == nil {
			over, known = st.Phase == Succeeded || st.Phase == Failed, true
		}
		// Spares need nothing from the store once the members are done.
		isMember := map[string]bool{}
		if known {
			ms, _ := e.members(ctx, &st)
			for _, m := range ms {
				isMember[m.Node] = true
			}
		}
		others := 0
		for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
			node := strings.TrimPrefix(string(kv.Key), e.key(nodesDir))
			if node != e.node && (isMember[node] || !known || over) {
				others++
			}
		}
		if others == 0 {
			return
		}
		if onlyIfOver && !over {
			return
		}
		if over {
			if overSince.IsZero() {
				overSince = time.Now()
			} else if time.Since(overSince) > 10*time.Second {
				e.log.Warn("leaving although other agents are still registered", "others", others)
				return
			}
		}
		if !logged {
			e.log.Info("waiting for the other agents to finish: this agent hosts the rendezvous store", "others", others)
			logged = true
		}
		if !sleep(ctx, 500*time.Millisecond) {
			return
		}
	}
}

// Leave takes this node out of the job without closing the rendezvous for
// the others: it says why, then revokes its lease. The others re-form
// without it (a scale event, not a fault).
func (e *Etcd) Leave(reason string) {
	e.mu.Lock()
	st := e.state
	if st == NodeActive {
		e.state = NodeLeft
	}
	lease := e.lease
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if st == NodeActive {
		if err := e.putNode(ctx, NodeLeft, reason); err != nil {
			e.log.Debug("mark node left", "err", err)
		}
	}
	if lease != 0 {
		if _, err := e.cli.Revoke(ctx, lease); err != nil {
			e.log.Debug("revoke lease", "err", err)
		}
	}
}

// Close stops keeping the lease alive and closes the probe port. It does
// not close the client, which the caller owns.
func (e *Etcd) Close() {
	e.stopBG()
	e.mu.Lock()
	if e.stopKA != nil {
		e.stopKA()
	}
	e.mu.Unlock()
	if e.probe != nil {
		e.probe.Close()
		e.probeWG.Wait()
	}
}

// startRound returns the round of state st for this node and starts
// watching it: the round ends (Done) when the job moves to another
// generation, and this node moves the job on itself when another member is
// lost.
func (e *Etcd) startRound(st *State, m Member, mod, read int64) *Round {
	e.mu.Lock()
	e.lastGen = st.Generation + 1
	e.mu.Unlock()
	r := newRound(st, m)
	r.state, r.stateMod = st, mod
	_, lost := e.leaseChan()
	go e.watchRound(e.bg, r, read, lost)
	return r
}

// watchRound ends r when the job leaves its generation, and moves the job
// on when another member is lost. It watches from revision from; whenever
// a watch breaks (a compacted revision, a lost leader) it reads the state
// and the members afresh and watches from there, since events missed in
// between will not come back.
func (e *Etcd) watchRound(ctx context.Context, r *Round, from int64, lost <-chan struct{}) {
	members := map[string]Member{}
	for _, m := range r.state.Members {
		members[m.Node] = m
	}
	// Group rank 0 checks the members once at the start: one lost just
	// before the round closed left no event after it. (Every member doing
	// so would cost a read of all nodes per node: too much at 1000 nodes.)
	check := r.GroupRank == 0
	resync := false
	for {
		if (check || resync) && len(members) < r.NNodes {
			// the whole list, only for this look: a member reads just its
			// own assignment otherwise
			if ms, err := e.members(ctx, r.state); err == nil {
				for _, m := range ms {
					members[m.Node] = m
				}
			}
		}
		if check || resync {
			rev, over := e.resyncRound(ctx, r, members, check || resync)
			if over {
				return
			}
			if rev > 0 {
				from = rev
			}
			check = false
		}
		broken := e.followRound(ctx, r, from, members, lost)
		if !broken || !sleep(ctx, 200*time.Millisecond) {
			return
		}
		resync = true
	}
}

// resyncRound reads the state and the node keys in one revision: it ends r
// when the state moved on, bumps for members that are gone, and returns
// the revision read (0 after a store error).
func (e *Etcd) resyncRound(ctx context.Context, r *Round, members map[string]Member, checkMembers bool) (rev int64, over bool) {
	gctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	ops := []clientv3.Op{clientv3.OpGet(e.key(stateKey))}
	if checkMembers {
		ops = append(ops, clientv3.OpGet(e.key(nodesDir), clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	}
	resp, err := e.cli.Txn(gctx).Then(ops...).Commit()
	if err != nil {
		return 0, ctx.Err() != nil
	}
	var st State
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 || decode(e.key(stateKey), kvs[0].Value, &st) != nil {
		r.end("the rendezvous state was deleted or overwritten")
		return 0, true
	}
	if st.Generation != r.Generation || (st.Phase != Running && st.Phase != Succeeded) {
		r.end(st.Reason)
		return 0, true
	}
	if checkMembers {
		live := map[string]bool{}
		for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
			live[strings.TrimPrefix(string(kv.Key), e.key(nodesDir))] = true
		}
		var missing []Member
		for _, m := range members {
			if !live[m.Node] && m.Node != e.node {
				missing = append(missing, m)
			}
		}
		if len(missing) > 0 {
			go func() {
				// One that succeeded moves nothing: look on to the next.
				for _, m := range missing {
					if reason, fault, gone := e.departure(ctx, r, m); gone {
						e.bumpUntilMoved(ctx, r, reason, fault)
						return
					}
				}
			}()
		}
	}
	return resp.Header.Revision, false
}

// departure says how member m, whose node entry is already gone when the
// round is first checked, went: a node that left or succeeded marked its
// entry so before its lease was revoked, and the store's history since the
// round started still has that last value. gone is false for a node that
// succeeded (no new generation); without the history (compacted, or no
// delete found in time) the node counts as lost.
func (e *Etcd) departure(ctx context.Context, r *Round, m Member) (reason string, fault, gone bool) {
	lost := fmt.Sprintf("node %s (%s, group rank %d) lost: its agent is gone or cut off (lease ended)", m.Node, m.Host, m.GroupRank)
	wctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	key := e.key(nodesDir) + m.Node
	for resp := range e.cli.Watch(wctx, key, clientv3.WithRev(r.stateMod+1), clientv3.WithPrevKV()) {
		if resp.Err() != nil || resp.Canceled {
			break
		}
		for _, ev := range resp.Events {
			if ev.Type != clientv3.EventTypeDelete {
				continue
			}
			var prev NodeInfo
			if ev.PrevKv != nil {
				_ = decode(key, ev.PrevKv.Value, &prev)
			}
			switch prev.State {
			case NodeSucceeded:
				return "", false, false
			case NodeLeft:
				return fmt.Sprintf("node %s (%s, group rank %d) left: %s", m.Node, m.Host, m.GroupRank, prev.Reason), false, true
			}
			return lost, true, true
		}
	}
	return lost, true, true
}

// followRound follows the watches of r's state and nodes from revision
// from. It returns true when a watch broke and the caller must resync,
// false when r is over.
func (e *Etcd) followRound(ctx context.Context, r *Round, from int64, members map[string]Member, lost <-chan struct{}) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sw := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(stateKey), clientv3.WithRev(from+1))
	nw := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(nodesDir), clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(from+1))
	for {
		select {
		case <-r.done:
			return false
		case <-ctx.Done():
			return false
		case <-lost:
			r.end("this node lost its lease on the rendezvous store (cut off or stalled for longer than the lease TTL)")
			return false
		case resp, ok := <-sw:
			if !ok || resp.Canceled || resp.Err() != nil {
				return ctx.Err() == nil
			}
			for _, ev := range resp.Events {
				var st State
				if ev.Type == clientv3.EventTypeDelete || decode(string(ev.Kv.Key), ev.Kv.Value, &st) != nil {
					r.end("the rendezvous state was deleted or overwritten")
					return false
				}
				if st.Generation != r.Generation || st.Phase != Running {
					if st.Phase == Succeeded && st.Generation == r.Generation {
						continue
					}
					r.end(st.Reason)
					return false
				}
			}
		case resp, ok := <-nw:
			if !ok || resp.Canceled || resp.Err() != nil {
				return ctx.Err() == nil
			}
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypeDelete {
					continue
				}
				node := strings.TrimPrefix(string(ev.Kv.Key), e.key(nodesDir))
				m, ok := members[node]
				if !ok && len(members) < r.NNodes && node != e.node {
					// not in the list this node holds: ask for its assignment
					m, ok, _ = e.assignment(ctx, r.state, node)
				}
				if !ok || m.Node == e.node {
					continue
				}
				var prev NodeInfo
				if ev.PrevKv != nil {
					_ = decode(string(ev.Kv.Key), ev.PrevKv.Value, &prev)
				}
				switch prev.State {
				case NodeSucceeded:
				case NodeLeft:
					go e.bumpUntilMoved(ctx, r, fmt.Sprintf("node %s (%s, group rank %d) left: %s", m.Node, m.Host, m.GroupRank, prev.Reason), false)
				default:
					go e.bumpUntilMoved(ctx, r, fmt.Sprintf("node %s (%s, group rank %d) lost: its agent is gone or cut off (lease ended)", m.Node, m.Host, m.GroupRank), true)
				}
			}
		}
	}
}

// bumpUntilMoved retries bump through store errors (a leader election in
// an etcd cluster) until the job left generation gen or ctx ends: a lost
// member noticed only by this node must not be forgotten.
func (e *Etcd) bumpUntilMoved(ctx context.Context, r *Round, reason string, fault bool) {
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		_, _, err := e.bumpFrom(ctx, r.state, r.stateMod, reason, fault)
		if err == nil {
			return // moved by this call, or by someone else first
		}
		e.log.Warn("move the job to a new generation; retrying", "reason", reason, "err", err)
		select {
		case <-r.done:
			return
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// Round is one node's part in one generation of the job.
type Round struct {
	Generation uint64
	GroupRank  int
	NNodes     int
	RankOffset int
	NProc      int
	WorldSize  int
	MasterAddr string
	MasterPort int
	Restarts   int // faults so far: TORCHELASTIC_RESTART_COUNT

	once   sync.Once
	done   chan struct{}
	reason string

	state    *State // the Running state of this round, and its mod revision
	stateMod int64
}

func newRound(st *State, m Member) *Round {
	return &Round{
		Generation: st.Generation, GroupRank: m.GroupRank, NNodes: st.Nodes(), RankOffset: m.RankOffset, NProc: m.NProc,
		WorldSize: st.WorldSize, MasterAddr: st.MasterAddr, MasterPort: st.MasterPort, Restarts: st.Failures,
		done: make(chan struct{}),
	}
}

// Done is closed when the job left this generation: a fault or a scale
// event elsewhere, or this node was cut off.
func (r *Round) Done() <-chan struct{} { return r.done }

// Reason says why the round ended; "" while it runs.
func (r *Round) Reason() string {
	select {
	case <-r.done:
		return r.reason
	default:
		return ""
	}
}

func (r *Round) end(reason string) {
	r.once.Do(func() {
		r.reason = reason
		close(r.done)
	})
}

// Stop ends the round's watch; the agent calls it when it is done with the
// round for its own reasons.
func (r *Round) Stop() { r.end("stopped by this agent") }
