package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/tempdir"
	"github.com/ddp-agent/ddp-agent/wire"
)

// Server is the agent side of the control socket. Its methods are safe for
// concurrent use.
type Server struct {
	cfg    Config
	adm    admitter // who may connect, and what an admitted one may do
	log    *slog.Logger
	ln     *net.UnixListener
	dir    string
	path   string
	ownDir bool           // Listen created cfg.Dir: removed if empty
	tmp    *tempdir.Dir   // or the fresh temp dir, all of it ours
	wg     sync.WaitGroup // connection and request goroutines

	quota    *kvQuota
	connsPer *connCounter
	pending  *pendingConns // a sidecar's connections before their Hello
	limitLog *limitLog
	peerIDs  atomic.Uint64 // Peer.ID

	mu     sync.Mutex
	gen    uint64
	world  int32
	config map[string]string
	conns  map[*serverConn]struct{} // connections that completed the handshake
}

// Listen creates the socket directory and binds the unix socket SocketName in
// it with mode 0600, for the workers this agent spawned: they are admitted
// by pid (PIDAdmission). The Server accepts connections once Run is called;
// Run also releases the socket, so it must be called once Listen succeeded.
func Listen(cfg Config, adm PIDAdmission) (*Server, error) {
	if adm.Authorize == nil {
		return nil, errors.New("listen control socket: PIDAdmission.Authorize is nil")
	}
	return listen(cfg, &pidAdmitter{adm})
}

// ListenSidecar is Listen for workers the server did not launch (ddp-agent
// sidecar): sc admits them by their Hello, once their uid was checked.
func ListenSidecar(cfg Config, sc Sidecar) (*Server, error) {
	if sc == nil {
		return nil, errors.New("listen control socket: no Sidecar")
	}
	return listen(cfg, &helloAdmitter{sc})
}

func listen(cfg Config, adm admitter) (*Server, error) {
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, adm: adm, log: cfg.Logger, conns: make(map[*serverConn]struct{}),
		quota: newKVQuota(), connsPer: newConnCounter(), pending: newPendingConns(), limitLog: newLimitLog(cfg.Logger, limitLogEvery)}
	var err error
	if cfg.Dir == "" {
		// A socket path must fit sun_path (108 bytes with its NUL); under a
		// long TMPDIR, bind would fail, so fall back to /tmp.
		base := os.TempDir()
		if len(base)+len("/"+tempdir.Control+"0123456789/")+len(SocketName) >= 100 {
			base = "/tmp"
		}
		if s.tmp, err = tempdir.Make(base, tempdir.Control); err == nil {
			s.dir = s.tmp.Path
		}
	} else {
		s.dir = cfg.Dir
		_, statErr := os.Stat(s.dir)
		s.ownDir = errors.Is(statErr, fs.ErrNotExist)
		err = os.MkdirAll(s.dir, 0o700)
	}
	if err == nil {
		err = os.Chmod(s.dir, 0o700)
	}
	if err == nil {
		s.path = filepath.Join(s.dir, cfg.SocketName)
		s.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: s.path, Net: "unix"})
	}
	if err == nil {
		if err = os.Chmod(s.path, 0o600); err != nil {
			s.ln.Close()
		}
	}
	if err != nil {
		s.removeDir()
		return nil, fmt.Errorf("listen control socket: %w", err)
	}
	return s, nil
}

// Path returns the socket path.
func (s *Server) Path() string { return s.path }

// SetGeneration sets the current generation, world size and config sent in
// Welcome. Hellos of another generation are rejected from now on, and
// connections of other generations are closed. It does not block.
func (s *Server) SetGeneration(gen uint64, worldSize int, config map[string]string) {
	s.mu.Lock()
	s.gen, s.world, s.config = gen, int32(worldSize), maps.Clone(config)
	s.quota.keepOnly(gen)
	var stale []*serverConn
	for c := range s.conns {
		if c.gen != gen {
			stale = append(stale, c)
			delete(s.conns, c)
		}
	}
	s.mu.Unlock()
	for _, c := range stale {
		c.log.Info("closing control connection of old generation", "generation", c.gen, "current", gen)
		c.cancel()
	}
}

// DropGeneration deletes the keys of generation gen from the KV, when the
// KV can delete by prefix (MemKV can): once an attempt is over, its
// bootstrap data is garbage. The ranks' quotas for gen start over.
func (s *Server) DropGeneration(ctx context.Context, gen uint64) error {
	s.quota.drop(gen)
	d, ok := s.cfg.KV.(interface {
		DeletePrefix(ctx context.Context, prefix string) error
	})
	if !ok {
		return nil
	}
	return d.DeletePrefix(ctx, scope(s.cfg.JobID, gen, ""))
}

