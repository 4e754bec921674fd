package join

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// This file finds the store: hosting it or dialing it, and this node's
// address toward it.

// hostStore starts the embedded store when this agent should host it,
// and returns it (nil when it does not) with the endpoints to dial, and
// whether it found the store's port taken as it went to host it.
func (o *opener) hostStore(ctx context.Context, sec *storeSecurity, replicated bool) (*store.Server, []string, bool, error) {
	cfg := o.cfg
	endpoints := cfg.Endpoints
	hostIt, err := o.shouldHost(endpoints)
	if err != nil || !hostIt {
		return nil, endpoints, false, err
	}
	// etcd binds only to IP addresses: a host name (the usual
	// --rdzv-endpoint $(hostname):29400) becomes the local address it
	// resolves to.
	addr, err := o.bindAddr(stripScheme(endpoints[0]))
	if err != nil {
		return nil, nil, false, err
	}
	scfg := store.ServerConfig{ClientAddr: addr, Logger: o.log.With("subsystem", "etcd"), TLS: sec.server, PeerTLS: sec.peer,
		QuotaBytes: cfg.StoreQuota}
	if replicated {
		// Members that join later dial this one's peer URL: a real port
		// on the address the other agents reach it at.
		host, _, _ := net.SplitHostPort(addr)
		if scfg.PeerAddr, err = store.FreeAddr(host); err != nil {
			return nil, nil, false, err
		}
	}
	srv, err := store.Start(ctx, scfg)
	switch {
	case errors.Is(err, store.ErrAddrInUse):
		// Another agent on this host started it first: be its client.
		o.log.Info("rendezvous store already hosted on this host; joining it as a client", "endpoint", endpoints[0])
		return nil, endpoints, true, nil
	case err != nil:
		return nil, nil, false, fmt.Errorf("host the rendezvous store: %w", err)
	}
	o.log.Info("hosting the rendezvous store (embedded etcd)", "endpoint", srv.Endpoint())
	return srv, []string{srv.Endpoint()}, false, nil
}

// strangerDials is how many failed dials of a store whose port this agent
// found taken, while something there still accepts connections, tell a
// program that is not a store from an agent's store still starting (up
// to about 5 s each; an agent's etcd answers within a second of binding
// its port).
const strangerDials = 3

// anotherProgram ends the error of a store's port that something other
// than a store holds.
const anotherProgram = "another program holds the port (torchrun's c10d store uses 29400 too); " +
	"give the job's --rdzv-endpoint another port, or stop that program"

// errHostItNow: the store's endpoint names this host now, which it did
// not when this agent decided not to host the store.
var errHostItNow = errors.New("the rendezvous endpoint now resolves to this host")

