package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ReplicaConfig configures Replicate.
type ReplicaConfig struct {
	Client *Client
	// Own is the member this agent started (the job's first agent), or nil.
	// Replicate takes it over: Replicas.Close closes it.
	Own *Server
	// Want is the number of voting members to keep (3: any one may be lost).
	Want int
	// Prefix is where the owner keys live (one per member, on the owning
	// agent's lease).
	Prefix string
	// TTL is the owner keys' lease: an agent silent this long loses its
	// member, which another agent then replaces.
	TTL time.Duration
	// Host is the IP this agent's member binds and advertises; the other
	// agents must reach it there.
	Host string
	// TLS is the members' client TLS (nil = plain); PeerTLS their raft
	// traffic's (nil = plain).
	TLS, PeerTLS *TLSFiles
	// QuotaBytes is each member's quota (ServerConfig.QuotaBytes).
	QuotaBytes int64
	Logger     *slog.Logger
	// Interval is how often the membership is looked at; 0 = 1 s.
	Interval time.Duration
}

// Replicas keeps the job's embedded store at Want members, each run by a
// different agent, so that the store outlives any one agent, the first
// included. Every agent of the job runs one; at most one member per agent.
// An agent without a member adds one (as a learner, promoted once it has
// caught up) while the cluster has fewer than Want; a member whose agent is
// gone (its owner key expired with the agent's lease) is removed by any
// agent. Close hands this agent's member over: it leaves the cluster, and
// another agent takes its place.
type Replicas struct {
	cfg ReplicaConfig
	log *slog.Logger

	mu        sync.Mutex
	own       *Server
	ownID     uint64
	keeper    bool
	endpoints []string // the voters' client URLs, as last set on the client

	lease     clientv3.LeaseID // the owner keys' lease; 0 = none yet or lost
	leaseLost <-chan struct{}
	claimed   bool // own's owner key is on lease

	ownerless map[uint64]time.Time
	voters    int  // as last said in the log (members only)
	wasFull   bool // the store had Want voters once
	cancel    context.CancelFunc
	done      chan struct{}
}

// ownerGrace is how long a member may be seen without an owner key before
// it counts as dead: covers the moment between adding a member and
// claiming it.
const ownerGrace = 2 * time.Second

// replicaOpTimeout bounds each request of the manager: a look that does
// not come back in this time is tried again at the next tick.
const replicaOpTimeout = 3 * time.Second

// Replicate starts keeping the store replicated, in the background.
func Replicate(cfg ReplicaConfig) *Replicas {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Replicas{cfg: cfg, log: cfg.Logger, own: cfg.Own, ownerless: map[uint64]time.Time{}, done: make(chan struct{})}
	if cfg.Own != nil {
		r.ownID = uint64(cfg.Own.etcd.Server.MemberID())
		r.keeper = true
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.run(ctx)
	return r
}

// Keeper reports whether this agent's member is the oldest one an agent
// still owns: the agent that, at the end of the job, waits for the others
// to leave before it closes its member. Exactly one agent is keeper while
// the members agree.
func (r *Replicas) Keeper() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.keeper
}

// Member reports whether this agent runs a member of the store.
func (r *Replicas) Member() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.own != nil
}

