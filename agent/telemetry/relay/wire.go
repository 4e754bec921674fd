package relay

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/wire"
)

// The records batch; the layout is in the package comment. Its records are
// wire.RankedEvent, in the codec the control protocol's events share.
const (
	recordsMagic   = "DDPR"
	recordsVersion = 1
	recordsHeader  = 20
	recordSize     = wire.RankedSize
)

// appendRecords appends the batch of recs, with the sender's dropped
// total, to b. Every rank must be in [0, MaxInt32].
func appendRecords(b []byte, recs []telemetry.Record, dropped uint64) []byte {
	le := binary.LittleEndian
	b = append(b, recordsMagic...)
	b = append(b, recordsVersion, 0, 0, 0)
	b = le.AppendUint32(b, uint32(len(recs)))
	b = le.AppendUint64(b, dropped)
	for _, r := range recs {
		b = wire.AppendRanked(b, wire.RankedEvent{Gen: r.Gen, Rank: uint32(r.Rank), CollectiveEvent: wire.CollectiveEvent{
			Step: r.Step, Bucket: r.Bucket, Bytes: r.Bytes, DType: r.DType, Status: r.Status,
			TArrive: unixNano(r.Arrive), TStart: unixNano(r.Start), TEnd: unixNano(r.End),
		}})
	}
	return b
}

// decodeRecords parses a records batch. It checks every length before it
// reads and allocates no more than the body's size warrants.
func decodeRecords(b []byte) (recs []telemetry.Record, dropped uint64, err error) {
	le := binary.LittleEndian
	if len(b) < recordsHeader {
		return nil, 0, fmt.Errorf("records batch of %d bytes: shorter than its %d-byte header", len(b), recordsHeader)
	}
	if string(b[:4]) != recordsMagic {
		return nil, 0, fmt.Errorf("records batch: bad magic %q", b[:4])
	}
	if b[4] != recordsVersion {
		return nil, 0, fmt.Errorf("records batch: version %d, want %d", b[4], recordsVersion)
	}
	n := le.Uint32(b[8:])
	if n > MaxBatch {
		return nil, 0, fmt.Errorf("records batch of %d records: over the limit of %d", n, MaxBatch)
	}
	if want := recordsHeader + int(n)*recordSize; len(b) != want {
		return nil, 0, fmt.Errorf("records batch of %d records: %d bytes, want %d", n, len(b), want)
	}
	dropped = le.Uint64(b[12:])
	recs = make([]telemetry.Record, n)
	p := b[recordsHeader:]
	for i := range recs {
		r := wire.DecodeRanked(p[i*recordSize:])
		if r.Rank > math.MaxInt32 {
			return nil, 0, fmt.Errorf("records batch: record %d: rank %d out of range", i, r.Rank)
		}
		recs[i] = telemetry.Record{
			Gen: r.Gen, Step: r.Step, Bucket: r.Bucket, Rank: int(r.Rank),
			Bytes: r.Bytes, DType: r.DType, Status: r.Status,
			Arrive: fromUnixNano(r.TArrive),
			Start:  fromUnixNano(r.TStart),
			End:    fromUnixNano(r.TEnd),
		}
	}
	return recs, dropped, nil
}

// unixNano is t in Unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// shift moves t by d; the zero time stays zero.
func shift(t time.Time, d time.Duration) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(d)
}

// validRank: ranks travel as uint32 and must fit an int on every platform.
func validRank(r int) bool { return r >= 0 && int64(r) <= math.MaxInt32 }

// The JSON messages. The wire types are our own, so that a field renamed
// in package telemetry does not change the protocol.

type timeMsg struct {
	UnixNano int64 `json:"unix_nano"`
}

type workerJSON struct {
	Rank      int    `json:"rank"`
	LocalRank int    `json:"local_rank"`
	Host      string `json:"host,omitempty"`
	PID       int    `json:"pid,omitempty"`
	GPU       string `json:"gpu,omitempty"`
	GPUIndex  int    `json:"gpu_index"`
	GPUState  string `json:"gpu_state,omitempty"`
	GPUSlow   string `json:"gpu_slowdown,omitempty"`
	HostSlow  string `json:"host_slowdown,omitempty"`
}

type workersMsg struct {
	Workers []workerJSON `json:"workers"`
}

