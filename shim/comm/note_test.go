package comm

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// hostWorld opens n host-transport communicators in this process,
// bootstrapped by exchanging blobs; rank r notes a peer's failure in
// notes[r].
func hostWorld(t *testing.T, n int) (comms []*Comm, notes []string) {
	t.Helper()
	dir := t.TempDir()
	notes = make([]string, n)
	for r := range n {
		notes[r] = filepath.Join(dir, "note_"+strconv.Itoa(r)+".json")
	}
	return openWorld(t, n, func(r int) string {
		return `{"rank":` + strconv.Itoa(r) + `,"world_size":` + strconv.Itoa(n) +
			`,"timeout_ms":20000,"name":"t","shm":false,"note_file":"` + notes[r] + `"}`
	}), notes
}

func hostAllReduce(c *Comm, buf []float32) error {
	w, err := c.AllReduce(unsafe.Pointer(&buf[0]), int64(len(buf)), reduce.Float32, reduce.Sum, nil, 1, 0)
	if err != nil {
		return err
	}
	return w.Wait()
}

func readNote(t *testing.T, path string) (Note, bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Note{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var n Note
	if err := json.Unmarshal(b, &n); err != nil {
		t.Fatalf("%s: %v: %s", path, err, b)
	}
	return n, true
}

// TestNote: a rank whose collective fails because its peer closed its
// communicator notes who and when, once, before the caller hears of the
// failure; the rank that closed notes when, and nothing more; a rank
// aborted by the agent notes nothing.
func TestNote(t *testing.T) {
	comms, notes := hostWorld(t, 2)
	buf := make([]float32, 1024)
	before := time.Now()
	comms[0].Close()
	closed := time.Now()
	if err := hostAllReduce(comms[1], buf); err == nil {
		t.Fatal("all-reduce with a closed peer succeeded")
	}
	n, ok := readNote(t, notes[1])
	if !ok || n.Peer == nil {
		t.Fatalf("rank 1 noted %+v, want its peer failure", n)
	}
	if *n.Peer != 0 || n.Kind != "closed" || n.Rank != 1 || n.WorldSize != 2 || n.Communicator != "t" || n.ClosedNanos != 0 {
		t.Errorf("note %+v, want rank 1 of 2 failed by rank 0 (closed) in communicator t, not closed itself", n)
	}
	if at := time.Unix(0, n.TimeNanos); at.Before(before) || at.After(time.Now()) {
		t.Errorf("note time %v, want between %v and now", at, before)
	}
	n0, ok := readNote(t, notes[0])
	if !ok || n0.Peer != nil || time.Unix(0, n0.ClosedNanos).Before(before) || time.Unix(0, n0.ClosedNanos).After(closed) {
		t.Errorf("rank 0 noted %+v, want only when it closed", n0)
	}
	// A later failure (the comm refuses everything now) keeps the first note.
	old, _ := os.ReadFile(notes[1])
	_ = hostAllReduce(comms[1], buf)
	if now, _ := os.ReadFile(notes[1]); string(now) != string(old) {
		t.Errorf("note rewritten: %s, was %s", now, old)
	}
	comms[1].Close()
	if n, _ := readNote(t, notes[1]); n.Peer == nil || *n.Peer != 0 || n.ClosedNanos == 0 {
		t.Errorf("after its close rank 1 noted %+v, want the peer failure and the close", n)
	}

	// Aborted from outside (the agent's Abort): its own doing, no note.
	comms, notes = hostWorld(t, 2)
	comms[1].Abort(errors.New("agent: job moving to a new generation"))
	if err := hostAllReduce(comms[1], buf); err == nil {
		t.Fatal("all-reduce on an aborted comm succeeded")
	}
	if n, ok := readNote(t, notes[1]); ok {
		t.Errorf("an aborted rank noted %+v", n)
	}
}