// dialStore connects to the store. The agent that hosts it may start
// after this one, as with torchrun's c10d: unless this agent hosts it,
// keep trying for the join timeout. taken: this agent found the store's
// port on this host taken as it went to host it; if whatever holds it
// accepts connections but never answers as a store, that is another
// program (a torchrun c10d store on 29400), and waiting would not help.
//
// Between tries, an agent that decided not to host the store by its
// endpoint's name asks again (errHostItNow): a Kubernetes pod's own name
// under a headless Service resolves only once the Service's DNS has its
// record, which can be after the pod starts, and pod 0, deciding once,
// waited for a store that nobody would host.
func (o *opener) dialStore(ctx context.Context, endpoints []string, hosted, taken bool, tlsFiles *store.TLSFiles) (*store.Client, error) {
	deadline := time.Now().Add(o.cfg.JoinTimeout)
	for failed := 1; ; failed++ {
		cli, err := store.Dial(ctx, store.ClientConfig{Endpoints: endpoints, TLS: tlsFiles, Logger: o.log,
			FailFastAfter: cmp.Or(o.cfg.StoreTimeout, rdzv.DefaultStoreTimeout), CutFrozen: true})
		if err == nil {
			return cli, nil
		}
		if store.Refused(err) {
			if addr := stripScheme(endpoints[0]); strings.Contains(err.Error(), "server preface") && !speaksTLS(ctx, addr) {
				return nil, fmt.Errorf("%w; what listens at %s answers neither as a ddp-agent rendezvous store (etcd) nor in TLS: %s",
					err, addr, anotherProgram)
			}
			return nil, fmt.Errorf("%w: the store and this agent do not accept each other's TLS; is --rdzv-token the same on every node (and --rdzv-conf's TLS files right)?", err)
		}
		if ctx.Err() != nil || time.Now().After(deadline) || hosted {
			return nil, err
		}
		if !taken {
			if hostIt, _ := o.shouldHost(endpoints); hostIt {
				return nil, errHostItNow
			}
		}
		if taken && failed >= strangerDials && accepts(ctx, stripScheme(endpoints[0])) {
			return nil, fmt.Errorf("%w; %s was taken when this agent went to host the store there, and what listens on it accepts connections "+
				"but has not answered as a ddp-agent rendezvous store (etcd) in %d tries: %s", err, endpoints[0], failed, anotherProgram)
		}
		o.log.Warn("rendezvous store not reachable yet; retrying", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// speaksTLS reports whether what listens at addr answers a TLS handshake,
// whatever it thinks of this client. gRPC's "server preface" error says
// only that the peer did not answer in HTTP/2: a store that wants TLS
// from a client without it, or another program (torch's TCPStore, a web
// server), which the TLS hint sent looking for tokens and certificates.
func speaksTLS(ctx context.Context, addr string) bool {
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second},
		Config: &tls.Config{InsecureSkipVerify: true}} // a probe of the protocol, not of whom to trust
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		c.Close()
		return true
	}
	var alert tls.AlertError
	return errors.As(err, &alert)
}

// accepts reports whether something listens at addr (host:port) and
// takes a TCP connection.
func accepts(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// shouldHost decides whether this agent starts the embedded store: for
// Hosted when is_host says so or the endpoint is an address of this host;
// for External never.
func (o *opener) shouldHost(endpoints []string) (bool, error) {
	cfg := o.cfg
	switch {
	case cfg.Backend == External:
		return false, nil
	case cfg.IsHost != nil:
		return *cfg.IsHost, nil
	}
	host, _, err := net.SplitHostPort(stripScheme(endpoints[0]))
	if err != nil {
		return false, fmt.Errorf("--rdzv-endpoint %s: %w", endpoints[0], err)
	}
	return o.localIP(host) != nil, nil
}

func stripScheme(ep string) string {
	if u, err := url.Parse(ep); err == nil && u.Host != "" {
		return u.Host
	}
	return ep
}

// localIP returns the address of this machine that host names (loopback,
// or an address of one of its interfaces), or nil.
func (o *opener) localIP(host string) net.IP {
	ips, err := o.lookupIP(host)
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
func (o *opener) bindAddr(endpoint string) (string, error) {
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return "", fmt.Errorf("--rdzv-endpoint %s: %w", endpoint, err)
	}
	if net.ParseIP(host) != nil || host == "localhost" {
		return endpoint, nil
	}
	ip := o.localIP(host)
	if ip == nil {
		return "", fmt.Errorf("--rdzv-endpoint %s: %s is not an address of this host (set is_host=false in --rdzv-conf)", endpoint, host)
	}
	return net.JoinHostPort(ip.String(), port), nil
}

// localAddr is the address the other nodes reach this one at: --local-addr,
// or the source address this host uses to reach the store, which is on a
// network the other nodes share (loopback when the store is).
func (o *opener) localAddr(endpoint string) (string, error) {
	if o.cfg.LocalAddr != "" {
		return o.cfg.LocalAddr, nil
	}
	c, err := net.Dial("udp", stripScheme(endpoint)) // sends nothing: it only picks a route
	if err != nil {
		return "", fmt.Errorf("find this node's address toward %s (set --local-addr): %w", endpoint, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}