// Abort sends Abort{reason} to every connected worker in parallel and returns
// how many received it. It blocks at most about twice Config.WriteTimeout
// (a wedged connection's pending write, then the Abort write).
func (s *Server) Abort(reason string) int { return s.AbortPeers(nil, reason) }

// Conns returns the number of workers connected and past the handshake.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Run accepts and serves connections until ctx is done. Then it closes the
// listener and every connection, waits for all its goroutines, removes the
// socket file (and the directory if Listen created it) and returns nil. It
// must be called exactly once.
func (s *Server) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.ln.Close() })
	defer stop()
	var err error
	for {
		nc, aerr := s.ln.AcceptUnix()
		if aerr != nil {
			if ctx.Err() != nil {
				break
			}
			if errors.Is(aerr, net.ErrClosed) {
				err = fmt.Errorf("accept control connection: %w", aerr)
				break
			}
			s.log.Warn("accept control connection", "err", aerr)
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		c := &serverConn{s: s, nc: nc, log: s.log}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			c.serve(ctx)
		}()
	}
	s.ln.Close()
	s.wg.Wait()
	if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		s.log.Warn("remove control socket", "path", s.path, "err", rerr)
	}
	s.removeDir()
	return err
}

func (s *Server) removeDir() {
	if err := s.tmp.Remove(); err != nil {
		s.log.Warn("remove control socket dir", "dir", s.dir, "err", err)
	}
	if s.ownDir {
		err := os.Remove(s.dir)
		switch {
		case err == nil, errors.Is(err, fs.ErrNotExist):
		case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST):
			// Files of others live there too (a sidecar's workers' stacks);
			// the caller cleans up.
			s.log.Debug("control socket dir left: not empty", "dir", s.dir)
		default:
			s.log.Warn("remove control socket dir", "dir", s.dir, "err", err)
		}
	}
}

// serverConn is one worker connection. pid, rank and gen are set by the
// handshake before the connection is registered and not changed afterwards.
type serverConn struct {
	s       *Server
	nc      *net.UnixConn
	log     *slog.Logger
	cancel  context.CancelFunc // closes the connection
	pid     int
	rank    int
	gen     uint64
	counted bool       // the connection counts against the connection limits
	wmu     sync.Mutex // serializes writes
	// peer is the admitted peer, for a Sidecar's callbacks and AbortPeers;
	// admitted says the handshake registered it.
	peer     Peer
	admitted bool
}

func (c *serverConn) serve(ctx context.Context) {
	ctx, c.cancel = context.WithCancel(ctx)
	defer c.cancel()
	c.s.wg.Add(1)
	go func() {
		defer c.s.wg.Done()
		<-ctx.Done()
		c.nc.Close()
	}()
	defer c.s.unregister(c)

	err := c.handshake()
	if c.counted {
		defer c.s.connsPer.release(c.pid, c.rank)
	}
	if le := (*limitError)(nil); errors.As(err, &le) {
		c.s.limitLog.refused(time.Now(), c.rank, c.pid, le)
		return
	}
	if errors.Is(err, io.EOF) {
		// Closed before a whole Hello: a probe (the hook checks that a
		// sidecar answers before it relies on one), or a worker gone.
		c.log.Debug("control connection closed before its hello", "err", err)
		return
	}
	if err != nil {
		c.log.Warn("control handshake", "err", err)
		return
	}
	c.log.Debug("worker connected")
	c.readLoop(ctx)
}

