// Package relay carries the telemetry of a multi-node job to the agent
// that analyzes it. The agent of group rank 0 (the leader) runs a Server;
// every other agent (a follower) Dials it, estimates the offset between
// the two clocks, and forwards its ranks' records on the leader's clock,
// its workers, and, when the leader asks because a collective hung, the
// Python stacks of its ranks.
//
// The transport is HTTP/1.1 over TLS 1.3, and nothing else: a Server
// listens only on the one address it is given (the address the agents use
// for the rendezvous, never every interface), with a self-signed ECDSA
// P-256 certificate it makes when it starts and keeps in memory. The
// leader publishes an Endpoint in the job's store: its address, the
// certificate's SHA-256 fingerprint, and, when the job has no
// --rdzv-token, the random secret followers present. A follower trusts the
// one certificate whose fingerprint it read there (no CA, no name check).
//
// Every request carries the job's secret (see LeaderToken) as
// "Authorization: Bearer <secret>"; the leader compares it in constant
// time and answers 401 to anything else, before reading a body, on every
// path. Followers name themselves in the "Ddp-Node" header. Every answer
// carries "Ddp-Relay-Epoch", random per Server, so that a follower
// notices a restarted leader and sends its workers again.
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
	"crypto/rand"
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

// ErrUnauthorized is the leader refusing the secret (HTTP 401).
var ErrUnauthorized = errors.New("relay: the leader refused the secret (the nodes do not share the job's --rdzv-token, or the store holds another leader's secret)")

// ErrFingerprint is a leader whose certificate is not the one published
// in the store: another process on the address, or a leader of another
// generation.
var ErrFingerprint = errors.New("relay: the leader's certificate does not match the fingerprint published in the store")

// JobToken derives the token of a job's relay from its rendezvous id and a
// secret the job's agents share (the rendezvous token): the hex
// HMAC-SHA256 of "ddp-agent relay <id>" keyed with the secret. Without a
// secret it would depend on the id alone, which anyone can know: see
// LeaderToken.
func JobToken(id, secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("ddp-agent relay " + id))
	return hex.EncodeToString(m.Sum(nil))
}

// secretSize is the size of a random secret, in bytes.
const secretSize = 32

// NewSecret is a random 256-bit secret, in hex.
func NewSecret() string {
	var b [secretSize]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// LeaderToken is the secret a new leader's Server requires, and whether
// it must publish it in the store for the followers. With the job's
// --rdzv-token (rdzvToken) it is JobToken, which every agent of the job
// derives and which is never published. Without one, the job id is all
// the agents share, and anyone can know it: the secret is then random,
// one per Server, and travels in the store (which makes the store the
// trust root: whoever can read it can read the secret).
func LeaderToken(jobID, rdzvToken string) (token string, publish bool) {
	if rdzvToken != "" {
		return JobToken(jobID, rdzvToken), false
	}
	return NewSecret(), true
}

// FollowerToken is the secret a follower presents to the leader of e: the
// one it derives from the job's --rdzv-token, or without one the secret
// the leader published.
func FollowerToken(e Endpoint, jobID, rdzvToken string) (string, error) {
	switch {
	case rdzvToken != "":
		return JobToken(jobID, rdzvToken), nil
	case e.Secret != "":
		return e.Secret, nil
	}
	return "", errors.New("relay: the leader published no secret (it has a --rdzv-token and this agent none)")
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
