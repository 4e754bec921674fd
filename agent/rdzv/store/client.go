package store

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// defaultDialTimeout bounds Dial's reachability check when the caller sets
// none.
const defaultDialTimeout = 5 * time.Second

// TLSFiles names PEM files for TLS. For a client: CAFile alone verifies the
// server; CertFile and KeyFile add a client certificate (mutual TLS). For a
// server: CertFile and KeyFile are required, and CAFile makes client
// certificates signed by that CA mandatory.
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
	// ChainOnly: a client checks that the server's certificate chains to
	// CAFile, not which names it holds. For the job's own CA (jobtls.go),
	// where a certificate is the proof of the token, whatever name or
	// address (an alias, NAT, a service name) the store was dialled by.
	ChainOnly bool
}

// ClientConfig configures Dial.
type ClientConfig struct {
	Endpoints          []string      // host:port, or URLs (http://, https://)
	TLS                *TLSFiles     // nil = plain; with only CAFile = server-auth TLS; cert+key = mutual
	Username, Password string        // etcd auth, optional
	DialTimeout        time.Duration // bounds the reachability check; 0 = 5 s
	Logger             *slog.Logger  // the client's warnings go here; nil = discard
	// FailFastAfter: once no member has been connected for this long,
	// every request fails at once with ErrUnreachable; 0 = never.
	FailFastAfter time.Duration
	// CutFrozen: probe every member and cut the connections to one that
	// stops answering while another answers (frozen.go). For the agent's
	// long-lived client; a one-shot command needs no probes.
	CutFrozen bool
	// RefusedIsFinal: a refused connection fails Dial at once. For a
	// one-shot command, to which nothing listening is the answer; the
	// agent retries it, as the store may still be starting.
	RefusedIsFinal bool
}

// Client is a connection to the rendezvous store. It is what the agent
// holds and hands to rdzv.Open, rdzv.ReadStatus and NewKV; the etcd client
// underneath stays inside agent/rdzv, so no other package of the agent
// speaks etcd's API. Safe for concurrent use; whoever dialled it closes it.
type Client struct {
	etcd  *clientv3.Client
	reach *reach
	stop  context.CancelFunc
	// eps is held to change the endpoints and to dial one: etcd's
	// Client.Dial reads them without the client's own lock (client/v3
	// v3.7.3, client.go dial), and the freeze watch dials while the replica
	// manager changes them (a data race the race detector caught in CI).
	eps *sync.Mutex
}

// NewClient wraps an etcd client made elsewhere, such as one of a store
// that is not there (Dial refuses to make that).
func NewClient(cli *clientv3.Client) *Client {
	return &Client{etcd: cli, reach: &reach{}, stop: func() {}, eps: &sync.Mutex{}}
}

// SetEndpoints points the client at eps (under the lock its dials take).
func (c *Client) SetEndpoints(eps ...string) {
	c.eps.Lock()
	defer c.eps.Unlock()
	c.etcd.SetEndpoints(eps...)
}

// DownFor is how long no member of the store has been connected; 0 while
// one is.
func (c *Client) DownFor() time.Duration { return c.reach.downFor() }

// Membership is the etcd client underneath, for the rendezvous (agent/rdzv) and
// for tools that instrument its requests; it is closed with c.
func (c *Client) Etcd() *clientv3.Client { return c.etcd }

// Close closes the connection: every watch and lease keep-alive on it ends.
func (c *Client) Close() error {
	c.stop()
	return c.etcd.Close()
}

// Dial connects to the store and checks that it answers before returning, so
// a wrong address or dead store fails here with a clear error rather than
// later as a hung rendezvous. ctx bounds only the dial: the client outlives
// it, and the caller closes it.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("dial rendezvous store: no endpoints")
	}
	where := strings.Join(cfg.Endpoints, ",")
	timeout := cfg.DialTimeout
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}

	scheme := "http://"
	var tlsCfg *tls.Config
	if cfg.TLS != nil {
		var err error
		if tlsCfg, err = cfg.TLS.clientConfig(); err != nil {
			return nil, fmt.Errorf("dial rendezvous store at %s: %w", where, err)
		}
		scheme = "https://"
	}
	eps := make([]string, len(cfg.Endpoints))
	for i, ep := range cfg.Endpoints {
		if !strings.Contains(ep, "://") {
			ep = scheme + ep
		}
		eps[i] = ep
	}

	rc := &reach{after: cfg.FailFastAfter}
	cn := newConns()
	// clientv3.New does not connect (except to fetch an auth token, bounded
	// by DialTimeout), so the check below is what proves the store is there.
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		TLS:         tlsCfg,
		Username:    cfg.Username,
		Password:    cfg.Password,
		DialTimeout: timeout,
		// A member whose host vanished without a reset (powered off,
		// partitioned) would otherwise hold the connection, and the
		// lease's keep-alive stream with it, until TCP gives up minutes
		// later; pings find it within seconds and the client moves on.
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		PermitWithoutStream:  true,
		Logger:               zapLogger(cfg.Logger),
		// Inside etcd's retrying interceptor (which it installs first), so
		// that it sees ErrUnreachable and does not retry.
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(rc.intercept), grpc.WithContextDialer(cn.dial)},
	})
	if err != nil {
		// With a username, New authenticates, and a dead store shows up
		// here as a timeout.
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("rendezvous store at %s unreachable after %v: %w", where, timeout, err)
		}
		return nil, fmt.Errorf("dial rendezvous store at %s: %w", where, err)
	}

	if err := checkReachable(ctx, cli, timeout, cfg.RefusedIsFinal); err != nil {
		cli.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("dial rendezvous store at %s: %w", where, ctx.Err())
		}
		if cfg.TLS == nil && strings.Contains(err.Error(), "server preface") {
			err = fmt.Errorf("%w (does the store require TLS?)", err)
		}
		if Refused(err) {
			return nil, fmt.Errorf("rendezvous store at %s refused the connection: %w", where, err)
		}
		if cfg.RefusedIsFinal && NothingListens(err) {
			return nil, fmt.Errorf("nothing listens at %s (connection refused): %w", where, err)
		}
		if cn.accepted() {
			// Not unreachable: a program took the connection and said
			// nothing a store says (torch's TCPStore, a stopped process).
			return nil, fmt.Errorf("rendezvous store at %s accepted the connection but gave no answer within %v: %w", where, timeout, err)
		}
		return nil, fmt.Errorf("rendezvous store at %s unreachable after %v: %w", where, timeout, err)
	}
	fctx, stop := context.WithCancel(context.Background())
	go rc.follow(fctx, cli.ActiveConnection())
	epsMu := &sync.Mutex{}
	if cfg.CutFrozen {
		log := cfg.Logger
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		fw := &freezeWatch{cli: cli, dialMu: epsMu, conns: cn, log: log, heard: map[string]time.Time{}, cut: map[string]bool{}}
		go fw.run(fctx)
	}
	return &Client{etcd: cli, reach: rc, stop: stop, eps: epsMu}, nil
}

