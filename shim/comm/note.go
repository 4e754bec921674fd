package comm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
)

// Note is what a process's communicators leave for the agent
// (Config.NoteFile, by default $DDP_AGENT_COMM_NOTE_FILE, one per worker)
// so that it can tell which rank of a failed attempt failed first: when a
// communicator of the process first closed (its peers see it go then,
// which may be long before the process exits), and, when its first failed
// collective was a peer's doing (the peer closed its communicator,
// aborted, or its connection broke), which peer, how and when. A worker
// with a peer failure is a victim of that peer, not a root cause. Ranks
// are the communicator's; the agent maps them to global ranks.
type Note struct {
	ClosedNanos int64 `json:"closed_unix_nano,omitempty"`

	Communicator string `json:"communicator,omitempty"` // the failed one's
	Rank         int    `json:"rank"`                   // this rank, in it
	WorldSize    int    `json:"world_size"`             // its size
	Peer         *int   `json:"peer,omitempty"`         // the rank that failed this one
	Kind         string `json:"kind,omitempty"`         // "closed", "lost" or "aborted"
	TimeNanos    int64  `json:"time_unix_nano,omitempty"`
	Message      string `json:"message,omitempty"`
}

// notes are the notes of this process, by file: one per worker, but tests
// run many ranks in one process.
var notes = struct {
	sync.Mutex
	m map[string]*Note
}{m: map[string]*Note{}}

// updateNote applies change to the process's note and writes it out when
// change says it changed.
func (c *Comm) updateNote(change func(*Note) bool) {
	path := c.cfg.noteFile()
	if path == "" {
		return
	}
	notes.Lock()
	defer notes.Unlock()
	n := notes.m[path]
	if n == nil {
		n = &Note{}
	}
	next := *n
	if !change(&next) {
		return
	}
	b, _ := json.Marshal(&next)
	if err := writeFile(path, b); err != nil {
		c.log.Warn("write the communicator note for the agent", "path", path, "err", err)
		return
	}
	notes.m[path] = &next
}

// notePeerFailure notes err, the comm's first failure, when a peer caused
// it. The process's first such note stays: a second communicator failing
// later fails for the same reason.
func (c *Comm) notePeerFailure(err error, at time.Time) {
	var pe *failure.PeerError
	if !errors.As(err, &pe) {
		return
	}
	c.updateNote(func(n *Note) bool {
		if n.Peer != nil {
			return false
		}
		n.Communicator, n.Rank, n.WorldSize, n.Peer = c.cfg.Name, c.rank, c.size, &pe.Rank
		n.Kind, n.TimeNanos, n.Message = string(pe.Kind), at.UnixNano(), err.Error()
		return true
	})
}

// noteClosed notes that a connected communicator closes now, unless one
// of the process's did before.
func (c *Comm) noteClosed(at time.Time) {
	c.updateNote(func(n *Note) bool {
		if n.ClosedNanos != 0 {
			return false
		}
		n.ClosedNanos = at.UnixNano()
		return true
	})
}

// writeFile replaces path with b: a reader sees the old file or the whole
// new one.
func writeFile(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
