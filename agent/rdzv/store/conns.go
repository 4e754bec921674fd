package store

import (
	"context"
	"net"
	"strings"
	"sync"
)

// conns dials the client's connections and keeps them by address, so that
// those to a member found frozen can be cut (see frozen.go). gRPC offers
// no way to close one address's transport at once: dropping the address
// from the client's endpoints drains it gracefully, and the watches and
// lease keep-alive streams already on it keep waiting on a member that
// will not answer.
type conns struct {
	mu     sync.Mutex
	byAddr map[string]map[*trackedConn]struct{}
	made   int // connections ever made: a store that never answers may still have accepted
}

// accepted reports whether any dial reached a listener.
func (c *conns) accepted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.made > 0
}

func newConns() *conns {
	return &conns{byAddr: map[string]map[*trackedConn]struct{}{}}
}

// dial is the client's dialer (grpc.WithContextDialer). addr is what
// etcd's resolver hands gRPC: host:port, or unix:path for a socket.
func (c *conns) dial(ctx context.Context, addr string) (net.Conn, error) {
	network, where := "tcp", addr
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, where = "unix", strings.TrimPrefix(p, "//")
	}
	nc, err := (&net.Dialer{}).DialContext(ctx, network, where)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: nc, owner: c, addr: addr}
	c.mu.Lock()
	c.made++
	if c.byAddr[addr] == nil {
		c.byAddr[addr] = map[*trackedConn]struct{}{}
	}
	c.byAddr[addr][tc] = struct{}{}
	c.mu.Unlock()
	return tc, nil
}

// cut closes every connection to addr and says how many there were. Their
// streams and requests fail at once, and etcd's client resumes the
// watches and keep-alives on a member that answers.
func (c *conns) cut(addr string) int {
	c.mu.Lock()
	var open []*trackedConn
	for tc := range c.byAddr[addr] {
		open = append(open, tc)
	}
	c.mu.Unlock()
	for _, tc := range open {
		tc.Close()
	}
	return len(open)
}

// trackedConn is a connection that leaves its conns when closed.
type trackedConn struct {
	net.Conn
	owner *conns
	addr  string
	once  sync.Once
}

func (t *trackedConn) Close() error {
	t.once.Do(func() {
		t.owner.mu.Lock()
		delete(t.owner.byAddr[t.addr], t)
		if len(t.owner.byAddr[t.addr]) == 0 {
			delete(t.owner.byAddr, t.addr)
		}
		t.owner.mu.Unlock()
	})
	return t.Conn.Close()
}