// readLoop reads and dispatches the worker's frames until the connection
// ends: Events synchronously, KV requests each in a goroutine (at most
// maxInflight at once), since a KVGet may wait for minutes. Reformed, like
// Events, synchronously.
func (c *serverConn) readLoop(ctx context.Context) {
	fr := &frameReader{nc: c.nc, timeout: c.s.cfg.FrameTimeout}
	sem := make(chan struct{}, maxInflight)
	for {
		f, err := fr.next()
		if err != nil {
			c.readFailed(ctx, 0, err)
			return
		}
		m, err := wire.Decode(f)
		if err != nil {
			c.readFailed(ctx, f.ID, err)
			return
		}
		switch m := m.(type) {
		case wire.Events:
			c.s.adm.events(c, m)
		case wire.Reformed:
			c.s.adm.reformed(c, m)
		case wire.KVSet, wire.KVGet:
			if refusal := c.s.adm.refuseKV(); refusal != "" {
				c.send(f.ID, wire.Error{Code: wire.CodeDenied, Message: refusal})
				continue
			}
			if set, ok := m.(wire.KVSet); ok && !c.admit(f.ID, set) {
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			c.s.wg.Add(1)
			go func() {
				defer c.s.wg.Done()
				defer func() { <-sem }()
				c.request(ctx, f.ID, m)
			}()
		default:
			c.readFailed(ctx, f.ID, fmt.Errorf("%w: unexpected %v message", wire.ErrMalformed, m.Type()))
			return
		}
	}
}

// admit charges a KVSet to its rank's quota before it is queued. Over a
// limit, it answers the request with a CodeLimit Error, logs the refusal
// (rate-limited) and returns false; the connection stays usable. A KVSet
// with an empty key is refused as a bad request later and charged nothing.
func (c *serverConn) admit(id uint32, m wire.KVSet) bool {
	if m.Key == "" {
		return true
	}
	le := c.s.quota.reserve(c.gen, c.rank, m.Key, len(m.Value), c.s.cfg)
	if le == nil {
		return true
	}
	c.s.limitLog.refused(time.Now(), c.rank, c.pid, le)
	c.send(id, le.reply())
	return false
}

// readFailed logs a read error and answers protocol errors with BadRequest.
func (c *serverConn) readFailed(ctx context.Context, id uint32, err error) {
	switch {
	case ctx.Err() != nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET):
		// ECONNRESET: a worker that was stopped or died with a frame of
		// ours unread; its exit is reported where it counts.
		c.log.Debug("worker disconnected", "err", err)
	case errors.Is(err, errFrameTimeout):
		c.log.Warn("worker stopped halfway through a frame, closing connection", "frame_timeout", c.s.cfg.FrameTimeout, "err", err)
		c.send(id, wire.Error{Code: wire.CodeBadRequest, Message: err.Error()})
	case isProtocolError(err):
		c.log.Warn("bad frame from worker, closing connection", "err", err)
		c.send(id, wire.Error{Code: wire.CodeBadRequest, Message: err.Error()})
	default:
		c.log.Warn("read from worker", "err", err)
	}
}

func isProtocolError(err error) bool {
	return errors.Is(err, wire.ErrMalformed) || errors.Is(err, wire.ErrBadMagic) ||
		errors.Is(err, wire.ErrVersion) || errors.Is(err, wire.ErrTooLarge)
}

// handshake checks the peer credentials, then lets the admitter check the
// connection limits and the Hello, register the connection and reply
// Welcome, all within Config.HandshakeTimeout. On failure it sends an
// Error (best effort); a refusal by a connection limit returns an error
// wrapping a *limitError.
func (c *serverConn) handshake() error {
	c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.HandshakeTimeout))
	pid, uid, err := peerCred(c.nc)
	if err != nil {
		return fmt.Errorf("read peer credentials: %w", err)
	}
	c.log = c.log.With("pid", pid)
	c.pid = pid
	if uid != os.Getuid() {
		c.send(0, wire.Error{Code: wire.CodeDenied, Message: "peer uid " + strconv.Itoa(uid) + " is not the agent's"})
		return fmt.Errorf("peer uid %d: %w", uid, wire.ErrDenied)
	}
	return c.s.adm.handshake(c, pid)
}

// readHello reads the first frame within the handshake's deadline; it must
// be a Hello. On failure it answers with an Error (best effort).
func (c *serverConn) readHello() (wire.Frame, wire.Hello, error) {
	f, err := wire.ReadFrame(c.nc, wire.MaxHelloPayload)
	if err != nil {
		if isProtocolError(err) {
			c.send(0, wire.Error{Code: wire.CodeBadRequest, Message: err.Error()})
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = fmt.Errorf("no whole Hello within %v of accept: %w", c.s.cfg.HandshakeTimeout, err)
		}
		return f, wire.Hello{}, fmt.Errorf("read hello: %w", err)
	}
	m, err := wire.Decode(f)
	hello, ok := m.(wire.Hello)
	if err == nil && !ok {
		err = fmt.Errorf("%w: first message is %v, want Hello", wire.ErrMalformed, f.Type)
	}
	if err != nil {
		c.send(f.ID, wire.Error{Code: wire.CodeBadRequest, Message: err.Error()})
		return f, wire.Hello{}, fmt.Errorf("read hello: %w", err)
	}
	return f, hello, nil
}

func (s *Server) unregister(c *serverConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	if c.admitted {
		s.adm.left(c)
	}
}

// send writes one frame under the write lock; on error the connection is
// closed. It blocks at most Config.WriteTimeout plus the wait for the lock.
func (c *serverConn) send(id uint32, m wire.Message) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(id, m)
}

func (c *serverConn) writeLocked(id uint32, m wire.Message) error {
	c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	if err := wire.WriteFrame(c.nc, id, m); err != nil {
		if errors.Is(err, net.ErrClosed) {
			c.log.Debug("write to closing connection", "type", m.Type(), "err", err)
		} else {
			c.log.Warn("write to worker, closing connection", "type", m.Type(), "err", err)
		}
		c.cancel()
		c.nc.Close() // now, so that queued writers fail fast
		return err
	}
	return nil
}
