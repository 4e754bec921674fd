package supervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestOutcomes: a worker that failed only because its peer closed is
// reaped first; Outcomes has its exit and its shim's note, and the peer,
// still running, without an exit until WaitExited has seen it go, and
// when it wrote its error file.
func TestOutcomes(t *testing.T) {
	spec, _, _ := testSpec(t, "peernote", 2, Streams{})
	g := start(t, spec)
	var first *WorkerExitError
	if err := g.Wait(context.Background()); !errors.As(err, &first) || first.Rank != 1 {
		t.Fatalf("Wait: got %v, want rank 1's exit", err)
	}
	out := g.Outcomes()
	if len(out) != 2 || out[1].Exit == nil || !out[1].Exit.Failed() || out[1].Exit.Time.IsZero() {
		t.Fatalf("outcomes %+v, want rank 1 failed with its exit time", out)
	}
	if p := out[1].Peer; p == nil || p.Peer != 0 || p.Kind != "closed" || p.Time.UnixNano() != 1700000000000000000 {
		t.Errorf("rank 1's note %+v, want rank 0 closed at 1700000000 s", p)
	}
	if out[0].Exit != nil || out[0].Peer != nil {
		t.Errorf("rank 0 %+v: want running, no note", out[0])
	}
	if !g.WaitExited(context.Background(), 0, 10*time.Second) {
		t.Fatal("rank 0 not reaped")
	}
	out = g.Outcomes()
	if out[0].Closed.UnixNano() != 1699999999000000000 {
		t.Errorf("rank 0 closed at %v, want its note's time", out[0].Closed)
	}
	if e := out[0].Exit; e == nil || e.Code != 2 || !e.Time.After(out[1].Exit.Time) {
		t.Errorf("rank 0's exit %+v, want code 2 after rank 1's", e)
	}
	if r := out[0].Raised; r.IsZero() || r.After(out[0].Exit.Time) || !out[1].Raised.IsZero() {
		t.Errorf("rank 0 raised at %v (exit %v), rank 1 at %v: want rank 0's error file's time, before its exit, and none for rank 1",
			r, out[0].Exit.Time, out[1].Raised)
	}
	if g.WaitExited(context.Background(), 7, time.Millisecond) {
		t.Error("WaitExited of a rank that is not this group's")
	}
}

// TestReadCommNote: a communicator as large as the job names global
// ranks; a smaller one's peer is unknown; a note may say only when the
// worker closed; a peer failure without a time is an error.
func TestReadCommNote(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "n.json")
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	closed, pf, err := readCommNote(write(`{"closed_unix_nano": 9, "world_size": 4, "peer": 3, "kind": "lost", "time_unix_nano": 5, "message": "m"}`), 4)
	if err != nil || closed.UnixNano() != 9 || pf == nil || pf.Peer != 3 || pf.Kind != "lost" || pf.Time.UnixNano() != 5 || pf.Message != "m" {
		t.Errorf("got %v %+v, %v; want closed at 9 ns, peer 3 lost at 5 ns", closed, pf, err)
	}
	if _, pf, err := readCommNote(write(`{"world_size": 2, "peer": 1, "kind": "closed", "time_unix_nano": 5}`), 4); err != nil || pf.Peer != -1 {
		t.Errorf("a subgroup's note: got %+v, %v; want peer -1", pf, err)
	}
	if closed, pf, err := readCommNote(write(`{"closed_unix_nano": 7, "rank": 0, "world_size": 4}`), 4); err != nil || pf != nil || closed.UnixNano() != 7 {
		t.Errorf("a close only: got %v %+v, %v", closed, pf, err)
	}
	if _, _, err := readCommNote(write(`{"world_size": 4, "peer": 1, "kind": "closed"}`), 4); err == nil {
		t.Error("a peer failure without a time was accepted")
	}
	if _, _, err := readCommNote(filepath.Join(dir, "none.json"), 4); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("no note: got %v, want ErrNotExist", err)
	}
}
