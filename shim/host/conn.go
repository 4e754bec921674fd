package host

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
)

// The handshake. The dialing rank sends a hello, the accepting rank checks
// it and answers with a reply; only then does the connection carry data.
//
//	hello: magic "DDPH", version u16, sender rank u32, world size u32,
//	       nonce length u8, nonce (the accepting endpoint's Nonce)
//	reply: magic "DDPH", version u16, status u8
//
// Integers are little-endian.
const (
	magic           = "DDPH"
	protocolVersion = 1
	helloLen        = 4 + 2 + 4 + 4 + 1
	replyLen        = 4 + 2 + 1
)

// Reply statuses.
const (
	statusOK byte = iota
	statusBadNonce
	statusBadRank
	statusBadVersion
)

var statusText = map[byte]string{
	statusOK:         "ok",
	statusBadNonce:   "wrong nonce (not the endpoint it was meant for)",
	statusBadRank:    "unexpected sender rank or world size",
	statusBadVersion: "unsupported protocol version",
}

// Connect builds the ring: it dials rank+1, accepts rank-1 on e, and returns
// once both connections have passed the handshake; peers[i] is rank i's
// PeerInfo and len(peers) is the world size. With cfg.SHM, when every rank
// has the same HostID, the ranks then agree on a shared-memory segment to
// carry the data (package shm), or on one segment per host and the
// hierarchy when they span hosts; if any rank cannot map its segment, none
// uses one. That choice of carrier (chooseCarrier) is made once, here.
//
// Connect consumes e: the listener is closed when it returns. It blocks
// until connected, until ctx is done or until cfg.Timeout passes, retrying
// the dial with backoff since peers start at different times; connections
// that fail the handshake (a stranger, a wrong nonce) are dropped without
// disturbing the others.
func Connect(ctx context.Context, e *Endpoint, rank int, peers []PeerInfo, cfg Config) (*Comm, error) {
	defer e.Close()
	n := len(peers)
	if n == 0 || rank < 0 || rank >= n {
		return nil, fmt.Errorf("connect: %w: rank %d of world size %d", failure.ErrInvalid, rank, n)
	}
	if peers[rank].Nonce != e.info.Nonce {
		return nil, fmt.Errorf("connect rank %d: %w: peers[%d] is not this endpoint", rank, failure.ErrInvalid, rank)
	}
	cfg = cfg.withDefaults()
	if n == 1 {
		return newComm(rank, n, nil, nil, newRingCarrier, cfg), nil
	}
	prev, next := (rank+n-1)%n, (rank+1)%n
	if peers[next].Addr == "" {
		return nil, fmt.Errorf("connect rank %d: %w: rank %d has no address", rank, failure.ErrInvalid, next)
	}

	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	type result struct {
		conn *net.TCPConn
		err  error
	}
	accepted, dialed := make(chan result, 1), make(chan result, 1)
	go func() {
		c, err := accept(ctx, e.ln, prev, n, e.info.Nonce, cfg.Logger)
		if err != nil {
			err = fmt.Errorf("accept rank %d: %w", prev, err)
		}
		accepted <- result{c, err}
	}()
	go func() {
		c, err := dial(ctx, peers[next], rank, n, cfg.Logger)
		if err != nil {
			err = fmt.Errorf("dial rank %d at %s: %w", next, peers[next].Addr, err)
		}
		dialed <- result{c, err}
	}()
	var recv, send *net.TCPConn
	var err error
	for range 2 {
		var r result
		select {
		case r = <-accepted:
			recv = r.conn
		case r = <-dialed:
			send = r.conn
		}
		switch {
		case r.err == nil:
		case err == nil:
			err = r.err
			cancel() // stop the other half
		case errors.Is(r.err, failure.ErrTimeout): // both halves ran out of time
			err = fmt.Errorf("%w; %w", err, r.err)
		}
	}
	for _, c := range []*net.TCPConn{recv, send} {
		if c != nil && err == nil {
			err = tune(c, cfg.LinkTimeout)
		}
	}
	var data func(*Comm) carrier
	if err == nil {
		data, err = chooseCarrier(ctx, e, send, recv, rank, peers, cfg)
	}
	if err != nil {
		for _, c := range []*net.TCPConn{recv, send} {
			if c != nil {
				c.Close()
			}
		}
		return nil, fmt.Errorf("connect rank %d: %w", rank, err)
	}
	c := newComm(rank, n, send, recv, data, cfg)
	cfg.Logger.Debug("host: ring connected", "rank", rank, "size", n, "transport", c.Transport(), "prev", recv.RemoteAddr(), "next", send.RemoteAddr())
	return c, nil
}