// checkReachable asks the store for its members, which needs a quorum (the
// request is linearizable) but no permissions, so it works for any user.
// It calls gRPC directly because clientv3 turns a deadline into a bare
// "context deadline exceeded", dropping gRPC's account of why it could not
// connect (connection refused, a TLS mismatch, ...), which is the useful
// part of the error.
//
// It asks without gRPC's wait-for-ready, again and again until timeout, so
// that each failure says why: a TLS refusal (a wrong token, no
// certificate) will not pass on a retry and is returned at once (it took
// the whole timeout, 5 s); a refused connection may be a store still
// starting, and is retried unless refusedIsFinal.
func checkReachable(ctx context.Context, cli *clientv3.Client, timeout time.Duration, refusedIsFinal bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cluster := pb.NewClusterClient(cli.ActiveConnection())
	for {
		_, err := cluster.MemberList(ctx, &pb.MemberListRequest{Linearizable: true})
		if err == nil || Refused(err) || (refusedIsFinal && NothingListens(err)) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// clientConfig builds the client side of TLSFiles.
func (f *TLSFiles) clientConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CertFile != "" || f.KeyFile != "" {
		cert, err := f.keyPair()
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if f.CAFile != "" {
		pool, err := f.caPool()
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
		if f.ChainOnly {
			c.InsecureSkipVerify = true // the names; the chain is verified below
			c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error { return verifyChain(raw, pool) }
		}
	}
	return c, nil
}

// verifyChain checks that the peer's certificate chains to pool, for a
// server certificate.
func verifyChain(raw [][]byte, pool *x509.CertPool) error {
	if len(raw) == 0 {
		return errors.New("x509: the store sent no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return fmt.Errorf("x509: the store's certificate: %w", err)
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

// checkServer checks the server side of TLSFiles up front, because etcd's
// own errors for bad files come late and do not always name them.
func (f *TLSFiles) checkServer() error {
	if f.CertFile == "" || f.KeyFile == "" {
		return errors.New("etcd server TLS: both a certificate and a key file are required")
	}
	if _, err := f.keyPair(); err != nil {
		return fmt.Errorf("etcd server TLS: %w", err)
	}
	if f.CAFile != "" {
		if _, err := f.caPool(); err != nil {
			return fmt.Errorf("etcd server TLS: %w", err)
		}
	}
	return nil
}

func (f *TLSFiles) keyPair() (tls.Certificate, error) {
	if f.CertFile == "" || f.KeyFile == "" {
		return tls.Certificate{}, fmt.Errorf("TLS certificate %q and key %q: both or neither must be set", f.CertFile, f.KeyFile)
	}
	// Read the files ourselves so that an error names the file at fault;
	// tls.LoadX509KeyPair does not say which of the two it was.
	certPEM, err := os.ReadFile(f.CertFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("TLS certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(f.KeyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("TLS key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("TLS certificate %s with key %s: %w", f.CertFile, f.KeyFile, err)
	}
	return cert, nil
}

func (f *TLSFiles) caPool() (*x509.CertPool, error) {
	pem, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, fmt.Errorf("TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA %s: no PEM certificates in file", f.CAFile)
	}
	return pool, nil
}

// NothingListens says whether err is a connection refused at the TCP level:
// no store (nor anything else) listens at the address, or not yet. A
// non-wait-for-ready request fails so only once every endpoint has.
func NothingListens(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection refused")
}

// Refused reports whether a Dial error says the store and this client do
// not agree on TLS (no certificate, one of another CA, plain against TLS),
// rather than that the store is not there yet: trying again cannot help.
// gRPC keeps only the text of the handshake's error, hence the markers.
func Refused(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	for _, m := range []string{"x509:", "tls:", "server preface", "bad certificate", "certificate required"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}
