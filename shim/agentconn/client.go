// Package agentconn is the worker side of ddp-agent's control socket, as
// the shim uses it: a Client that says Hello, bootstraps through the
// agent's store (KVSet, KVGet), ships collective events and hears Abort.
// The protocol is package wire; the agent's side is agent/control.
package agentconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/wire"
)

// EventsWriteTimeout bounds Client.SendEvents.
const EventsWriteTimeout = 100 * time.Millisecond

// ErrClosed: the connection is closed or lost; calls fail with it. An Error
// reply is a *wire.RemoteError, which matches wire.ErrTimeout, ErrDenied,
// ErrStaleGeneration or ErrLimit (a value, quota or connection limit of the
// agent; the message names it) with errors.Is according to its code.
var ErrClosed = errors.New("control: connection closed")

// Client is the worker side of the control socket. A reader goroutine
// dispatches replies to the waiting calls by request id. All methods are safe
// for concurrent use.
type Client struct {
	nc      *net.UnixConn
	wsem    chan struct{} // one-slot write lock that can be waited on with a deadline
	done    chan struct{} // closed when the reader goroutine exits
	aborted chan struct{}

	mu      sync.Mutex
	nextID  uint32
	pending map[uint32]chan reply
	err     error // set once the connection is unusable; wraps ErrClosed
	closing bool
	reason  string
	told    bool // the agent sent Abort
}

type reply struct {
	m   wire.Message
	err error
}

// Dial connects to the agent's socket at path, sends hello and waits for
// Welcome. ctx bounds the connect and the handshake only. A rejected Hello
// returns an error wrapping a *RemoteError.
func Dial(ctx context.Context, path string, hello wire.Hello) (*Client, wire.Welcome, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, wire.Welcome{}, fmt.Errorf("dial control socket: %w", err)
	}
	uc := nc.(*net.UnixConn)
	w, err := handshake(ctx, uc, hello)
	if err != nil {
		uc.Close()
		return nil, wire.Welcome{}, fmt.Errorf("control handshake: %w", err)
	}
	c := &Client{
		nc:      uc,
		wsem:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		aborted: make(chan struct{}),
		nextID:  1, // Hello used 1
		pending: make(map[uint32]chan reply),
	}
	go c.readLoop()
	return c, w, nil
}

func handshake(ctx context.Context, nc *net.UnixConn, hello wire.Hello) (wire.Welcome, error) {
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	// A rejected peer may be answered and closed before Hello is read, so a
	// write error is only reported if no reply can be read either.
	werr := wire.WriteFrame(nc, 1, hello)
	f, err := wire.ReadFrame(nc, wire.MaxPayload)
	if ctx.Err() != nil {
		return wire.Welcome{}, ctx.Err()
	}
	if err != nil {
		return wire.Welcome{}, errors.Join(werr, err)
	}
	m, err := wire.Decode(f)
	if err != nil {
		return wire.Welcome{}, err
	}
	switch m := m.(type) {
	case wire.Welcome:
		if !stop() {
			return wire.Welcome{}, ctx.Err()
		}
		nc.SetDeadline(time.Time{})
		return m, nil
	case wire.Error:
		return wire.Welcome{}, &wire.RemoteError{Code: m.Code, Message: m.Message}
	}
	return wire.Welcome{}, fmt.Errorf("%w: got %v, want Welcome", wire.ErrMalformed, f.Type)
}

func (c *Client) readLoop() {
	defer close(c.done)
	for {
		f, err := wire.ReadFrame(c.nc, wire.MaxPayload)
		var m wire.Message
		if err == nil {
			m, err = wire.Decode(f)
		}
		if err != nil {
			c.nc.Close()
			c.fail(err)
			return
		}
		if a, ok := m.(wire.Abort); ok {
			c.mu.Lock()
			c.told = true
			c.mu.Unlock()
			c.abort(a.Reason)
			continue
		}
		c.mu.Lock()
		ch := c.pending[f.ID]
		delete(c.pending, f.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- reply{m: m} // buffered
		}
	}
}

// fail marks the connection unusable and wakes every pending call.
func (c *Client) fail(cause error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("%w: %w", ErrClosed, cause)
	}
	err, pending, closing := c.err, c.pending, c.closing
	c.pending = nil
	c.mu.Unlock()
	for _, ch := range pending {
		ch <- reply{err: err}
	}
	if closing {
		c.abort("control client closed")
	} else {
		c.abort("control connection lost: " + cause.Error())
	}
}

func (c *Client) abort(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.aborted:
	default:
		c.reason = reason
		close(c.aborted)
	}
}

// Aborted returns a channel that is closed when the agent sends Abort or the
// connection is lost or closed.
func (c *Client) Aborted() <-chan struct{} { return c.aborted }

// Told reports whether the agent sent Abort (rather than the connection
// ending); a sidecar's lost connection must not stop training.
func (c *Client) Told() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.told
}