// dial connects to peer as rank of size and passes the handshake, retrying
// with backoff until ctx is done. A peer that answers but rejects the
// hello is an error at once.
func dial(ctx context.Context, peer PeerInfo, rank, size int, log *slog.Logger) (*net.TCPConn, error) {
	backoff := 10 * time.Millisecond
	for attempt := 1; ; attempt++ {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", peer.Addr)
		if err == nil {
			tc := c.(*net.TCPConn)
			err = clientHandshake(ctx, tc, rank, size, peer.Nonce)
			if err == nil && ctx.Err() == nil { // else ctx may have cut the handshake's deadline short
				return tc, nil
			}
			tc.Close()
			if errors.Is(err, failure.ErrPeer) {
				return nil, err
			}
		}
		log.Debug("host: dial", "addr", peer.Addr, "attempt", attempt, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctxError(ctx, err)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// accept accepts connections on ln until one passes the handshake as rank
// from of size, or ctx is done. Handshakes run concurrently, so a silent
// stranger does not hold up the real peer; they are all over when accept
// returns.
func accept(ctx context.Context, ln *net.TCPListener, from, size int, nonce string, log *slog.Logger) (*net.TCPConn, error) {
	ln.SetDeadline(time.Time{}) // an earlier accept on ln (the full ring's) left it in the past
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(ctx, func() { ln.SetDeadline(time.Unix(1, 0)) })
	var wg sync.WaitGroup
	won := make(chan *net.TCPConn, 1)
	var err error
	for {
		var c *net.TCPConn
		if c, err = ln.AcceptTCP(); err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := serverHandshake(ctx, c, from, size, nonce); err != nil || ctx.Err() != nil {
				if ctx.Err() == nil {
					log.Warn("host: rejected connection", "remote", c.RemoteAddr(), "err", err)
				}
				c.Close()
				return
			}
			select {
			case won <- c:
				cancel() // stop accepting
			default:
				c.Close() // a second connection claiming the same rank
			}
		}()
	}
	done := ctx.Err() // the parent's end, or a winner's cancel
	cancel()
	stop()
	wg.Wait()
	select {
	case c := <-won:
		return c, nil
	default:
	}
	if done != nil {
		return nil, ctxError(ctx, nil)
	}
	return nil, err
}

// clientHandshake sends the hello on c and reads the reply. A rejection or
// a reply that is not ours wraps failure.ErrPeer; an I/O error does not (the dialer
// retries those).
func clientHandshake(ctx context.Context, c *net.TCPConn, rank, size int, nonce string) error {
	if len(nonce) > 255 {
		return fmt.Errorf("%w: nonce of %d bytes", failure.ErrInvalid, len(nonce))
	}
	defer context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })()
	hello := make([]byte, helloLen, helloLen+len(nonce))
	copy(hello, magic)
	binary.LittleEndian.PutUint16(hello[4:], protocolVersion)
	binary.LittleEndian.PutUint32(hello[6:], uint32(rank))
	binary.LittleEndian.PutUint32(hello[10:], uint32(size))
	hello[14] = byte(len(nonce))
	hello = append(hello, nonce...)
	if _, err := c.Write(hello); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	var reply [replyLen]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return fmt.Errorf("read handshake reply: %w", err)
	}
	if string(reply[:4]) != magic {
		return fmt.Errorf("%w: handshake reply %q is not from a ddp-agent host transport", failure.ErrPeer, reply[:])
	}
	if st := reply[6]; st != statusOK {
		text, ok := statusText[st]
		if !ok {
			text = fmt.Sprintf("status %d", st)
		}
		return fmt.Errorf("%w: handshake rejected: %s (peer protocol version %d)", failure.ErrPeer, text, binary.LittleEndian.Uint16(reply[4:]))
	}
	return nil
}

