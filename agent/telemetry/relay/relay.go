// Package relay carries the telemetry of a multi-node job to the agent
// that analyzes it. The agent of group rank 0 (the leader) runs a Server;
// every other agent (a follower) Dials it, estimates the offset between
// the two clocks, and forwards its ranks' records on the leader's clock,
// its workers, and, when the leader asks because a collective hung, the
// Python stacks of its ranks.
//
// The transport is plain HTTP/1.1 between the agents. Every request
// carries the job's token (see JobToken) as "Authorization: Bearer
// <token>"; the leader compares it in constant time and answers 403 to
// anything else, before reading a body. Followers name themselves in the
// "Ddp-Node" header. Every answer carries "Ddp-Relay-Epoch", random per
// Server, so that a follower notices a restarted leader and sends its
// workers again.
//
//	GET  /v1/time                     200 {"unix_nano": n}  the leader's clock, for the offset
//	POST /v1/records                  204  body: a records batch (below)
//	POST /v1/workers                  204  body: {"workers": [{"rank", "local_rank", "host", "pid", "gpu", "gpu_index"}]}
//	POST /v1/stacks                   204  body: {"stacks": {"<rank>": "<text>"}}
//	GET  /v1/hangs?epoch=&after=&wait=  200 {"epoch", "seq", "hangs": [{"gen", "step", "bucket", "since", "waiting", "missing"}]}
//
// The hangs request is a long poll: the leader answers at once with the
// hang requests numbered above after, or holds the request up to wait (at
// most a minute) for the next. When epoch is not its own (a follower of a
// previous leader on the address) it answers at once with all of them,
// and its epoch. Hang requests are handed out for two minutes.
//
// A records batch is binary, little-endian: a 20-byte header, the magic
// "DDPR", version 1, three zero bytes, the record count (uint32, at most
// MaxBatch) and the follower's dropped-records total (uint64); then
// count records of 64 bytes each (wire.RankedEvent, whose codec the
// control protocol's events share):
//
//	 0 gen     uint64     24 bytes   uint64     40 arrive  int64  Unix ns, 0 = zero time
//	 8 step    uint64     32 dtype   uint8      48 start   int64
//	16 bucket  uint32     33 status  uint8      56 end     int64
//	20 rank    uint32 (≤ MaxInt32)   34 six zero bytes
//
// The length must be exactly 20 + 64 × count. Malformed bodies get 400,
// bodies over MaxBody (or a batch over MaxBatch) 413, and the leader
// carries on.
package relay

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"
)

// Limits the leader enforces on what followers send; a follower's Client
// keeps within them.
const (
	MaxBody  = 16 << 20 // bytes of a request body
	MaxBatch = 65536    // records in one batch
	MaxStack = 64 << 10 // bytes of one rank's stack text; a Client truncates longer ones
)

// ErrForbidden is the leader refusing the token (HTTP 403).
var ErrForbidden = errors.New("relay: the leader refused the token (the nodes do not share the job's token)")

// JobToken derives the token of a job's relay from its rendezvous id and a
// secret the job's agents share (the rendezvous token): the hex
// HMAC-SHA256 of "ddp-agent relay <id>" keyed with the secret. Without a
// secret it depends on the id alone, and anyone who knows the id can send.
func JobToken(id, secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("ddp-agent relay " + id))
	return hex.EncodeToString(m.Sum(nil))
}

// Headers and paths of the protocol.
const (
	hdrNode    = "Ddp-Node"
	hdrEpoch   = "Ddp-Relay-Epoch"
	ctRecords  = "application/x-ddp-records"
	ctJSON     = "application/json"
	pathTime   = "/v1/time"
	pathRecs   = "/v1/records"
	pathWork   = "/v1/workers"
	pathStacks = "/v1/stacks"
	pathHangs  = "/v1/hangs"
)

// Timing of the protocol.
const (
	maxPollWait = time.Minute      // the longest a hangs request is held
	hangTTL     = 2 * time.Minute  // hang requests older than this are no longer handed out
	maxHangs    = 64               // hang requests the leader remembers
	closeWait   = 2 * time.Second  // Server.Close waits this long for requests in progress
	warnEvery   = 10 * time.Second // the least time between two warnings of one kind
)

// maxNode is the longest node name, in bytes.
const maxNode = 256

// validNode reports whether name can name a node: 1 to 256 bytes of
// printable ASCII, not starting or ending with a space (it travels in a
// header and goes into logs).
func validNode(name string) bool {
	if name == "" || len(name) > maxNode || name[0] == ' ' || name[len(name)-1] == ' ' {
		return false
	}
	for i := range len(name) {
		if name[i] < 0x20 || name[i] > 0x7e {
			return false
		}
	}
	return true
}
