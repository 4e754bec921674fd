package relay

import (
	"bytes"
	"encoding/binary"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

var tBase = time.Unix(1_750_000_000, 123_456_789)

func sampleRecords() []telemetry.Record {
	return []telemetry.Record{
		{Gen: 1, Step: 2, Bucket: 3, Rank: 4, Bytes: 25 << 20, DType: 7, Status: 0,
			Arrive: tBase, Start: tBase.Add(time.Millisecond), End: tBase.Add(3 * time.Millisecond)},
		{Gen: math.MaxUint64, Step: math.MaxUint64, Bucket: math.MaxUint32, Rank: math.MaxInt32, Bytes: math.MaxUint64,
			DType: 255, Status: telemetry.StatusInFlight, Arrive: tBase.Add(-time.Hour)}, // in flight: Start and End zero
		{}, // all zero
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		recs    []telemetry.Record
		dropped uint64
	}{
		{"empty", nil, 0},
		{"samples", sampleRecords(), 42},
		{"max batch", make([]telemetry.Record, MaxBatch), math.MaxUint64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := appendRecords(nil, tc.recs, tc.dropped)
			if want := recordsHeader + len(tc.recs)*recordSize; len(b) != want {
				t.Fatalf("encoded %d bytes, want %d", len(b), want)
			}
			got, dropped, err := decodeRecords(b)
			if err != nil {
				t.Fatal(err)
			}
			if dropped != tc.dropped {
				t.Errorf("dropped: got %d, want %d", dropped, tc.dropped)
			}
			if len(got) != len(tc.recs) {
				t.Fatalf("got %d records, want %d", len(got), len(tc.recs))
			}
			for i := range got {
				if !sameRecord(got[i], tc.recs[i]) {
					t.Errorf("record %d: got %+v, want %+v", i, got[i], tc.recs[i])
				}
			}
		})
	}
}

// sameRecord compares records, times by instant (zero only to zero).
func sameRecord(a, b telemetry.Record) bool {
	ta := [3]time.Time{a.Arrive, a.Start, a.End}
	tb := [3]time.Time{b.Arrive, b.Start, b.End}
	for i := range ta {
		if ta[i].IsZero() != tb[i].IsZero() || !ta[i].Equal(tb[i]) {
			return false
		}
	}
	a.Arrive, a.Start, a.End, b.Arrive, b.Start, b.End = time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return a == b
}

// batch builds a records batch from its parts, for malformed ones.
func batch(magic string, version uint8, count uint32, body []byte) []byte {
	b := append([]byte(magic), version, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, count)
	b = binary.LittleEndian.AppendUint64(b, 0)
	return append(b, body...)
}

func malformedRecords() map[string][]byte {
	one := appendRecords(nil, sampleRecords()[:1], 0)
	badRank := bytes.Clone(one)
	binary.LittleEndian.PutUint32(badRank[recordsHeader+20:], 1<<31)
	return map[string][]byte{
		"empty":           {},
		"short header":    one[:recordsHeader-1],
		"bad magic":       batch("DDPX", recordsVersion, 0, nil),
		"bad version":     batch(recordsMagic, 2, 0, nil),
		"count too big":   batch(recordsMagic, recordsVersion, 2, one[recordsHeader:]),
		"count too small": batch(recordsMagic, recordsVersion, 0, one[recordsHeader:]),
		"truncated":       one[:len(one)-1],
		"trailing byte":   append(bytes.Clone(one), 0),
		"over MaxBatch":   batch(recordsMagic, recordsVersion, MaxBatch+1, nil),
		"huge count":      batch(recordsMagic, recordsVersion, math.MaxUint32, nil),
		"rank over int32": badRank,
	}
}

func TestDecodeRecordsMalformed(t *testing.T) {
	for name, b := range malformedRecords() {
		t.Run(name, func(t *testing.T) {
			if recs, _, err := decodeRecords(b); err == nil {
				t.Fatalf("decoded %d records, want an error", len(recs))
			}
		})
	}
}

// FuzzDecodeRecords: whatever decodes re-encodes to a batch that decodes
// to the same records.
func FuzzDecodeRecords(f *testing.F) {
	f.Add(appendRecords(nil, sampleRecords(), 7))
	for _, b := range malformedRecords() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, dropped, err := decodeRecords(b)
		if err != nil {
			return
		}
		if len(b) != recordsHeader+len(recs)*recordSize {
			t.Fatalf("decoded %d records from %d bytes", len(recs), len(b))
		}
		again, dropped2, err := decodeRecords(appendRecords(nil, recs, dropped))
		if err != nil {
			t.Fatalf("decode re-encoded: %v", err)
		}
		if dropped2 != dropped || !reflect.DeepEqual(again, recs) {
			t.Fatalf("round trip: got %+v (%d), want %+v (%d)", again, dropped2, recs, dropped)
		}
	})
}

