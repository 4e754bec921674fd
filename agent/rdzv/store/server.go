// Package store is the etcd plumbing behind multi-node rendezvous: an
// embedded etcd that one agent hosts, a client dialer, and a KV for the
// control socket backed by etcd.
package store

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"

	"github.com/ddp-agent/ddp-agent/internal/tempdir"
)

// ErrAddrInUse is returned by Start when the client address is already bound
// by someone else. The caller takes it to mean another agent on this host
// already hosts the store, and becomes a plain client of it.
var ErrAddrInUse = errors.New("address already in use")

const (
	// readyTimeout bounds the wait for a started server to serve, whatever
	// the caller's ctx allows: a healthy member is ready in well under a
	// second, so a longer wait means it never will be.
	readyTimeout = 30 * time.Second

	defaultName = "ddp-agent"

	// maxTxnOps lets one transaction touch every rank of a large job (etcd's
	// default is 128).
	maxTxnOps = 4096

	// The store lives as long as its agent, so there is nothing to gain from
	// a long raft log: snapshot often to keep memory small.
	snapshotCount = 1000

	// compactionRevisions is how many revisions auto-compaction keeps, so a
	// long job that goes through many generations does not grow the store
	// without bound. It is far more than one generation writes.
	compactionRevisions = "5000"
)

// ServerConfig configures an embedded etcd.
type ServerConfig struct {
	ClientAddr string       // host:port to serve clients on; port 0 = pick a free one; "" = 127.0.0.1:0
	PeerAddr   string       // host:port for the peer URL; "" = 127.0.0.1 with a free port
	Dir        string       // data dir; "" = a fresh temp dir removed by Close
	Name       string       // member name; "" = "ddp-agent"
	Logger     *slog.Logger // etcd's own logs go here (warn and above, as slog records); nil = discard
	TLS        *TLSFiles    // optional server TLS for clients (cert, key, optional CA to require client certs)
	PeerTLS    *TLSFiles    // optional TLS between members (cert, key, and a CA that every peer's certificate must chain to)
	// QuotaBytes bounds the store's backend (etcd's --quota-backend-bytes);
	// 0 = etcd's 2 GiB. Past it etcd refuses writes until an operator
	// frees space: the agents then fail the job (rdzv.ErrStoreFull).
	QuotaBytes int64

	// Set by StartCluster only. initialCluster ("name=peerURL,...") is the
	// whole cluster this member bootstraps with; "" = a cluster of this
	// member alone. clusterToken keeps members of different clusters from
	// talking to each other.
	initialCluster string
	clusterToken   string
	// existing: this member joins a running cluster (added as a learner
	// by JoinCluster), whose members initialCluster lists.
	existing bool
}

// Server is a running embedded etcd member.
type Server struct {
	etcd     *embed.Etcd
	endpoint string
	tempDir  *tempdir.Dir // removed by Close; nil when the caller chose Dir
	closing  *atomic.Bool // set by Close to quieten etcd's shutdown logs

	closeOnce sync.Once
	closeErr  error
}

