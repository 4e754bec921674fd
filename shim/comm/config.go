package comm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/host"
	"github.com/ddp-agent/ddp-agent/shim/status"
)

// Config is the JSON object ddpshim_open takes; ddpshim.h documents the keys.
type Config struct {
	Rank       *int   `json:"rank"`
	WorldSize  *int   `json:"world_size"`
	Transport  string `json:"transport"`
	Bootstrap  string `json:"bootstrap"`
	Socket     string `json:"socket"`
	Generation uint64 `json:"generation"`
	LocalRank  int    `json:"local_rank"`
	GlobalRank *int   `json:"global_rank"`
	TimeoutMS  int64  `json:"timeout_ms"`
	Host       string `json:"host"`
	MasterAddr string `json:"master_addr"`
	SHM        *bool  `json:"shm"`
	Name       string `json:"name"`
	LogLevel   string `json:"log_level"`
	NCCLLib    string `json:"nccl_lib"`
	CUDALib    string `json:"cuda_lib"`
	// NoteFile: see Note.
	NoteFile string `json:"note_file"`
	// Sidecar is the node's sidecar socket under bootstrap "external";
	// SidecarJob goes to it as wire.Hello.Job.
	Sidecar    string            `json:"sidecar"`
	SidecarJob map[string]string `json:"sidecar_job"`
	// FirstStep and FirstBucket name the collective the caller opens the
	// communicator for (the hook's first bucket). While the bootstrap
	// waits for the other ranks, the agent is told this rank has arrived
	// at it (an in-flight record), so a rank that never comes to the first
	// all-reduce is a hang like one that never comes to a later one.
	FirstStep   *uint64 `json:"first_step"`
	FirstBucket int32   `json:"first_bucket"`
}

const (
	defaultTimeout = 10 * time.Minute
	maxTimeout     = 30 * 24 * time.Hour // far beyond any sane collective; keeps deadlines from overflowing
)

// ParseConfig validates the JSON config and fills in defaults.
func ParseConfig(s string) (*Config, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields() // a misspelt key is an error, not a silent default
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, status.Errorf(status.Invalid, "config: %v", err)
	}
	if dec.More() {
		return nil, status.Errorf(status.Invalid, "config: trailing data after the JSON object")
	}
	switch {
	case c.WorldSize == nil || c.Rank == nil:
		return nil, status.Errorf(status.Invalid, "config: rank and world_size are required")
	case *c.WorldSize < 1:
		return nil, status.Errorf(status.Invalid, "config: world_size %d: must be at least 1", *c.WorldSize)
	case *c.Rank < 0 || *c.Rank >= *c.WorldSize:
		return nil, status.Errorf(status.Invalid, "config: rank %d outside [0, %d)", *c.Rank, *c.WorldSize)
	case c.TimeoutMS < 0:
		return nil, status.Errorf(status.Invalid, "config: timeout_ms %d is negative", c.TimeoutMS)
	case c.TimeoutMS > maxTimeout.Milliseconds():
		return nil, status.Errorf(status.Invalid, "config: timeout_ms %d is more than %v", c.TimeoutMS, maxTimeout)
	case c.FirstBucket < 0:
		return nil, status.Errorf(status.Invalid, "config: first_bucket %d is negative", c.FirstBucket)
	}
	switch c.Transport {
	case "", "host", "auto":
		c.Transport = "host"
	case "nccl":
	default:
		return nil, status.Errorf(status.Invalid, "config: unknown transport %q (want \"host\" or \"nccl\")", c.Transport)
	}
	switch c.Bootstrap {
	case "":
		c.Bootstrap = "external"
		if c.Socket != "" {
			c.Bootstrap = "agent"
		}
	case "agent":
		if c.Socket == "" {
			return nil, status.Errorf(status.Invalid, "config: bootstrap \"agent\" needs \"socket\" (DDP_AGENT_SOCKET)")
		}
	case "external":
	default:
		return nil, status.Errorf(status.Invalid, "config: unknown bootstrap %q (want \"agent\" or \"external\")", c.Bootstrap)
	}
	if c.GlobalRank == nil {
		c.GlobalRank = c.Rank
	}
	if c.Name == "" {
		c.Name = "default"
	}
	if strings.ContainsAny(c.Name, "/\n") {
		return nil, status.Errorf(status.Invalid, "config: name %q must not contain '/' or newlines", c.Name)
	}
	if _, err := c.level(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) timeout() time.Duration {
	if c.TimeoutMS == 0 {
		return defaultTimeout
	}
	return time.Duration(c.TimeoutMS) * time.Millisecond
}

func (c *Config) level() (slog.Level, error) {
	if c.LogLevel == "" {
		return slog.LevelWarn, nil
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return 0, status.Errorf(status.Invalid, "config: log_level %q: want debug, info, warn or error", c.LogLevel)
	}
	return l, nil
}

// blob is one rank's bootstrap record, exchanged as one line of JSON.
type blob struct {
	V    int `json:"v"`
	Rank int `json:"rank"`
	host.PeerInfo
}

const blobVersion = 1

func (b blob) encode() string {
	out, _ := json.Marshal(b) // plain strings and ints: cannot fail
	return string(out)
}

func decodeBlob(s string) (blob, error) {
	var b blob
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return blob{}, fmt.Errorf("bootstrap blob %q: %w", truncate(s, 80), err)
	}
	if b.V != blobVersion {
		return blob{}, fmt.Errorf("bootstrap blob version %d, want %d (mixed shim versions?)", b.V, blobVersion)
	}
	if b.Addr == "" || b.Nonce == "" {
		return blob{}, fmt.Errorf("bootstrap blob %q: addr and nonce are required", truncate(s, 80))
	}
	return b, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
