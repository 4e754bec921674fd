package wire

import (
	"encoding/binary"
	"testing"
)

// TestRecordLayouts: both formats are the bytes the hand-written codecs
// wrote before they shared one (an Events message's event is packed; the
// relay's record aligned, with the generation and rank), and read back the
// same.
func TestRecordLayouts(t *testing.T) {
	le := binary.LittleEndian
	ev := CollectiveEvent{Step: 1, Bucket: 2, Bytes: 3, DType: 4, Status: StatusInFlight, TArrive: -5, TStart: 6, TEnd: 7}
	var want []byte
	want = le.AppendUint64(want, 1)
	want = le.AppendUint32(want, 2)
	want = le.AppendUint64(want, 3)
	want = append(want, 4, StatusInFlight)
	want = le.AppendUint64(want, uint64(ev.TArrive))
	want = le.AppendUint64(want, 6)
	want = le.AppendUint64(want, 7)
	if got := AppendEvent(nil, ev); string(got) != string(want) || len(got) != EventSize {
		t.Errorf("event: got %x, want %x (%d bytes)", got, want, EventSize)
	}
	if got := DecodeEvent(want); got != ev {
		t.Errorf("decode event: got %+v, want %+v", got, ev)
	}

	r := RankedEvent{Gen: 9, Rank: 10, CollectiveEvent: ev}
	want = le.AppendUint64(nil, 9)
	want = le.AppendUint64(want, 1)
	want = le.AppendUint32(want, 2)
	want = le.AppendUint32(want, 10)
	want = le.AppendUint64(want, 3)
	want = append(want, 4, StatusInFlight, 0, 0, 0, 0, 0, 0)
	want = le.AppendUint64(want, uint64(ev.TArrive))
	want = le.AppendUint64(want, 6)
	want = le.AppendUint64(want, 7)
	if got := AppendRanked(nil, r); string(got) != string(want) || len(got) != RankedSize {
		t.Errorf("ranked: got %x, want %x (%d bytes)", got, want, RankedSize)
	}
	if got := DecodeRanked(want); got != r {
		t.Errorf("decode ranked: got %+v, want %+v", got, r)
	}
}