func (r *Replicas) run(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	var failing failStreak
	for {
		err := r.step(ctx)
		if ctx.Err() != nil {
			return
		}
		switch failing.see(err, time.Now()) {
		case streakLong:
			r.log.Warn("the rendezvous store's members are not looked after: the replica manager's requests keep failing",
				"for", failing.For(time.Now()).Round(time.Millisecond), "err", err)
		case streakOver:
			r.log.Info("the replica manager's requests succeed again")
		}
		if err != nil {
			r.log.Debug("store replicas", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// step looks at the membership once and makes at most one change.
func (r *Replicas) step(ctx context.Context) error {
	if err := r.ensureLease(ctx); err != nil {
		return err
	}
	if err := r.claim(ctx); err != nil {
		return err
	}
	v, byID, err := r.look(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	own := r.ownID
	r.mu.Unlock()
	p := planReplicas(v, own, r.ownerless, time.Now(), ownerGrace, r.cfg.Want)
	r.mu.Lock()
	r.keeper = p.keeper
	r.mu.Unlock()
	r.sayVoters(own, p.voters)
	r.syncEndpoints(byID)
	switch {
	case p.remove != 0:
		return r.removeDead(ctx, p.remove, byID[p.remove])
	case p.ownGone:
		r.log.Warn("this agent's store member was removed from the cluster (it was silent past the lease TTL); closing it",
			"member", fmt.Sprintf("%x", own))
		r.dropOwn()
		return nil
	case p.join:
		return r.join(ctx, p.voters)
	}
	return nil
}

// sayVoters logs, from the agents that run a member, when the number of
// voting members changes: short of Want, the store runs on what it has,
// and the log says what one more loss would cost.
func (r *Replicas) sayVoters(own uint64, voters int) {
	if own == 0 || voters == r.voters {
		return
	}
	r.voters = voters
	switch {
	case voters >= r.cfg.Want:
		r.wasFull = true
		r.log.Info("the rendezvous store has all its members", "members", voters)
	case !r.wasFull:
		// Still forming: agents are joining.
	case voters > 1:
		r.log.Warn("the rendezvous store runs short of members until an agent without one takes the place",
			"members", voters, "want", r.cfg.Want, "can_lose", (voters-1)/2)
	default:
		r.log.Warn("the rendezvous store runs on one member: losing its agent loses the store, and the job",
			"want", r.cfg.Want)
	}
}

// ensureLease grants the owner keys' lease when there is none or it was
// lost, and keeps it alive.
func (r *Replicas) ensureLease(ctx context.Context) error {
	if r.leaseLost != nil {
		select {
		case <-r.leaseLost:
			r.lease, r.leaseLost, r.claimed = 0, nil, false
		default:
			return nil
		}
	}
	cli := r.cfg.Client.etcd
	gctx, cancel := context.WithTimeout(ctx, replicaOpTimeout)
	g, err := cli.Grant(gctx, int64(max(1, r.cfg.TTL/time.Second)))
	cancel()
	if err != nil {
		return fmt.Errorf("grant the store members' lease: %w", err)
	}
	r.lease, r.leaseLost = g.ID, KeepAlive(ctx, cli, g.ID, time.Duration(g.TTL)*time.Second)
	return nil
}

// claim writes this agent's member's owner key on the lease, once per lease.
func (r *Replicas) claim(ctx context.Context) error {
	r.mu.Lock()
	own := r.ownID
	r.mu.Unlock()
	if own == 0 || r.claimed {
		return nil
	}
	if err := r.putOwner(ctx, own); err != nil {
		return err
	}
	r.claimed = true
	return nil
}

func (r *Replicas) putOwner(ctx context.Context, id uint64) error {
	host, _ := os.Hostname()
	pctx, cancel := context.WithTimeout(ctx, replicaOpTimeout)
	defer cancel()
	_, err := r.cfg.Client.etcd.Put(pctx, r.ownerKey(id), fmt.Sprintf("%s pid %d", host, os.Getpid()), clientv3.WithLease(r.lease))
	if err != nil {
		return fmt.Errorf("claim store member %x: %w", id, err)
	}
	return nil
}

func (r *Replicas) ownerKey(id uint64) string {
	return r.cfg.Prefix + strconv.FormatUint(id, 16)
}

// look reads the members and their owner keys.
func (r *Replicas) look(ctx context.Context) (replicaView, map[uint64]*memberInfo, error) {
	cli := r.cfg.Client.etcd
	lctx, cancel := context.WithTimeout(ctx, replicaOpTimeout)
	defer cancel()
	ml, err := cli.MemberList(lctx)
	if err != nil {
		return replicaView{}, nil, fmt.Errorf("list the store's members: %w", err)
	}
	keys, err := cli.Get(lctx, r.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return replicaView{}, nil, fmt.Errorf("read the store members' owners: %w", err)
	}
	v := replicaView{owned: map[uint64]int64{}}
	byID := map[uint64]*memberInfo{}
	for _, m := range ml.Members {
		v.members = append(v.members, memberView{id: m.ID, learner: m.IsLearner})
		byID[m.ID] = &memberInfo{name: m.Name, learner: m.IsLearner, clientURLs: m.ClientURLs}
	}
	for _, kv := range keys.Kvs {
		id, err := strconv.ParseUint(strings.TrimPrefix(string(kv.Key), r.cfg.Prefix), 16, 64)
		if err == nil {
			v.owned[id] = kv.CreateRevision
		}
	}
	return v, byID, nil
}

type memberInfo struct {
	name       string
	learner    bool
	clientURLs []string
}

// syncEndpoints points the client at every voter, so that losing any
// member, the one it first dialled included, loses nothing.
func (r *Replicas) syncEndpoints(byID map[uint64]*memberInfo) {
	var eps []string
	for _, m := range byID {
		if m.learner || m.name == "" {
			continue
		}
		for _, u := range m.clientURLs {
			if pu, err := url.Parse(u); err == nil && !strings.HasSuffix(pu.Host, ":0") {
				eps = append(eps, u)
			}
		}
	}
	slices.Sort(eps)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(eps) == 0 || slices.Equal(eps, r.endpoints) {
		return
	}
	r.endpoints = eps
	r.cfg.Client.SetEndpoints(eps...)
}

func (r *Replicas) removeDead(ctx context.Context, id uint64, m *memberInfo) error {
	rctx, cancel := context.WithTimeout(ctx, replicaOpTimeout)
	defer cancel()
	if _, err := r.cfg.Client.etcd.MemberRemove(rctx, id); err != nil {
		return fmt.Errorf("remove store member %x, whose agent is gone: %w", id, err)
	}
	name := ""
	if m != nil {
		name = m.name
	}
	r.log.Info("removed a store member whose agent is gone", "member", fmt.Sprintf("%x", id), "name", name)
	return nil
}

// dropOwn closes this agent's member, which is no longer in the cluster.
func (r *Replicas) dropOwn() {
	r.mu.Lock()
	own := r.own
	r.own, r.ownID, r.keeper, r.claimed = nil, 0, false, false
	r.mu.Unlock()
	if own != nil {
		own.Close()
	}
}

// join adds a member run by this agent: as a learner first, so that a
// member that never comes up does not count against the quorum, then
// promoted once it has caught up.
func (r *Replicas) join(ctx context.Context, voters int) error {
	addrs, err := freeAddrs(r.cfg.Host, 2) // two different ports
	if err != nil {
		return err
	}
	clientAddr, peerAddr := addrs[0], addrs[1]
	peerScheme := "http"
	if r.cfg.PeerTLS != nil {
		peerScheme = "https"
	}
	peerURL := (&url.URL{Scheme: peerScheme, Host: peerAddr}).String()
	cli := r.cfg.Client.etcd
	actx, cancel := context.WithTimeout(ctx, replicaOpTimeout)
	added, err := cli.MemberAddAsLearner(actx, []string{peerURL})
	cancel()
	if err != nil {
		return fmt.Errorf("add a store member: %w", err)
	}
	id := added.Member.ID
	host, _ := os.Hostname()
	name := fmt.Sprintf("%s-%x", host, id)
	if err := r.putOwner(ctx, id); err != nil {
		r.undoJoin(id, nil)
		return err
	}
	var initial []string
	for _, m := range added.Members {
		n := m.Name
		switch {
		case m.ID == id:
			n = name
		case n == "":
			n = fmt.Sprintf("unstarted-%x", m.ID)
		}
		for _, u := range m.PeerURLs {
			initial = append(initial, n+"="+u)
		}
	}
	srv, err := launch(ServerConfig{
		ClientAddr: clientAddr, PeerAddr: peerAddr, Name: name, Logger: r.cfg.Logger,
		TLS: r.cfg.TLS, PeerTLS: r.cfg.PeerTLS, QuotaBytes: r.cfg.QuotaBytes,
		initialCluster: strings.Join(initial, ","), existing: true,
	})
	if err != nil {
		r.undoJoin(id, nil)
		return fmt.Errorf("start a store member: %w", err)
	}
	if err := srv.waitReady(ctx); err != nil {
		r.undoJoin(id, srv)
		return err
	}
	if err := r.promote(ctx, id); err != nil {
		r.undoJoin(id, srv)
		return err
	}
	r.mu.Lock()
	r.own, r.ownID, r.claimed = srv, id, true
	r.mu.Unlock()
	r.log.Info("joined the rendezvous store as a member", "member", fmt.Sprintf("%x", id), "endpoint", srv.Endpoint(),
		"members", voters+1, "want", r.cfg.Want)
	return nil
}

// promote makes learner id a voter once it has caught up with the leader,
// which etcd checks; it tries for up to readyTimeout.
func (r *Replicas) promote(ctx context.Context, id uint64) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		pctx, cancel := context.WithTimeout(ctx, replicaOpTimeout)
		_, err := r.cfg.Client.etcd.MemberPromote(pctx, id)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("promote store member %x: %w", id, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// undoJoin takes back a member that did not make it.
func (r *Replicas) undoJoin(id uint64, srv *Server) {
	ctx, cancel := context.WithTimeout(context.Background(), replicaOpTimeout)
	defer cancel()
	if _, err := r.cfg.Client.etcd.MemberRemove(ctx, id); err != nil {
		r.log.Warn("take back a store member that did not start", "member", fmt.Sprintf("%x", id), "err", err)
	}
	r.cfg.Client.etcd.Delete(ctx, r.ownerKey(id))
	if srv != nil {
		srv.Close()
	}
}

// Close stops the manager and hands this agent's member over: it leaves
// the cluster (unless it is the last one), and the agents that remain
// replace it. ctx bounds the handover.
func (r *Replicas) Close(ctx context.Context) error {
	own, err := r.HandOver(ctx)
	if own != nil {
		err = errors.Join(err, own.Close())
	}
	return err
}

// Stop ends the manager and returns this agent's member (nil when it runs
// none) without handing it over or revoking its owner lease: for a job
// that is over, whose store nobody needs any more but to leave it.
func (r *Replicas) Stop() *Server {
	r.cancel()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	own := r.own
	r.own, r.ownID = nil, 0
	return own
}

// HandOver is Close without closing this agent's member, which it returns
// (nil when it runs none) for the caller to close once it has closed its
// own clients: a member closed while a client of it still holds watches
// waits etcd's request timeout (about 6 s) for them before it stops.
func (r *Replicas) HandOver(ctx context.Context) (*Server, error) {
	r.cancel()
	<-r.done
	r.mu.Lock()
	own, id := r.own, r.ownID
	r.own, r.ownID = nil, 0
	r.mu.Unlock()
	// The owner lease first, while this agent's member still serves: once
	// it is closed, a request can still be routed to it and wait out its
	// timeout.
	if r.lease != 0 {
		rctx, cancel := context.WithTimeout(ctx, replicaOpTimeout)
		r.cfg.Client.etcd.Revoke(rctx, r.lease)
		cancel()
	}
	if own == nil {
		return nil, nil
	}
	return own, r.handOver(ctx, id)
}

func (r *Replicas) handOver(ctx context.Context, id uint64) error {
	cli := r.cfg.Client.etcd
	rctx, cancel := context.WithTimeout(ctx, replicaOpTimeout)
	defer cancel()
	ml, err := cli.MemberList(rctx)
	if err != nil {
		return fmt.Errorf("hand over store member %x: %w", id, err)
	}
	// The last voter stays, learners or not: with the reconfiguration
	// check off (server.go), etcd would apply its removal, and raft
	// panics on a cluster without voters ("removed all voters"), taking
	// the agent down. A learner is a member another agent was adding
	// when this one left; its agent takes it back.
	voters := 0
	for _, m := range ml.Members {
		if m.ID != id && !m.IsLearner {
			voters++
		}
	}
	if voters == 0 {
		return nil
	}
	// Leaving while another member is gone (not yet removed) would leave
	// the cluster without a quorum; then the others remove this member
	// once its owner key is gone, as they would the dead one.
	keys, err := cli.Get(rctx, r.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("hand over store member %x: %w", id, err)
	}
	owned := map[string]bool{}
	for _, kv := range keys.Kvs {
		owned[string(kv.Key)] = true
	}
	for _, m := range ml.Members {
		if m.ID != id && !m.IsLearner && !owned[r.ownerKey(m.ID)] {
			return fmt.Errorf("hand over store member %x: member %x has no agent; leaving now would lose the quorum", id, m.ID)
		}
	}
	// Point the client away from this member first: the request that
	// removes it must be answered by one that stays.
	var others []string
	for _, m := range ml.Members {
		if m.ID != id && !m.IsLearner {
			others = append(others, m.ClientURLs...)
		}
	}
	if len(others) > 0 {
		r.cfg.Client.SetEndpoints(others...)
	}
	if _, err := cli.MemberRemove(rctx, id); err != nil {
		return fmt.Errorf("hand over store member %x: %w", id, err)
	}
	r.log.Info("handed over this agent's store member", "member", fmt.Sprintf("%x", id))
	return nil
}

// Replicable says whether the store can take more members. One started
// for a single member (ServerConfig without PeerAddr) advertises peer
// port 0, which a member that joined could not dial: it would fail to
// bootstrap, again and again.
func (c *Client) Replicable(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, replicaOpTimeout)
	defer cancel()
	resp, err := c.etcd.MemberList(ctx)
	if err != nil {
		return false, fmt.Errorf("list the store's members: %w", err)
	}
	for _, m := range resp.Members {
		for _, u := range m.PeerURLs {
			if pu, err := url.Parse(u); err != nil || pu.Port() == "" || pu.Port() == "0" {
				return false, nil
			}
		}
	}
	return true, nil
}