// FuzzDecodeJSON: the JSON bodies never panic the decoders, and what they
// accept is within the limits.
func FuzzDecodeJSON(f *testing.F) {
	f.Add([]byte(`{"workers":[{"rank":1,"local_rank":1,"host":"n","pid":3,"gpu":"GPU-1","gpu_index":0}]}`))
	f.Add([]byte(`{"stacks":{"3":"Traceback"}}`))
	f.Add([]byte(`{"stacks":{"x":"y"}}`))
	f.Add([]byte(`{"workers":[{"rank":-1}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if ws, err := decodeWorkers(b); err == nil {
			for _, w := range ws {
				if !validRank(w.Rank) || len(w.Host) > maxText || len(w.GPU) > maxText {
					t.Fatalf("accepted worker %+v", w)
				}
			}
		}
		if st, err := decodeStacks(b); err == nil {
			for r, s := range st {
				if !validRank(r) || len(s) > MaxStack {
					t.Fatalf("accepted stack of rank %d, %d bytes", r, len(s))
				}
			}
		}
	})
}

func TestTruncStack(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		cut  bool
	}{
		{"short", "Traceback\n  File x\n", false},
		{"exactly the limit", strings.Repeat("a", MaxStack), false},
		{"ascii over", strings.Repeat("a", MaxStack+1), true},
		{"utf-8 over", strings.Repeat("é", MaxStack), true}, // 2 bytes each: a cut could split one
		{"3-byte runes", "x" + strings.Repeat("→", MaxStack/2), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := truncStack(tc.in)
			if len(got) > MaxStack {
				t.Errorf("got %d bytes, want at most %d", len(got), MaxStack)
			}
			if !utf8.ValidString(got) {
				t.Error("got invalid UTF-8")
			}
			if cut := got != tc.in; cut != tc.cut {
				t.Errorf("cut: got %v, want %v", cut, tc.cut)
			}
			if tc.cut && !strings.HasSuffix(got, "[stack truncated by ddp-agent]\n") {
				t.Errorf("no truncation note: ...%q", got[len(got)-40:])
			}
		})
	}
}

func TestValidNode(t *testing.T) {
	for _, tc := range []struct {
		name string
		node string
		want bool
	}{
		{"host", "gpu-node-17.cluster", true},
		{"with space", "node 1", true},
		{"empty", "", false},
		{"leading space", " node", false},
		{"trailing space", "node ", false},
		{"control", "node\n1", false},
		{"non-ascii", "nœud", false},
		{"too long", strings.Repeat("n", maxNode+1), false},
		{"longest", strings.Repeat("n", maxNode), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := validNode(tc.node); got != tc.want {
				t.Errorf("validNode(%q): got %v, want %v", tc.node, got, tc.want)
			}
		})
	}
}

func TestJobToken(t *testing.T) {
	a := JobToken("job-1", "s3cret")
	if a != JobToken("job-1", "s3cret") {
		t.Error("not deterministic")
	}
	if len(a) != 64 {
		t.Errorf("got %d hex digits, want 64", len(a))
	}
	for _, other := range []string{JobToken("job-2", "s3cret"), JobToken("job-1", "other"), JobToken("job-1", "")} {
		if other == a {
			t.Errorf("token %s repeats for another job or secret", other)
		}
	}
}

// TestWorkersRoundTrip: every field of a worker, its GPU state included,
// reaches the leader as sent.
func TestWorkersRoundTrip(t *testing.T) {
	ws := []telemetry.Worker{
		{Rank: 5, LocalRank: 1, Host: "node-b", PID: 4411, GPU: "GPU-5c1e", GPUIndex: 1, GPUState: "83°C, SM 1200/1410 MHz, throttled: sw power cap",
			GPUSlowdown: "throttled: sw power cap", HostSlowdown: "its threads waited for a CPU 23% of the time"},
		{Rank: 4, LocalRank: 0, Host: "node-b", PID: 4410, GPUIndex: -1},
	}
	b, err := encodeWorkers(ws)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeWorkers(b)
	if err != nil || !reflect.DeepEqual(got, ws) {
		t.Errorf("round trip: %+v, %v; want %+v", got, err, ws)
	}
}
