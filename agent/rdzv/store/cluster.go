package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
)

// Cluster is a set of embedded etcd members on loopback forming one cluster.
// It stands in for an external etcd cluster in tests and benchmarks.
type Cluster struct {
	members   []*Server
	endpoints []string
	stopped   []bool
	mu        sync.Mutex // guards stopped
}

// StartCluster starts n members on 127.0.0.1 with free ports and waits until
// every one serves clients.
func StartCluster(ctx context.Context, n int, logger *slog.Logger) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("start etcd cluster: %d members", n)
	}
	// Peer ports must be known before any member starts (each is in every
	// member's initial cluster), so they are picked by listening and closing,
	// and another process may grab one in between: try again with new ports.
	var err error
	for range 3 {
		var c *Cluster
		if c, err = startCluster(ctx, n, logger); err == nil {
			return c, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

func startCluster(ctx context.Context, n int, logger *slog.Logger) (*Cluster, error) {
	peers, err := freeAddrs("127.0.0.1", n)
	if err != nil {
		return nil, fmt.Errorf("start etcd cluster: %w", err)
	}
	initial := make([]string, n)
	for i, p := range peers {
		initial[i] = fmt.Sprintf("m%d=http://%s", i, p)
	}
	cfgs := make([]ServerConfig, n)
	for i := range cfgs {
		cfgs[i] = ServerConfig{
			ClientAddr:     "127.0.0.1:0",
			PeerAddr:       peers[i],
			Name:           fmt.Sprintf("m%d", i),
			Logger:         logger,
			initialCluster: strings.Join(initial, ","),
			clusterToken:   "ddp-agent-" + peers[0],
		}
	}

	c := &Cluster{stopped: make([]bool, n)}
	for i, cfg := range cfgs {
		s, err := launch(cfg)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("start etcd cluster member %d: %w", i, err), c.Close())
		}
		c.members = append(c.members, s)
		c.endpoints = append(c.endpoints, s.Endpoint())
	}
	// No member is ready before a quorum is up, so wait only once all run.
	for i, s := range c.members {
		if err := s.waitReady(ctx); err != nil {
			return nil, errors.Join(fmt.Errorf("start etcd cluster member %d: %w", i, err), c.Close())
		}
	}
	return c, nil
}

// Endpoints returns every member's client endpoint (host:port), stopped
// members included.
func (c *Cluster) Endpoints() []string { return append([]string(nil), c.endpoints...) }

// Stop stops member i; the others keep serving while they keep a quorum.
// Stopping a stopped member does nothing.
func (c *Cluster) Stop(i int) error {
	if i < 0 || i >= len(c.members) {
		return fmt.Errorf("stop etcd cluster member %d: out of range [0, %d)", i, len(c.members))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped[i] {
		return nil
	}
	c.stopped[i] = true
	if err := c.members[i].Close(); err != nil {
		return fmt.Errorf("stop etcd cluster member %d: %w", i, err)
	}
	return nil
}

// Close stops every member still running.
func (c *Cluster) Close() error {
	var errs []error
	for i := range c.members {
		errs = append(errs, c.Stop(i))
	}
	return errors.Join(errs...)
}

// freeAddrs picks n different free ports on host, as FreeAddr does, each
// held until all are picked: one closed at once was free again for the
// next pick, and a cluster of a CI run got the same peer port twice
// ("initial cluster ... has duplicate url").
func freeAddrs(host string, n int) ([]string, error) {
	addrs := make([]string, n)
	for i := range addrs {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("pick a free port on %s: %w", host, err)
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
	}
	return addrs, nil
}

// FreeAddr returns host with a port that was free a moment ago, for an
// address that must be known before its listener starts (a member's peer
// URL is in every member's initial cluster); another process may take it
// in between, which the callers' starts report.
func FreeAddr(host string) (string, error) {
	addrs, err := freeAddrs(host, 1)
	if err != nil {
		return "", err
	}
	return addrs[0], nil
}