// serverHandshake reads a hello from c and accepts it only from rank from
// of size addressed to nonce. It replies to anything that speaks the
// protocol and closes nothing.
func serverHandshake(ctx context.Context, c *net.TCPConn, from, size int, nonce string) error {
	defer context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })()
	var hello [helloLen + 255]byte
	if _, err := io.ReadFull(c, hello[:helloLen]); err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	if string(hello[:4]) != magic {
		return fmt.Errorf("hello %q is not from a ddp-agent host transport", hello[:helloLen])
	}
	status := statusOK
	version := binary.LittleEndian.Uint16(hello[4:])
	rank := binary.LittleEndian.Uint32(hello[6:])
	n := binary.LittleEndian.Uint32(hello[10:])
	got := hello[helloLen : helloLen+int(hello[14])]
	var err error
	if version != protocolVersion {
		status, err = statusBadVersion, fmt.Errorf("protocol version %d, want %d", version, protocolVersion)
	} else if _, err = io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read hello nonce: %w", err)
	} else if string(got) != nonce {
		status, err = statusBadNonce, fmt.Errorf("hello for nonce %q", got)
	} else if int(rank) != from || int(n) != size {
		status, err = statusBadRank, fmt.Errorf("hello from rank %d of %d, want rank %d of %d", rank, n, from, size)
	}
	reply := []byte(magic + "\x00\x00\x00")
	binary.LittleEndian.PutUint16(reply[4:], protocolVersion)
	reply[6] = status
	if _, werr := c.Write(reply); werr != nil && err == nil {
		err = fmt.Errorf("send handshake reply: %w", werr)
	}
	return err
}

// tune readies a handshaken connection for bulk data: no Nagle delay, no
// deadline left over from the handshake, and keepalive probes every
// linkTimeout/10 (at least a second) once it is idle (linkwatch.go says
// why). Socket buffers stay with the kernel's autotuning, which grows them
// to net.ipv4.tcp_rmem/tcp_wmem's maximum; a fixed SO_RCVBUF would be
// capped at net.core.rmem_max, and measured no faster on loopback.
func tune(c *net.TCPConn, linkTimeout time.Duration) error {
	c.SetNoDelay(true)
	c.SetDeadline(time.Time{})
	// Idle for one probe interval, then count unanswered probes: the kernel
	// drops it linkTimeout after the peer's last word. It counts whole
	// seconds, so a linkTimeout under 2 s acts as 2 s here.
	probe := max(time.Second, (linkTimeout / 10).Round(time.Second))
	count := max(1, int(linkTimeout/probe)-1)
	if err := c.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: probe, Interval: probe, Count: count}); err != nil {
		return fmt.Errorf("set keepalive: %w", err)
	}
	return nil
}

// ctxError classifies the end of ctx: a deadline is failure.ErrTimeout, anything
// else failure.ErrAborted. last, the error seen before, adds context when not nil.
func ctxError(ctx context.Context, last error) error {
	kind := failure.ErrAborted
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		kind = failure.ErrTimeout
	}
	if last == nil || errors.Is(last, context.Canceled) || errors.Is(last, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", kind, context.Cause(ctx))
	}
	return fmt.Errorf("%w: %w (last error: %v)", kind, context.Cause(ctx), last)
}
