package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// startProbe starts rdzv_probe.py against the rendezvous store and waits
// for its first reading of the state.
func startProbe(ctx context.Context, c config, reap *reaper, dir string, port int, id, tag, out string) (*node, error) {
	script := filepath.Join(filepath.Dir(c.script), "rdzv_probe.py")
	argv := []string{c.python, script, "127.0.0.1", strconv.Itoa(port), id, out}
	p, err := startProc(reap, -1, argv, nil, tag, filepath.Join(dir, "rdzv_probe.log"), nil)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if st, err := os.Stat(out); err == nil && st.Size() > 0 {
			return p, nil
		}
		if p.exited() {
			<-waitTimeout(p.logDone, time.Second)
			return p, fmt.Errorf("rdzv_probe.py exited: %v:\n%s", p.waitErr, p.lastLines())
		}
		if time.Now().After(deadline) {
			return p, fmt.Errorf("rdzv_probe.py read no state within 30s")
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return p, err
		}
	}
}

// probeRecord is one line of rdzv_probe.py: the rendezvous state it read.
type probeRecord struct {
	T        float64  `json:"t"`
	Round    int      `json:"round"`
	Complete bool     `json:"complete"`
	Deadline *float64 `json:"deadline"`
}

// probeBreakdown reads the probe's log: the round at the kill, when the
// next round opened (the dead node's keep-alive had expired and it was
// dropped), when its last call began and how long it was, when it completed.
func probeBreakdown(path string, t0 time.Time, r *result) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	at := func(sec float64) time.Time {
		s, f := math.Modf(sec)
		return time.Unix(int64(s), int64(f*1e9))
	}
	var recs []probeRecord
	for _, line := range bytes.Split(b, []byte("\n")) {
		var pr probeRecord
		if json.Unmarshal(line, &pr) == nil {
			recs = append(recs, pr)
		}
	}
	round := -1
	for _, pr := range recs {
		if !at(pr.T).After(t0) {
			round = pr.Round
		}
	}
	if round < 0 {
		return
	}
	for _, pr := range recs {
		t := at(pr.T)
		if !t.After(t0) || pr.Round <= round {
			continue
		}
		if r.dropped < 0 {
			r.dropped = t.Sub(t0)
		}
		if r.lastCall < 0 && pr.Deadline != nil {
			r.lastCall = t.Sub(t0)
			r.lastCallLen = at(*pr.Deadline).Sub(t)
		}
		if r.complete < 0 && pr.Complete {
			r.complete = t.Sub(t0)
		}
	}
}
