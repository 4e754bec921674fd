package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

// sampleMessages returns one message of every type, with non-zero fields.
func sampleMessages() []struct {
	name string
	msg  Message
} {
	return []struct {
		name string
		msg  Message
	}{
		{"hello", Hello{Rank: 3, LocalRank: 1, PID: 4242, Generation: 7, Transports: []string{"nccl", "gloo"}}},
		{"hello_empty", Hello{Rank: -1}},
		{"hello_sidecar", Hello{Rank: 2, LocalRank: 0, PID: 77, Generation: 1, Transports: []string{"host"}, Job: map[string]string{HelloJob: "j1", HelloWorldSize: "4"}}},
		{"welcome", Welcome{JobID: "job-1", Generation: 7, WorldSize: 16, Rank: 3, Config: map[string]string{"b": "2", "a": "1", "": ""}}},
		{"welcome_empty", Welcome{}},
		{"kvset", KVSet{Key: "rank/3/addr", Value: []byte("10.0.0.1:29500\x00\xff")}},
		{"kvset_empty", KVSet{Key: "k"}},
		{"kvget", KVGet{Key: "rank/0/addr", TimeoutMillis: 1500}},
		{"kvvalue", KVValue{Value: []byte{1, 2, 3}}},
		{"ok", OK{}},
		{"events", Events{Dropped: 9, Events: []CollectiveEvent{
			{Step: 1, Bucket: 2, Bytes: 1 << 30, DType: 7, Status: 1, TArrive: -5, TStart: 1700000000000000000, TEnd: 1700000000000001000},
			{Step: 2},
		}}},
		{"events_empty", Events{}},
		{"abort", Abort{Reason: "rank 5 hung in allreduce"}},
		{"error", Error{Code: CodeTimeout, Message: "kv get \"x\": timeout"}},
		{"reformed", Reformed{Reform: 1, Step: 12, Resume: 12, Source: 1, Error: "RuntimeError: injected fault",
			Phases: []Phase{{"abort", 310}, {"rendezvous", 41_000}, {"process_group", 9_500}, {"state", 2_100}, {"first_step", 30_000}}}},
		{"reformed_empty", Reformed{}},
	}
}

func encode(t testing.TB, id uint32, m Message) []byte {
	t.Helper()
	b, err := AppendFrame(nil, id, m)
	if err != nil {
		t.Fatalf("encode %v: %v", m.Type(), err)
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range sampleMessages() {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteFrame(&buf, 99, tc.msg); err != nil {
				t.Fatalf("WriteFrame: %v", err)
			}
			f, err := ReadFrame(&buf, 0)
			if err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			if f.Type != tc.msg.Type() || f.ID != 99 {
				t.Errorf("header: got %v/%d, want %v/99", f.Type, f.ID, tc.msg.Type())
			}
			got, err := Decode(f)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			want := tc.msg
			if w, ok := want.(Welcome); ok && len(w.Config) == 0 {
				w.Config = nil
				want = w
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %#v, want %#v", got, want)
			}
			if buf.Len() != 0 {
				t.Errorf("got %d unread bytes, want 0", buf.Len())
			}
		})
	}
}

// frame builds a raw frame with the given header fields and payload.
func frame(magic uint16, version, typ uint8, length uint32, payload []byte) []byte {
	b := binary.LittleEndian.AppendUint16(nil, magic)
	b = append(b, version, typ)
	b = binary.LittleEndian.AppendUint32(b, 1)
	b = binary.LittleEndian.AppendUint32(b, length)
	return append(b, payload...)
}

func payload(parts ...any) []byte {
	var b []byte
	for _, p := range parts {
		switch p := p.(type) {
		case uint8:
			b = append(b, p)
		case uint16:
			b = binary.LittleEndian.AppendUint16(b, p)
		case uint32:
			b = binary.LittleEndian.AppendUint32(b, p)
		case uint64:
			b = binary.LittleEndian.AppendUint64(b, p)
		case string:
			b = append(b, p...)
		}
	}
	return b
}

