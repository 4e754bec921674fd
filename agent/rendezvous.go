package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// rendezvous is what the agent's loop needs from a rendezvous backend.
type rendezvous interface {
	// Next blocks until this node is part of the job's next generation.
	Next(ctx context.Context) (*rdzv.Round, error)
	// Fail reports a local fault in round r; *rdzv.JobFailedError when no
	// restarts are left.
	Fail(ctx context.Context, r *rdzv.Round, reason string) error
	// Succeed reports that this node's workers of round r all finished.
	Succeed(ctx context.Context, r *rdzv.Round) error
	// Leave takes this node out of the job for good.
	Leave(reason string)
}

// joined is an open rendezvous and what goes with it.
type joined struct {
	rz rendezvous
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

// openRendezvous joins the job: with fixed ranks (static, and --standalone:
// one node has nobody to meet), or through an etcd store that this agent
// hosts (c10d) or that exists already (etcd).
//
// --standalone once hosted an embedded etcd on loopback too. A store for
// one node buys nothing (no other node reads it; `ddp-agent status` is for
// multi-node jobs) and its timers kept an idle agent at 0.9 % of a core,
// against torchrun's 0.1 % (docs/benchmarks.md): the node's state and the
// workers' key-value store live in the agent's memory instead.
func (a *Agent) openRendezvous(ctx context.Context, runID string) (*joined, error) {
	cfg := a.cfg.Rendezvous
	if !cfg.Dynamic || cfg.Standalone {
		return &joined{
			rz: &rdzv.Static{NodeRank: cfg.NodeRank, NNodes: cfg.NNodesMax, NProc: a.cfg.NProcPerNode,
				MaxRestarts: a.cfg.MaxRestarts, MasterAddr: a.masterAddr(), MasterPort: cfg.MasterPort},
			nodeLocalKV: cfg.NNodesMax > 1,
			close:       func() {},
		}, nil
	}
	if err := rdzv.CheckID(runID); err != nil {
		return nil, err
	}
	if cfg.Token == "" && cfg.NNodesMax > 1 {
		// As torchrun's store allows; said once, so nobody believes otherwise.
		a.log.Warn("no --rdzv-token: anyone who can reach the rendezvous store can read this job's keys and disrupt it " +
			"(stop its workers, end it); set --rdzv-token on every node, and use TLS (--rdzv-conf) across untrusted networks")
	}
	sec, err := a.storeSecurity()
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
	closeAll := func() {
		switch {
		case reps != nil:
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := reps.Close(ctx); err != nil {
				a.log.Info("store member not handed over; the others replace it once its lease ends", "err", err)
			}
			cancel()
		case srv != nil:
			srv.Close()
		}
		if cli != nil {
			cli.Close()
		}
		sec.close()
	}
	fail := func(err error) (*joined, error) {
		closeAll()
		return nil, err
	}
	replicated := !cfg.External && cfg.NNodesMax >= storeReplicas
	srv, endpoints, err := a.hostStore(ctx, sec, replicated)
	if err != nil {
		return fail(err)
	}
	if cli, err = a.dialStore(ctx, endpoints, srv != nil, sec.client); err != nil {
		return fail(err)
	}
	addr, err := a.localAddr(endpoints[0])
	if err != nil {
		return fail(err)
	}
	prefix := rdzv.Prefix(cfg.Prefix, runID)
	var keeper func() bool
	if replicated {
		if reps, err = a.replicate(cli, srv, sec, prefix, addr); err != nil {
			return fail(err)
		}
		keeper = reps.Keeper
	}
	host, _ := os.Hostname()
	e, err := rdzv.Open(ctx, cli, rdzv.Config{
		JobID: runID, Prefix: prefix, Hosted: srv != nil, Keeper: keeper, Endpoint: strings.Join(endpoints, ","),
		Host: host, Addr: addr, NProc: a.cfg.NProcPerNode, GPUs: a.nodeGPUs(),
		NNodesMin: cfg.NNodesMin, NNodesMax: cfg.NNodesMax, MaxRestarts: a.cfg.MaxRestarts, Token: cfg.Token,
		JoinTimeout: cfg.JoinTimeout, LastCall: cfg.LastCall, TTL: cfg.TTL, MasterPort: cfg.MasterPort,
		StoreTimeout: cfg.StoreTimeout, Logger: a.log,
	})
	if err != nil {
		return fail(err)
	}
	return &joined{
		rz:       e,
		kv:       store.NewKV(cli, rdzv.KVPrefix(prefix)),
		endpoint: strings.Join(endpoints, ","),
		cli:      cli,
		close: func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			e.Drain(ctx)
			cancel()
			e.Close()
			closeAll()
		},
	}, nil
}

