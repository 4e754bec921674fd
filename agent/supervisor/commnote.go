package supervisor

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// PeerFailure is what a worker's shim notes (DDP_AGENT_COMM_NOTE_FILE)
// when its first failed collective was a peer's doing: the worker failed
// only because Peer closed its communicator, aborted, or died.
type PeerFailure struct {
	Peer    int       // the peer's global rank; -1 when the communicator's ranks are not the job's
	Kind    string    // "closed", "lost" (its connection broke: it died) or "aborted"
	Time    time.Time // when the worker's collective failed
	Message string    // the shim's error
}

// noteLimit bounds what is read: the file is the worker's to write.
const noteLimit = 64 << 10

// readCommNote reads the note at path that the shim of a worker of a job
// of worldSize ranks leaves (DDP_AGENT_COMM_NOTE_FILE; shim/comm.Note):
// when the worker first closed a communicator (zero: never), and its peer
// failure (nil: none). A communicator as large as the job holds every rank,
// in the order of their global ranks (torch sorts a group's ranks), so its
// ranks are global ranks; a smaller one's are not, and the peer is then
// unknown (-1).
func readCommNote(path string, worldSize int) (closed time.Time, pf *PeerFailure, err error) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, nil, err
	}
	defer f.Close()
	var raw struct {
		ClosedNanos int64  `json:"closed_unix_nano"`
		WorldSize   int    `json:"world_size"`
		Peer        *int   `json:"peer"`
		Kind        string `json:"kind"`
		TimeNanos   int64  `json:"time_unix_nano"`
		Message     string `json:"message"`
	}
	if err := json.NewDecoder(io.LimitReader(f, noteLimit)).Decode(&raw); err != nil {
		return time.Time{}, nil, fmt.Errorf("parse communicator note %s: %w", path, err)
	}
	if raw.ClosedNanos > 0 {
		closed = time.Unix(0, raw.ClosedNanos)
	}
	if raw.Peer == nil {
		return closed, nil, nil
	}
	if raw.TimeNanos <= 0 {
		return closed, nil, fmt.Errorf("communicator note %s: a peer failure without a time", path)
	}
	pf = &PeerFailure{Peer: *raw.Peer, Kind: raw.Kind, Time: time.Unix(0, raw.TimeNanos), Message: raw.Message}
	if raw.WorldSize != worldSize || pf.Peer < 0 || pf.Peer >= worldSize {
		pf.Peer = -1
	}
	return closed, pf, nil
}
