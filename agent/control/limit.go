package control

import (
	"fmt"

	"github.com/ddp-agent/ddp-agent/wire"
)

// limitError is a request or a connection refused by one of the limits in
// Config. Its text goes to the worker in a CodeLimit Error, so it names the
// limit, its value and what was asked for; its fields go to the agent's log.
type limitError struct {
	limit string // the Config field, e.g. "MaxKVValue"
	max   int64  // its value
	got   int64  // what the refused request or connection would have made it
	text  string
}

func (e *limitError) Error() string { return e.text }

// Is makes a limitError match wire.ErrLimit, like the worker's RemoteError.
func (e *limitError) Is(target error) bool { return target == wire.ErrLimit }

// reply is the Error the worker gets for e.
func (e *limitError) reply() wire.Error {
	return wire.Error{Code: wire.CodeLimit, Message: e.text}
}

// checkKVSet decides whether a KVSet of key and a value of valueLen bytes
// may go to the store, given that the rank has written used bytes of keys
// and values in this generation. It returns nil or the limit it would break.
// Keys count too, so that a worker cannot fill the store with empty values
// under huge keys.
func checkKVSet(key string, valueLen int, used int64, rank int, cfg Config) *limitError {
	if valueLen > cfg.MaxKVValue {
		return &limitError{limit: "MaxKVValue", max: int64(cfg.MaxKVValue), got: int64(valueLen),
			text: fmt.Sprintf("kv set %q: value of %d bytes is over the agent's limit of %d bytes per value (MaxKVValue)",
				key, valueLen, cfg.MaxKVValue)}
	}
	if n := used + int64(len(key)+valueLen); n > cfg.KVBytesPerRank {
		return &limitError{limit: "KVBytesPerRank", max: cfg.KVBytesPerRank, got: n,
			text: fmt.Sprintf("kv set %q: rank %d has written %d bytes of keys and values in this generation; %d more "+
				"would be over the agent's quota of %d bytes per rank and generation (KVBytesPerRank)",
				key, rank, used, len(key)+valueLen, cfg.KVBytesPerRank)}
	}
	return nil
}

// checkConn decides whether one more connection may open from pid of rank,
// which have perProcess and perRank connections open already.
func checkConn(pid, rank, perProcess, perRank int, cfg Config) *limitError {
	if perProcess >= cfg.MaxConnsPerProcess {
		return &limitError{limit: "MaxConnsPerProcess", max: int64(cfg.MaxConnsPerProcess), got: int64(perProcess + 1),
			text: fmt.Sprintf("too many control connections: pid %d has %d open, the agent's limit is %d per process (MaxConnsPerProcess)",
				pid, perProcess, cfg.MaxConnsPerProcess)}
	}
	if perRank >= cfg.MaxConnsPerRank {
		return &limitError{limit: "MaxConnsPerRank", max: int64(cfg.MaxConnsPerRank), got: int64(perRank + 1),
			text: fmt.Sprintf("too many control connections: rank %d has %d open, the agent's limit is %d per rank (MaxConnsPerRank)",
				rank, perRank, cfg.MaxConnsPerRank)}
	}
	return nil
}
