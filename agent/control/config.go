package control

import (
	"log/slog"
	"time"

	"github.com/ddp-agent/ddp-agent/wire"
)

// Server limits and defaults. docs/control-socket.md ("Limits") says why
// each default is what it is; in short, every one is far above what the
// shim needs and low enough that one misbehaving worker cannot grow the
// agent, the store or the agent's file descriptors without bound.
const (
	SocketName          = "control.sock"
	DefaultKVGetTimeout = 60 * time.Second // KVGet with TimeoutMillis 0

	// HandshakeTimeout is the default of Config.HandshakeTimeout.
	HandshakeTimeout = 10 * time.Second
	// DefaultFrameTimeout is the default of Config.FrameTimeout.
	DefaultFrameTimeout = 10 * time.Second
	// DefaultMaxKVValue is the default of Config.MaxKVValue: 1 MiB. The shim
	// stores at most a few hundred bytes per communicator, and etcd (the
	// store of a multi-node job) refuses requests over 1.5 MiB, so a value
	// accepted by --standalone is accepted by every store.
	DefaultMaxKVValue = 1 << 20
	// DefaultKVBytesPerRank is the default of Config.KVBytesPerRank: 16 MiB,
	// tens of thousands of communicators' bootstraps; the in-memory store's
	// MemKVLimit is sixteen local ranks at it.
	DefaultKVBytesPerRank = 16 << 20
	// DefaultMaxConnsPerProcess is the default of Config.MaxConnsPerProcess:
	// the shim keeps one connection per communicator and a hook opens at
	// most two (host and NCCL), so 16 is eight DDP models in one process.
	DefaultMaxConnsPerProcess = 16
	// DefaultMaxConnsPerRank is the default of Config.MaxConnsPerRank: room
	// for a second process of the rank (a descendant) at the per-process cap.
	DefaultMaxConnsPerRank = 2 * DefaultMaxConnsPerProcess
	// DefaultMaxPendingConns is the default of Config.MaxPendingConns: the
	// connections of 32 ranks' hooks arriving at once, twice over, and
	// far below any file descriptor limit.
	DefaultMaxPendingConns = 128

	kvSetTimeout = 30 * time.Second
	maxInflight  = 64 // concurrent KV requests per connection
)

// Config configures a Server. The zero value of every limit means its
// default.
type Config struct {
	// Dir is the directory for the socket. Empty means a fresh temporary
	// one (internal/tempdir's Control kind), removed with all it holds on
	// exit. Listen creates Dir if missing and sets its mode to 0700; Run
	// removes it on exit if Listen created it and it is empty.
	Dir string
	// SocketName is the socket's file name in Dir; "" means SocketName.
	SocketName string
	JobID      string
	// KV stores the keys of KVSet and KVGet, scoped as
	// "<job>/<generation>/<key>". Nil means NewMemKV(). Under a Sidecar
	// (ListenSidecar) there is no store and KV is not used.
	KV KV
	// WriteTimeout bounds every write to a worker; a worker that stops
	// reading is disconnected after it. Zero means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// HandshakeTimeout is how long a new connection has, from accept, to
	// deliver its whole Hello; it is closed after it. Zero means
	// HandshakeTimeout.
	HandshakeTimeout time.Duration
	// FrameTimeout is how long the rest of a frame may take once its first
	// byte has arrived; a connection that stops halfway through a frame is
	// closed after it. Between frames a connection may idle for as long as
	// it likes (the shim keeps one open for the whole run). Zero means
	// DefaultFrameTimeout.
	FrameTimeout time.Duration
	// MaxKVValue is the largest value a KVSet may carry, in bytes; a larger
	// one is refused with CodeLimit and the connection stays usable. Zero
	// means DefaultMaxKVValue.
	MaxKVValue int
	// KVBytesPerRank is how many bytes of keys and values one rank may
	// write with KVSet in one generation. A rewrite of a key counts again,
	// because a store such as etcd keeps each revision until it compacts;
	// a write the store refused does not count. Over it, KVSet is refused
	// with CodeLimit and the connection stays usable. Zero means
	// DefaultKVBytesPerRank.
	KVBytesPerRank int64
	// MaxConnsPerProcess and MaxConnsPerRank bound the connections open at
	// once from one process and from all of one rank's processes, counted
	// from the moment the peer is authorized; one more is answered with a
	// CodeLimit Error and closed. Zero means DefaultMaxConnsPerProcess and
	// DefaultMaxConnsPerRank.
	MaxConnsPerProcess int
	MaxConnsPerRank    int
	// MaxPendingConns bounds a sidecar's connections waiting for their
	// Hello (which it admits by), in all; per process MaxConnsPerProcess
	// bounds them too. One more is answered with a CodeLimit Error and
	// closed. Zero means DefaultMaxPendingConns.
	MaxPendingConns int
	// Logger receives the server's logs. Nil discards them.
	Logger *slog.Logger
}

// withDefaults returns cfg with every zero (or negative) setting replaced
// by its default.
func (cfg Config) withDefaults() Config {
	if cfg.SocketName == "" {
		cfg.SocketName = SocketName
	}
	if cfg.KV == nil {
		cfg.KV = NewMemKV()
	}
	orDefault(&cfg.WriteTimeout, wire.DefaultWriteTimeout)
	orDefault(&cfg.HandshakeTimeout, HandshakeTimeout)
	orDefault(&cfg.FrameTimeout, DefaultFrameTimeout)
	orDefault(&cfg.MaxKVValue, DefaultMaxKVValue)
	orDefault(&cfg.KVBytesPerRank, DefaultKVBytesPerRank)
	orDefault(&cfg.MaxConnsPerProcess, DefaultMaxConnsPerProcess)
	orDefault(&cfg.MaxConnsPerRank, DefaultMaxConnsPerRank)
	orDefault(&cfg.MaxPendingConns, DefaultMaxPendingConns)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}

func orDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}
