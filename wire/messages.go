package wire

import "time"

// Message is one of the protocol messages: Hello, Welcome, KVSet, KVGet,
// KVValue, OK, Events, Reformed, Abort or Error. The set is closed; values are
// immutable once sent and safe to share between goroutines.
type Message interface {
	Type() MsgType
	encode(e *encoder)
}

// Hello is the first frame a worker sends on a new connection.
type Hello struct {
	Rank       int32
	LocalRank  int32
	PID        int32
	Generation uint64
	Transports []string
	// Job describes the worker's job to a sidecar (ddp-agent sidecar),
	// which did not launch it: keys HelloJob, HelloWorldSize and the
	// other Hello* constants. Empty for ddp-agent run, which knows its
	// workers. Encoded after the fields above only when not empty, so a
	// Hello without it is byte for byte what older shims send.
	Job map[string]string
}

// Keys of Hello.Job: what a sidecar needs of a job it did not launch.
const (
	HelloJob            = "job"              // the job's identity (TORCHELASTIC_RUN_ID, the Slurm or Kubernetes job)
	HelloWorldSize      = "world_size"       // WORLD_SIZE
	HelloLocalWorldSize = "local_world_size" // LOCAL_WORLD_SIZE
	HelloGroupRank      = "group_rank"       // GROUP_RANK: the node's rank in the job
	HelloMasterAddr     = "master_addr"      // MASTER_ADDR: where the leading sidecar's relay listens
	HelloRelay          = "relay"            // the leading sidecar's relay endpoint, as rank 0's Welcome gave it
	HelloGPU            = "gpu"              // the worker's GPU UUID; "" on a CPU
	HelloStackDir       = "stack_dir"        // where the worker's ddp_agent writes its Python stacks
	// WelcomeRelay is the Welcome.Config key of the leading sidecar's relay
	// endpoint, which the hook of rank 0 passes on to the other nodes.
	WelcomeRelay = "relay"
)

// Welcome is the agent's reply to an accepted Hello.
type Welcome struct {
	JobID      string
	Generation uint64
	WorldSize  int32
	Rank       int32
	Config     map[string]string
}

// KVSet stores Value under Key in the job's rendezvous store; the reply is OK
// or Error.
type KVSet struct {
	Key   string
	Value []byte
}

// KVGet waits up to TimeoutMillis (0 means the server default, at most
// MaxKVGetTimeout) for Key to exist; the reply is KVValue or Error
// (CodeTimeout when it did not appear).
type KVGet struct {
	Key           string
	TimeoutMillis uint32
}

// MaxKVGetTimeout is the longest a KVGet waits: the server caps
// TimeoutMillis to it, the client never asks for more.
const MaxKVGetTimeout = 10 * time.Minute

// KVValue is the reply to a successful KVGet.
type KVValue struct{ Value []byte }

// OK is the empty reply to a successful request.
type OK struct{}

// Events carries collective timing events from a worker; it is sent with id 0
// and never answered. Dropped counts events the worker discarded.
type Events struct {
	Dropped uint64
	Events  []CollectiveEvent
}

// Abort tells a worker to abort; the agent sends it unsolicited with id 0.
type Abort struct{ Reason string }

// Error is the reply to a request that failed.
type Error struct {
	Code    ErrorCode
	Message string
}

func (Hello) Type() MsgType    { return TypeHello }
func (Welcome) Type() MsgType  { return TypeWelcome }
func (KVSet) Type() MsgType    { return TypeKVSet }
func (KVGet) Type() MsgType    { return TypeKVGet }
func (KVValue) Type() MsgType  { return TypeKVValue }
func (OK) Type() MsgType       { return TypeOK }
func (Events) Type() MsgType   { return TypeEvents }
func (Abort) Type() MsgType    { return TypeAbort }
func (Error) Type() MsgType    { return TypeError }
func (Reformed) Type() MsgType { return TypeReformed }

func (m Hello) encode(e *encoder) {
	e.i32(m.Rank)
	e.i32(m.LocalRank)
	e.i32(m.PID)
	e.u64(m.Generation)
	e.strs(m.Transports)
	if len(m.Job) > 0 {
		e.strMap(m.Job)
	}
}

// Bounds on a Hello. A server reads it from a peer it has not admitted
// yet, and a sidecar keeps it for the connection's life, so what it may
// cost is bounded by more than the frame's size: a 16 MiB Hello of 4 M
// empty transport names decoded to ~130 MB. A real one is a few hundred
// bytes: a transport or two, the eight Hello* keys, values that are ids,
// numbers, addresses and a directory.
const (
	MaxHelloPayload    = 64 << 10 // a server reads a Hello frame up to this size
	maxHelloTransports = 16
	maxHelloTransport  = 64
	maxHelloJobKeys    = 32
	maxHelloJobKey     = 64
	maxHelloJobValue   = 4096 // PATH_MAX, for stack_dir
)

func decodeHello(d *decoder) Hello {
	h := Hello{Rank: d.i32(), LocalRank: d.i32(), PID: d.i32(), Generation: d.u64()}
	h.Transports = d.strsMax("Hello transports", maxHelloTransports, maxHelloTransport)
	if len(d.b) > 0 {
		h.Job = d.strMapMax("Hello job", maxHelloJobKeys, maxHelloJobKey, maxHelloJobValue)
	}
	return h
}

func (m Welcome) encode(e *encoder) {
	e.str(m.JobID)
	e.u64(m.Generation)
	e.i32(m.WorldSize)
	e.i32(m.Rank)
	e.strMap(m.Config)
}

func decodeWelcome(d *decoder) Welcome {
	return Welcome{JobID: d.str(), Generation: d.u64(), WorldSize: d.i32(), Rank: d.i32(), Config: d.strMap()}
}

func (m KVSet) encode(e *encoder) {
	e.str(m.Key)
	e.bytes(m.Value)
}

func (m KVGet) encode(e *encoder) {
	e.str(m.Key)
	e.u32(m.TimeoutMillis)
}

func (m KVValue) encode(e *encoder) { e.bytes(m.Value) }
func (OK) encode(*encoder)          {}
func (m Abort) encode(e *encoder)   { e.str(m.Reason) }

func (m Error) encode(e *encoder) {
	e.u16(uint16(m.Code))
	e.str(m.Message)
}

func (m Events) encode(e *encoder) {
	e.u64(m.Dropped)
	e.u32(uint32(len(m.Events)))
	for _, ev := range m.Events {
		e.b = AppendEvent(e.b, ev)
	}
}

func decodeEvents(d *decoder) Events {
	m := Events{Dropped: d.u64()}
	n := d.count(EventSize)
	if n == 0 {
		return m
	}
	m.Events = make([]CollectiveEvent, n)
	for i := range m.Events {
		m.Events[i] = DecodeEvent(d.take(EventSize, "collective event"))
	}
	return m
}