// Start starts an embedded etcd and waits until it serves clients. When the
// client address is taken it returns an error matching ErrAddrInUse without
// starting anything.
func Start(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	s, err := launch(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// launch starts etcd without waiting for it to be ready, so that the members
// of a cluster can be started together (none is ready before a quorum is up).
func launch(cfg ServerConfig) (_ *Server, err error) {
	clientAddr, clientHost, clientPort, err := clientAddress(cfg.ClientAddr)
	if err != nil {
		return nil, err
	}
	peerAddr, err := peerAddress(cfg.PeerAddr)
	if err != nil {
		return nil, err
	}
	scheme := "http"
	var tlsInfo transport.TLSInfo
	if cfg.TLS != nil {
		if err := cfg.TLS.checkServer(); err != nil {
			return nil, err
		}
		scheme = "https"
		tlsInfo = transport.TLSInfo{
			CertFile:       cfg.TLS.CertFile,
			KeyFile:        cfg.TLS.KeyFile,
			TrustedCAFile:  cfg.TLS.CAFile,
			ClientCertAuth: cfg.TLS.CAFile != "",
			// As for peers: the CA's signature admits a client.
			SkipClientSANVerify: true,
		}
	}

	peerScheme := "http"
	var peerTLS transport.TLSInfo
	if cfg.PeerTLS != nil {
		if err := cfg.PeerTLS.checkServer(); err != nil {
			return nil, fmt.Errorf("peer %w", err)
		}
		if cfg.PeerTLS.CAFile == "" {
			return nil, errors.New("etcd peer TLS: a CA is required, to authenticate the peers")
		}
		peerScheme = "https"
		peerTLS = transport.TLSInfo{
			CertFile: cfg.PeerTLS.CertFile, KeyFile: cfg.PeerTLS.KeyFile, TrustedCAFile: cfg.PeerTLS.CAFile,
			ClientCertAuth: true,
			// The CA's signature is what admits a peer; its address need
			// not match a name in its certificate (NAT, several NICs).
			SkipClientSANVerify: true,
		}
	}

	s := &Server{}
	dir := cfg.Dir
	if dir == "" {
		log := cfg.Logger
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		// Those of agents SIGKILLed before their guard could run, or
		// without one: tens to hundreds of MiB each.
		removed, err := tempdir.RemoveStale(os.TempDir(), []string{tempdir.Etcd}, time.Now())
		if len(removed) > 0 {
			log.Info("removed etcd data dirs of agents that are gone", "dirs", removed)
		}
		if err != nil {
			log.Warn("remove the etcd data dirs of agents that are gone", "err", err)
		}
		if s.tempDir, err = tempdir.Make("", tempdir.Etcd); err != nil {
			return nil, fmt.Errorf("etcd data dir: %w", err)
		}
		dir = s.tempDir.Path
	}
	defer func() {
		if err != nil {
			s.tempDir.Remove()
		}
	}()

	clientURL := url.URL{Scheme: scheme, Host: clientAddr}
	peerURL := url.URL{Scheme: peerScheme, Host: peerAddr}
	ec := embedConfig(cfg, dir, clientURL, peerURL)
	lg, closing := serverZapLogger(cfg.Logger)
	s.closing = closing
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	ec.ClientTLSInfo = tlsInfo
	ec.PeerTLSInfo = peerTLS

	e, err := embed.StartEtcd(ec)
	if err != nil {
		// Another agent may have bound the port between the probe and now:
		// two agents on one host starting together is the common case.
		if clientPort != "0" && errors.Is(err, syscall.EADDRINUSE) &&
			errors.Is(probeAddr(clientAddr), syscall.EADDRINUSE) {
			return nil, fmt.Errorf("etcd client address %s: %w", clientAddr, ErrAddrInUse)
		}
		return nil, fmt.Errorf("start etcd on %s: %w", clientURL.String(), err)
	}
	s.etcd = e
	if cfg.initialCluster == "" {
		go campaignAlone(e.Server)
	}

	// The real port, when port 0 was asked for.
	_, realPort, err := net.SplitHostPort(e.Clients[0].Addr().String())
	if err != nil {
		s.closing.Store(true)
		e.Close()
		return nil, fmt.Errorf("etcd client listener address: %w", err)
	}
	s.endpoint = net.JoinHostPort(dialHost(clientHost), realPort)
	return s, nil
}

// clientAddress resolves ServerConfig.ClientAddr and, for a fixed port,
// checks that it is free.
func clientAddress(addr string) (hostPort, host, port string, err error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	host, port, err = splitAddr(addr)
	if err != nil {
		return "", "", "", fmt.Errorf("etcd client address: %w", err)
	}
	hostPort = net.JoinHostPort(host, port)
	// A fixed port is the one agents on a host agree on, so finding it bound
	// is the expected way to learn that another agent hosts the store. Probe
	// before starting etcd: it is much cheaper than failing half-way through
	// etcd's start, and its error is unambiguous.
	if port != "0" {
		if err := probeAddr(hostPort); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return "", "", "", fmt.Errorf("etcd client address %s: %w", hostPort, ErrAddrInUse)
			}
			return "", "", "", fmt.Errorf("etcd client address %s: %w", hostPort, err)
		}
	}
	return hostPort, host, port, nil
}

