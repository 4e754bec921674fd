package wire

import (
	"bytes"
	"maps"
	"reflect"
	"slices"
	"testing"
)

// fuzzSeeds returns one valid frame of every message type and a few
// malformed ones. testdata/fuzz/FuzzDecode holds the same seeds.
func fuzzSeeds(t testing.TB) map[string][]byte {
	seeds := make(map[string][]byte)
	for _, tc := range sampleMessages() {
		seeds[tc.name] = encode(t, 1, tc.msg)
	}
	hello := encode(t, 1, Hello{Rank: 1, Transports: []string{"nccl"}})
	seeds["bad_magic"] = append([]byte{0xEF, 0xBE}, hello[2:]...)
	seeds["bad_version"] = append(append([]byte{}, hello[:2]...), append([]byte{9}, hello[3:]...)...)
	seeds["truncated"] = hello[:len(hello)-3]
	seeds["trailing"] = append(frame(Magic, Version, uint8(TypeAbort), 5, nil), 0, 0, 0, 0, 0)
	seeds["huge_count"] = frame(Magic, Version, uint8(TypeEvents), 12, payload(uint64(0), uint32(1<<32-1)))
	return seeds
}

// FuzzDecode feeds arbitrary bytes through ReadFrame and Decode; whatever
// decodes must re-encode to a frame that decodes to the same message and
// re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	seeds := fuzzSeeds(f)
	for _, name := range slices.Sorted(maps.Keys(seeds)) {
		f.Add(seeds[name])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := ReadFrame(bytes.NewReader(data), 1<<20)
		if err != nil {
			return
		}
		m, err := Decode(fr)
		if err != nil {
			return
		}
		b1 := encode(t, fr.ID, m)
		fr2, err := ReadFrame(bytes.NewReader(b1), 1<<20)
		if err != nil {
			t.Fatalf("read re-encoded %v: %v", m.Type(), err)
		}
		m2, err := Decode(fr2)
		if err != nil {
			t.Fatalf("decode re-encoded %v: %v", m.Type(), err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip: got %#v, want %#v", m2, m)
		}
		if b2 := encode(t, fr2.ID, m2); !bytes.Equal(b1, b2) {
			t.Fatalf("re-encoding: got %x, want %x", b2, b1)
		}
	})
}