type stacksMsg struct {
	Stacks map[int]string `json:"stacks"`
}

type hangJSON struct {
	Gen     uint64 `json:"gen"`
	Step    uint64 `json:"step"`
	Bucket  uint32 `json:"bucket"`
	Since   int64  `json:"since"` // Unix ns on the leader's clock
	Waiting []int  `json:"waiting"`
	Missing []int  `json:"missing"`
}

type hangsMsg struct {
	Epoch string     `json:"epoch"`
	Seq   uint64     `json:"seq"` // the newest hang request's number: the next poll's after
	Hangs []hangJSON `json:"hangs"`
}

// maxText bounds the host and GPU strings of a worker.
const maxText = 1024

func encodeWorkers(ws []telemetry.Worker) ([]byte, error) {
	m := workersMsg{Workers: make([]workerJSON, len(ws))}
	for i, w := range ws {
		m.Workers[i] = workerJSON{Rank: w.Rank, LocalRank: w.LocalRank, Host: w.Host, PID: w.PID, GPU: w.GPU, GPUIndex: w.GPUIndex,
			GPUState: w.GPUState, GPUSlow: w.GPUSlowdown, HostSlow: w.HostSlowdown}
	}
	return json.Marshal(m)
}

func decodeWorkers(b []byte) ([]telemetry.Worker, error) {
	var m workersMsg
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	if len(m.Workers) > MaxBatch {
		return nil, fmt.Errorf("workers: %d, over the limit of %d", len(m.Workers), MaxBatch)
	}
	ws := make([]telemetry.Worker, len(m.Workers))
	for i, w := range m.Workers {
		if !validRank(w.Rank) {
			return nil, fmt.Errorf("workers: rank %d out of range", w.Rank)
		}
		if len(w.Host) > maxText || len(w.GPU) > maxText || len(w.GPUState) > maxText ||
			len(w.GPUSlow) > maxText || len(w.HostSlow) > maxText {
			return nil, fmt.Errorf("workers: rank %d: host, GPU, GPU state or slowdown longer than %d bytes", w.Rank, maxText)
		}
		ws[i] = telemetry.Worker{Rank: w.Rank, LocalRank: w.LocalRank, Host: w.Host, PID: w.PID, GPU: w.GPU, GPUIndex: w.GPUIndex,
			GPUState: w.GPUState, GPUSlowdown: w.GPUSlow, HostSlowdown: w.HostSlow}
	}
	return ws, nil
}

func decodeStacks(b []byte) (map[int]string, error) {
	var m stacksMsg
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("stacks: %w", err)
	}
	if len(m.Stacks) > MaxBatch {
		return nil, fmt.Errorf("stacks: %d ranks, over the limit of %d", len(m.Stacks), MaxBatch)
	}
	for r, s := range m.Stacks {
		if !validRank(r) {
			return nil, fmt.Errorf("stacks: rank %d out of range", r)
		}
		if len(s) > MaxStack {
			return nil, fmt.Errorf("stacks: rank %d: %d bytes, over the limit of %d", r, len(s), MaxStack)
		}
	}
	if m.Stacks == nil {
		m.Stacks = map[int]string{}
	}
	return m.Stacks, nil
}

// truncStack cuts a stack to MaxStack bytes, keeping its beginning (the
// current thread's frames come first in faulthandler's dump) and saying
// so, without splitting a UTF-8 sequence.
func truncStack(s string) string {
	if len(s) <= MaxStack {
		return s
	}
	const note = "\n[stack truncated by ddp-agent]\n"
	n := MaxStack - len(note)
	for n > 0 && s[n]&0xC0 == 0x80 { // s[n] continues a sequence: cut before its start
		n--
	}
	return s[:n] + note
}

func hangToJSON(h telemetry.Hang) hangJSON {
	return hangJSON{Gen: h.Gen, Step: h.Step, Bucket: h.Bucket, Since: unixNano(h.Since), Waiting: h.Waiting, Missing: h.Missing}
}

func hangFromJSON(j hangJSON) telemetry.Hang {
	return telemetry.Hang{Key: telemetry.Key{Gen: j.Gen, Step: j.Step, Bucket: j.Bucket},
		Since: fromUnixNano(j.Since), Waiting: j.Waiting, Missing: j.Missing}
}