// peerAddress resolves ServerConfig.PeerAddr and, for a fixed port, checks
// that it is free.
func peerAddress(addr string) (string, error) {
	if addr == "" {
		// A one-member cluster never dials its own peer URL, so port 0 is
		// fine and avoids racing other processes for a port picked early.
		// StartCluster, whose members do dial each other, passes real ports.
		addr = "127.0.0.1:0"
	}
	host, port, err := splitAddr(addr)
	if err != nil {
		return "", fmt.Errorf("etcd peer address: %w", err)
	}
	addr = net.JoinHostPort(host, port)
	if port != "0" {
		if err := probeAddr(addr); err != nil {
			// Not ErrAddrInUse: a taken peer port says nothing about the
			// client port other agents look for.
			return "", fmt.Errorf("etcd peer address %s: %w", addr, err)
		}
	}
	return addr, nil
}

// embedConfig is etcd's configuration for one member serving clients at
// clientURL and peers at peerURL, with its data in dir.
func embedConfig(cfg ServerConfig, dir string, clientURL, peerURL url.URL) *embed.Config {
	name := cfg.Name
	if name == "" {
		name = defaultName
	}
	ec := embed.NewConfig()
	ec.Name = name
	ec.Dir = dir
	ec.ListenClientUrls = []url.URL{clientURL}
	ec.AdvertiseClientUrls = []url.URL{clientURL}
	ec.ListenPeerUrls = []url.URL{peerURL}
	ec.AdvertisePeerUrls = []url.URL{peerURL}
	ec.InitialCluster = ec.InitialClusterFromName(name)
	if cfg.initialCluster != "" {
		ec.InitialCluster = cfg.initialCluster
	}
	ec.InitialClusterToken = cfg.clusterToken
	if ec.InitialClusterToken == "" {
		// etcd derives the member and cluster ids from the peer URLs and
		// this token alone: a store started again on the same address
		// would have the id of the one before, and a client could not
		// tell them apart (reach.go's ErrForeignCluster).
		ec.InitialClusterToken = "ddp-agent-" + rand.Text()
	}
	if cfg.existing {
		ec.ClusterState = embed.ClusterStateFlagExisting
	}
	if cfg.initialCluster == "" || cfg.existing {
		// etcd's default 100 ms tick, but the shortest election timeout it
		// allows (5 ticks): that keeps its minimum lease TTL at 1 s (1.5
		// election timeouts, rounded up) rather than 2 s. The tick is
		// what an idle store costs: every tick wakes two goroutines (the
		// ticker and raft's loop), so 10 ms ticks kept an idle agent at
		// about 1.5 % of a core. Startup does not wait for ticks: launch
		// makes a lone member campaign at once (campaignAlone). Members
		// that join it (replica.go) take the same timing: a lost leader
		// is replaced within about a second.
		ec.TickMs = 100
		ec.ElectionMs = 500
		// etcd's strict reconfiguration check refuses to add a member
		// until the leader has been connected to a quorum for 5 s: a
		// store growing from one member to three then sat at two (where
		// losing either loses it) for 5 s more, and a node lost then lost
		// the job. The replica manager keeps the discipline itself: it
		// adds learners (which never count against the quorum), etcd
		// still checks that a learner caught up before promoting it, it
		// removes only members whose agent is gone, and a handover is
		// skipped while another member is (replica.go).
		ec.StrictReconfigCheck = false
	}
	// The data dir is private to this process and dies with it; fsync would
	// only buy durability across a crash that loses the data anyway.
	ec.UnsafeNoFsync = true
	// Without fsync a backend commit is cheap, so every write transaction
	// commits when it ends (batch limit 1) instead of on a timer; the timer
	// then has nothing left to do and fires once a second (a 10 ms timer
	// cost an idle agent about 0.7 % of a core). Committing at once also
	// closes a startup race that fast elections otherwise hit: etcd writes
	// the raft term to the backend only on commit (every 100 ms by default),
	// and its storage version check, run as soon as the cluster version is
	// set, logs an error when it finds no term yet.
	ec.BackendBatchLimit = 1
	ec.BackendBatchInterval = time.Second
	ec.SnapshotCount = snapshotCount
	ec.SnapshotCatchUpEntries = snapshotCount
	ec.MaxTxnOps = maxTxnOps
	ec.QuotaBackendBytes = cfg.QuotaBytes
	ec.AutoCompactionMode = embed.CompactorModeRevision
	ec.AutoCompactionRetention = compactionRevisions
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Innermost of the server's interceptors: around the handler itself.
	ec.GRPCAdditionalServerOptions = []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(recoverUnary(log)), grpc.ChainStreamInterceptor(recoverStream(log)),
	}
	return ec
}