// AbortReason returns the reason of the Abort, or a description of why the
// connection ended; it is empty while Aborted is open.
func (c *Client) AbortReason() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reason
}

// Close closes the connection, wakes pending calls with ErrClosed and waits
// for the reader goroutine to exit. It is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	first := !c.closing
	c.closing = true
	if c.err == nil {
		c.err = ErrClosed
	}
	c.mu.Unlock()
	var err error
	if first {
		if cerr := c.nc.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
			err = fmt.Errorf("close control connection: %w", cerr)
		}
	}
	<-c.done
	return err
}

// KVSet stores value under key for the current generation. It blocks until
// the agent replies or ctx is done.
func (c *Client) KVSet(ctx context.Context, key string, value []byte) error {
	if _, err := roundTrip[wire.OK](ctx, c, wire.KVSet{Key: key, Value: value}); err != nil {
		return fmt.Errorf("kv set %q: %w", key, err)
	}
	return nil
}

// KVGet returns the value under key, waiting up to timeout (<= 0 means the
// agent's default; at most MaxKVGetTimeout) for it to be set. It blocks
// until the agent replies or ctx is done; a timeout reported by the agent
// returns an error wrapping ErrTimeout.
func (c *Client) KVGet(ctx context.Context, key string, timeout time.Duration) ([]byte, error) {
	var ms uint32
	if timeout > 0 {
		ms = uint32(max(1, min(timeout.Milliseconds(), wire.MaxKVGetTimeout.Milliseconds())))
	}
	v, err := roundTrip[wire.KVValue](ctx, c, wire.KVGet{Key: key, TimeoutMillis: ms})
	if err != nil {
		return nil, fmt.Errorf("kv get %q: %w", key, err)
	}
	return v.Value, nil
}

// SendEvents sends ev without waiting for a reply. It never blocks longer
// than EventsWriteTimeout and returns an error instead.
func (c *Client) SendEvents(ev wire.Events) error { return c.sendUnanswered("events", ev) }

// SendReformed tells the agent of an in-process re-formation, without
// waiting for a reply; like SendEvents it never blocks longer than
// EventsWriteTimeout.
func (c *Client) SendReformed(m wire.Reformed) error { return c.sendUnanswered("reformed", m) }

// sendUnanswered sends m, a message no reply answers, with id 0, bounded
// by EventsWriteTimeout.
func (c *Client) sendUnanswered(what string, m wire.Message) error {
	if err := c.write(nil, time.Now().Add(EventsWriteTimeout), 0, m); err != nil {
		return fmt.Errorf("send %s: %w", what, err)
	}
	return nil
}

// roundTrip sends the request m and returns its reply, which must be a T.
func roundTrip[T wire.Message](ctx context.Context, c *Client, m wire.Message) (T, error) {
	var want T
	r, err := c.call(ctx, m)
	if err != nil {
		return want, err
	}
	got, ok := r.(T)
	if !ok {
		return want, fmt.Errorf("%w: got %v reply, want %v", wire.ErrMalformed, r.Type(), want.Type())
	}
	return got, nil
}

// call sends the request m and waits for its reply; an Error reply is
// returned as a *RemoteError.
func (c *Client) call(ctx context.Context, m wire.Message) (wire.Message, error) {
	ch := make(chan reply, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.nextID++
	if c.nextID == 0 {
		c.nextID++
	}
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()

	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(wire.DefaultWriteTimeout)
	}
	if err := c.write(ctx.Done(), deadline, id, m); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		c.forget(id)
		return nil, err
	}
	select {
	case r := <-ch:
		if e, ok := r.m.(wire.Error); ok {
			return nil, &wire.RemoteError{Code: e.Code, Message: e.Message}
		}
		return r.m, r.err
	case <-ctx.Done():
		c.forget(id)
		return nil, ctx.Err()
	}
}

func (c *Client) forget(id uint32) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// write sends one frame, waiting for the write lock and the socket at most
// until deadline, or until done is closed (nil: never). A frame that was
// only partly written corrupts the stream, so the connection is closed then.
func (c *Client) write(done <-chan struct{}, deadline time.Time, id uint32, m wire.Message) error {
	buf, err := wire.AppendFrame(nil, id, m)
	if err != nil {
		return err
	}
	c.mu.Lock()
	err = c.err
	c.mu.Unlock()
	if err != nil {
		return err
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case c.wsem <- struct{}{}:
	case <-done:
		return errors.New("write " + m.Type().String() + ": cancelled")
	case <-t.C:
		return fmt.Errorf("write %v: wait for connection: %w", m.Type(), os.ErrDeadlineExceeded)
	}
	defer func() { <-c.wsem }()
	c.nc.SetWriteDeadline(deadline)
	if n, err := c.nc.Write(buf); err != nil {
		if n > 0 {
			c.nc.Close()
		}
		return fmt.Errorf("write %v: %w", m.Type(), err)
	}
	return nil
}