func TestReject(t *testing.T) {
	valid := encode(t, 1, KVSet{Key: "k", Value: []byte("v")})
	withPayload := func(typ MsgType, p []byte) []byte {
		return frame(Magic, Version, uint8(typ), uint32(len(p)), p)
	}
	tests := []struct {
		name string
		in   []byte
		max  int
		want error
	}{
		{"bad magic", frame(0xBEEF, Version, uint8(TypeOK), 0, nil), 0, ErrBadMagic},
		{"bad version", frame(Magic, 2, uint8(TypeOK), 0, nil), 0, ErrVersion},
		{"type zero", frame(Magic, Version, 0, 0, nil), 0, ErrMalformed},
		{"unknown type", frame(Magic, Version, 200, 0, nil), 0, ErrMalformed},
		{"oversized length", frame(Magic, Version, uint8(TypeKVSet), MaxPayload+1, nil), 0, ErrTooLarge},
		{"max uint32 length", frame(Magic, Version, uint8(TypeKVSet), 1<<32-1, nil), 0, ErrTooLarge},
		{"over custom limit", valid, 4, ErrTooLarge},
		{"truncated header", valid[:7], 0, ErrMalformed},
		{"truncated payload", valid[:len(valid)-1], 0, ErrMalformed},
		{"trailing bytes", withPayload(TypeOK, []byte{0}), 0, ErrMalformed},
		{"trailing bytes after kvget", withPayload(TypeKVGet, payload(uint32(1), "k", uint32(5), uint8(0))), 0, ErrMalformed},
		{"string past end", withPayload(TypeAbort, payload(uint32(10), "abc")), 0, ErrMalformed},
		{"string length huge", withPayload(TypeAbort, payload(uint32(1<<32-1))), 0, ErrMalformed},
		{"short int", withPayload(TypeError, []byte{1}), 0, ErrMalformed},
		{"huge list count", withPayload(TypeHello, payload(uint32(0), uint32(0), uint32(0), uint64(0), uint32(1<<32-1))), 0, ErrMalformed},
		{"hello of 4M empty transports", withPayload(TypeHello, append(payload(uint32(0), uint32(0), uint32(0), uint64(0), uint32(4<<20)), make([]byte, 16<<20)...)), 0, ErrTooLarge},
		{"hello of 17 transports", withPayload(TypeHello, append(payload(uint32(0), uint32(0), uint32(0), uint64(0), uint32(17)), make([]byte, 17*4)...)), 0, ErrMalformed},
		{"hello transport of 65 bytes", withPayload(TypeHello, payload(uint32(0), uint32(0), uint32(0), uint64(0), uint32(1), uint32(65), strings.Repeat("t", 65))), 0, ErrMalformed},
		{"hello job key of 65 bytes", withPayload(TypeHello, payload(uint32(0), uint32(0), uint32(0), uint64(0), uint32(0),
			uint32(1), uint32(65), strings.Repeat("k", 65), uint32(0))), 0, ErrMalformed},
		{"hello of 33 job keys", withPayload(TypeHello, append(payload(uint32(0), uint32(0), uint32(0), uint64(0), uint32(0), uint32(33)), make([]byte, 33*8)...)), 0, ErrMalformed},
		{"huge event count", withPayload(TypeEvents, payload(uint64(0), uint32(1<<31), strings.Repeat("x", 45))), 0, ErrMalformed},
		{"reformed of 17 phases", withPayload(TypeReformed, append(payload(uint32(0), uint64(0), uint64(0), uint32(0), uint32(0), uint32(17)), make([]byte, 17*12)...)), 0, ErrMalformed},
		{"reformed phase name of 65 bytes", withPayload(TypeReformed, payload(uint32(0), uint64(0), uint64(0), uint32(0), uint32(0),
			uint32(1), uint32(65), strings.Repeat("p", 65), uint64(0))), 0, ErrMalformed},
		{"huge map count", withPayload(TypeWelcome, payload(uint32(0), uint64(0), uint32(0), uint32(0), uint32(1<<30))), 0, ErrMalformed},
		{"duplicate map key", withPayload(TypeWelcome, payload(uint32(0), uint64(0), uint32(0), uint32(0), uint32(2),
			uint32(1), "k", uint32(0), uint32(1), "k", uint32(0))), 0, ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ReadFrame(bytes.NewReader(tc.in), tc.max)
			if err == nil {
				_, err = Decode(f)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestReadFrameEOF(t *testing.T) {
	_, err := ReadFrame(bytes.NewReader(nil), 0)
	if !errors.Is(err, io.EOF) || errors.Is(err, ErrMalformed) {
		t.Errorf("got %v, want io.EOF", err)
	}
}

func TestEncodeTooLarge(t *testing.T) {
	err := WriteFrame(io.Discard, 1, KVSet{Key: "k", Value: make([]byte, MaxPayload)})
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("got %v, want %v", err, ErrTooLarge)
	}
}