// waitReady waits until the member serves clients, it fails, or the wait is
// given up.
func (s *Server) waitReady(ctx context.Context) error {
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case <-s.etcd.Server.ReadyNotify():
		return nil
	case err := <-s.etcd.Err():
		return fmt.Errorf("etcd at %s failed while starting: %w", s.endpoint, err)
	case <-s.etcd.Server.StopNotify():
		return fmt.Errorf("etcd at %s stopped while starting", s.endpoint)
	case <-timer.C:
		return fmt.Errorf("etcd at %s not ready after %v", s.endpoint, readyTimeout)
	case <-ctx.Done():
		return fmt.Errorf("wait for etcd at %s: %w", s.endpoint, ctx.Err())
	}
}

// Endpoint returns the host:port clients dial, with the real port when port
// 0 was asked for. (etcd itself still advertises port 0 in its member list,
// since it learns the real port too late; clients must not sync their
// endpoints from it, which Dial's clients do not.)
func (s *Server) Endpoint() string { return s.endpoint }

// Close stops etcd and removes the data dir if Start created it. It is safe
// to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.etcd != nil {
			s.closing.Store(true)
			s.etcd.Close()
		}
		if err := s.tempDir.Remove(); err != nil {
			s.closeErr = fmt.Errorf("remove etcd data dir: %w", err)
		}
	})
	return s.closeErr
}

// CloseNow is Close without etcd's leadership transfer: for a job that is
// over, whose other members are gone or going. A leader's graceful stop
// first tries to hand its leadership to the peer connected longest and
// waits etcd's request timeout (~6 s) when that peer has just closed.
func (s *Server) CloseNow() error {
	if s.etcd != nil && s.etcd.Server != nil {
		s.closing.Store(true)
		s.etcd.Server.HardStop()
	}
	return s.Close()
}

// splitAddr splits host:port, taking an empty host to mean every interface
// (etcd wants an IP to bind to).
func splitAddr(addr string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		return "", "", err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", "", fmt.Errorf("address %q: bad port", addr)
	}
	port = strconv.FormatUint(p, 10) // so that "00" reads as "0"
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

// probeAddr reports whether addr can be listened on.
func probeAddr(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return l.Close()
}

// dialHost turns a bind host into one a local client can dial: a server
// bound to every interface is reachable on loopback.
func dialHost(host string) string {
	ip := net.ParseIP(host)
	switch {
	case ip == nil || !ip.IsUnspecified():
		return host
	case ip.To4() != nil:
		return "127.0.0.1"
	default:
		return "::1"
	}
}

// campaignAlone makes a lone member elect itself as soon as it has applied
// its bootstrap entries, rather than 1 to 5 ticks (100-500 ms) later, when
// etcd's single-member tick advance would. raft only campaigns on a MsgHup
// stepped locally (Node.Campaign, which etcd does not expose) or on its
// election tick; etcd's Process steps a message into raft, and raft takes
// a local message from the local append thread's id. A hup that comes too
// early (the bootstrap conf changes not applied yet) is turned down by raft
// with a warning, so it is sent once etcd has applied all it committed for
// two polls in a row, then each millisecond until the member leads, stops,
// or a second has passed (etcd's own election comes within 500 ms anyway).
func campaignAlone(srv *etcdserver.EtcdServer) {
	to, from := uint64(srv.MemberID()), uint64(raft.LocalAppendThread)
	hup := &raftpb.Message{Type: raftpb.MsgHup.Enum(), To: &to, From: &from}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	caughtUp := 0 // polls in a row that found everything committed applied
	for srv.Leader() == 0 {
		if applied := srv.AppliedIndex(); applied == 0 || applied < srv.CommittedIndex() {
			caughtUp = 0
		} else if caughtUp++; caughtUp >= 2 {
			// etcd applies before raft hears of it (Advance): give raft
			// a poll more, or it turns down the hup with a warning.
			if err := srv.Process(ctx, hup); err != nil {
				return
			}
		}
		select {
		case <-t.C:
		case <-srv.StopNotify():
			return
		case <-ctx.Done():
			return
		}
	}
}
