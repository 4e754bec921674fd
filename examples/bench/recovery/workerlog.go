package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"time"
)

// record is one line of workers.jsonl, written by worker.py: a phase of a
// worker (init, start, fail) with its rank, world and launcher.
type record struct {
	T        float64 `json:"t"`
	Phase    string  `json:"phase"`
	Rank     int     `json:"rank"`
	World    int     `json:"world"`
	Gen      int     `json:"gen"`
	PID      int     `json:"pid"`
	Node     int     `json:"node"`
	Launcher int     `json:"launcher"`
}

func (r record) at() time.Time {
	sec, frac := math.Modf(r.T)
	return time.Unix(int64(sec), int64(frac*1e9))
}

// workerLogReader follows workers.jsonl as the workers append to it.
type workerLogReader struct {
	path string
	off  int64
	part []byte
	recs []record
}

// poll reads the lines appended since the last call.
func (w *workerLogReader) poll() error {
	f, err := os.Open(w.path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(w.off, io.SeekStart); err != nil {
		return err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	w.off += int64(len(b))
	b = append(w.part, b...)
	last := bytes.LastIndexByte(b, '\n')
	if last < 0 {
		w.part = b
		return nil
	}
	w.part = append([]byte(nil), b[last+1:]...)
	for _, line := range bytes.Split(b[:last], []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r record
		if err := json.Unmarshal(line, &r); err != nil {
			return fmt.Errorf("%s: bad line %q: %w", w.path, line, err)
		}
		w.recs = append(w.recs, r)
	}
	return nil
}

// formed reports whether every rank of a world of size world logged its
// "init" line after t0 (from a launcher other than exclude), and when the
// last of them did: the moment the whole world runs user code.
func (w *workerLogReader) formed(world int, t0 time.Time, exclude int) (time.Time, bool) {
	return w.lastOfFirsts("init", world, t0, exclude)
}

// lastOfFirsts takes each rank's first line of the phase after t0, in a
// world of size world and from a launcher other than exclude, and returns
// the latest of them, once every rank has one.
func (w *workerLogReader) lastOfFirsts(phase string, world int, t0 time.Time, exclude int) (time.Time, bool) {
	first := map[int]time.Time{}
	for _, r := range w.recs {
		if r.Phase != phase || r.World != world || r.Rank < 0 || r.Rank >= world || r.Launcher == exclude && exclude >= 0 {
			continue
		}
		t := r.at()
		if !t.After(t0) {
			continue
		}
		if old, ok := first[r.Rank]; !ok || t.Before(old) {
			first[r.Rank] = t
		}
	}
	if len(first) < world {
		return time.Time{}, false
	}
	var last time.Time
	for _, t := range first {
		if t.After(last) {
			last = t
		}
	}
	return last, true
}

// first is the earliest line of the phase after t0, from a launcher other
// than exclude (world: any if < 0).
func (w *workerLogReader) first(phase string, t0 time.Time, exclude, world int) (time.Time, bool) {
	var best time.Time
	for _, r := range w.recs {
		if r.Phase != phase || r.Launcher == exclude || world >= 0 && r.World != world {
			continue
		}
		if t := r.at(); t.After(t0) && (best.IsZero() || t.Before(best)) {
			best = t
		}
	}
	return best, !best.IsZero()
}

// groupRankOf is the GROUP_RANK the launcher had in a world of size world.
func (w *workerLogReader) groupRankOf(launcher, world int) int {
	gr := -1
	for _, r := range w.recs {
		if r.Phase == "init" && r.Launcher == launcher && r.World == world {
			gr = r.Node
		}
	}
	return gr
}