// hostStore starts the embedded store when this agent should host it,
// and returns it (nil when it does not) with the endpoints to dial.
func (a *Agent) hostStore(ctx context.Context, sec *storeSecurity, replicated bool) (*store.Server, []string, error) {
	cfg := a.cfg.Rendezvous
	endpoints := cfg.Endpoints
	hostIt, err := a.shouldHost(endpoints)
	if err != nil || !hostIt {
		return nil, endpoints, err
	}
	// etcd binds only to IP addresses: a host name (the usual
	// --rdzv-endpoint $(hostname):29400) becomes the local address it
	// resolves to.
	addr, err := bindAddr(stripScheme(endpoints[0]))
	if err != nil {
		return nil, nil, err
	}
	scfg := store.ServerConfig{ClientAddr: addr, Logger: a.log.With("component", "etcd"), TLS: sec.server, PeerTLS: sec.peer}
	if replicated {
		// Members that join later dial this one's peer URL: a real port
		// on the address the other agents reach it at.
		host, _, _ := net.SplitHostPort(addr)
		if scfg.PeerAddr, err = store.FreeAddr(host); err != nil {
			return nil, nil, err
		}
	}
	srv, err := store.Start(ctx, scfg)
	switch {
	case errors.Is(err, store.ErrAddrInUse):
		// Another agent on this host started it first: be its client.
		a.log.Info("rendezvous store already hosted on this host; joining it as a client", "endpoint", endpoints[0])
		return nil, endpoints, nil
	case err != nil:
		return nil, nil, fmt.Errorf("host the rendezvous store: %w", err)
	}
	a.log.Info("hosting the rendezvous store (embedded etcd)", "endpoint", srv.Endpoint())
	return srv, []string{srv.Endpoint()}, nil
}

// dialStore connects to the store. The agent that hosts it may start
// after this one, as with torchrun's c10d: unless this agent hosts it,
// keep trying for the join timeout.
func (a *Agent) dialStore(ctx context.Context, endpoints []string, hosted bool, tlsFiles *store.TLSFiles) (*store.Client, error) {
	deadline := time.Now().Add(a.cfg.Rendezvous.JoinTimeout)
	for {
		cli, err := store.Dial(ctx, store.ClientConfig{Endpoints: endpoints, TLS: tlsFiles, Logger: a.log,
			FailFastAfter: cmp.Or(a.cfg.Rendezvous.StoreTimeout, rdzv.DefaultStoreTimeout)})
		if err == nil {
			return cli, nil
		}
		if store.Refused(err) {
			return nil, fmt.Errorf("%w: the store and this agent do not accept each other's TLS; is --rdzv-token the same on every node (and --rdzv-conf's TLS files right)?", err)
		}
		if ctx.Err() != nil || time.Now().After(deadline) || hosted {
			return nil, err
		}
		a.log.Warn("rendezvous store not reachable yet; retrying", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// shouldHost decides whether this agent starts the embedded store: with
// c10d when is_host says so or the endpoint is an address of this host;
// with an external etcd never.
func (a *Agent) shouldHost(endpoints []string) (bool, error) {
	cfg := a.cfg.Rendezvous
	switch {
	case cfg.External:
		return false, nil
	case cfg.IsHost != nil:
		return *cfg.IsHost, nil
	}
	host, _, err := net.SplitHostPort(stripScheme(endpoints[0]))
	if err != nil {
		return false, fmt.Errorf("--rdzv-endpoint %s: %w", endpoints[0], err)
	}
	return localIP(host) != nil, nil
}

func stripScheme(ep string) string {
	if u, err := url.Parse(ep); err == nil && u.Host != "" {
		return u.Host
	}
	return ep
}

// localIP returns the address of this machine that host names (loopback,
// or an address of one of its interfaces), or nil.
func localIP(host string) net.IP {
	ips, err := net.LookupIP(host)
	if err != nil {
		return nil
	}
	addrs, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() {
			return ip
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return ip
			}
		}
	}
	return nil
}

// bindAddr turns an endpoint host:port into an IP:port to listen on.
func bindAddr(endpoint string) (string, error) {
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return "", fmt.Errorf("--rdzv-endpoint %s: %w", endpoint, err)
	}
	if net.ParseIP(host) != nil || host == "localhost" {
		return endpoint, nil
	}
	ip := localIP(host)
	if ip == nil {
		return "", fmt.Errorf("--rdzv-endpoint %s: %s is not an address of this host (set is_host=false in --rdzv-conf)", endpoint, host)
	}
	return net.JoinHostPort(ip.String(), port), nil
}

// localAddr is the address the other nodes reach this one at: --local-addr,
// or the source address this host uses to reach the store, which is on a
// network the other nodes share (loopback when the store is).
func (a *Agent) localAddr(endpoint string) (string, error) {
	if a.cfg.Rendezvous.LocalAddr != "" {
		return a.cfg.Rendezvous.LocalAddr, nil
	}
	c, err := net.Dial("udp", stripScheme(endpoint)) // sends nothing: it only picks a route
	if err != nil {
		return "", fmt.Errorf("find this node's address toward %s (set --local-addr): %w", endpoint, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}
