package wire

import "encoding/binary"

// CollectiveEvent is one rank's record of one collective operation, as the
// shim reports it; times are unix nanoseconds, 0 for none.
type CollectiveEvent struct {
	Step    uint64
	Bucket  uint32
	Bytes   uint64
	DType   uint8
	Status  uint8 // the shim's status code (DDPSHIM_OK 0, DDPSHIM_ERR_*), or StatusInFlight
	TArrive int64
	TStart  int64
	TEnd    int64
}

// StatusInFlight is the Status of a record of a collective that the rank has
// entered and not finished (TEnd 0): the shim sends one when a collective
// has been in flight for a while, so that the agent sees who arrived at a
// collective that hangs. It is outside the C ABI's status codes.
const StatusInFlight = 255

// StatusMark is the Status of a record that is no collective but a step
// mark: the rank started the forward pass of Step at TArrive (the hook's
// forward pre-hook), which splits a straggler's lateness into input and
// compute. Bucket is the kind of mark (MarkForward); the other fields are
// zero. It is outside the C ABI's status codes, and a record like any
// other on the wire, so the relay carries it unchanged.
const StatusMark = 254

// The kinds of step marks, in Bucket of a StatusMark record.
const MarkForward = 0

// Failed reports whether ev is the final record of a collective that
// returned an error.
func (ev CollectiveEvent) Failed() bool {
	return ev.Status != 0 && ev.Status != StatusInFlight && ev.Status != StatusMark
}

// RankedEvent is a CollectiveEvent with the generation and the rank it
// belongs to: the record the telemetry relay forwards from a follower's
// agent to the leader's.
type RankedEvent struct {
	Gen  uint64
	Rank uint32
	CollectiveEvent
}

// The two formats lay the same fields out in different orders, and a
// format on the wire cannot change; so one codec writes and reads both from
// a table of their fields. The Events message packs a CollectiveEvent into
// EventSize bytes; the relay's record is 8-byte aligned, with the
// generation first, the rank after the bucket, and six bytes of padding
// after the status:
//
//	event:  step u64 | bucket u32 | bytes u64 | dtype u8 | status u8 | arrive i64 | start i64 | end i64
//	ranked: gen u64 | step u64 | bucket u32 | rank u32 | bytes u64 | dtype u8 | status u8 | pad [6] | arrive i64 | start i64 | end i64
const (
	EventSize  = 46
	RankedSize = 64
)

// field is one field of the record on the wire.
type field uint8

const (
	fieldGen field = iota
	fieldStep
	fieldBucket
	fieldRank
	fieldBytes
	fieldDType
	fieldStatus
	fieldPad6 // zeros written, ignored when read
	fieldArrive
	fieldStart
	fieldEnd
)

// fieldSize is each field's size in bytes, by field.
var fieldSize = [...]int{8, 8, 4, 4, 8, 1, 1, 6, 8, 8, 8}

// The layouts; read-only.
var (
	eventLayout  = []field{fieldStep, fieldBucket, fieldBytes, fieldDType, fieldStatus, fieldArrive, fieldStart, fieldEnd}
	rankedLayout = []field{fieldGen, fieldStep, fieldBucket, fieldRank, fieldBytes, fieldDType, fieldStatus, fieldPad6,
		fieldArrive, fieldStart, fieldEnd}
)

// AppendEvent appends ev in the Events message's layout (EventSize bytes).
func AppendEvent(b []byte, ev CollectiveEvent) []byte {
	return appendRecord(b, eventLayout, RankedEvent{CollectiveEvent: ev})
}

// DecodeEvent reads a CollectiveEvent from the first EventSize bytes of b;
// the caller has checked the length.
func DecodeEvent(b []byte) CollectiveEvent {
	return decodeRecord(b, eventLayout).CollectiveEvent
}

// AppendRanked appends r in the relay's layout (RankedSize bytes).
func AppendRanked(b []byte, r RankedEvent) []byte {
	return appendRecord(b, rankedLayout, r)
}

// DecodeRanked reads a RankedEvent from the first RankedSize bytes of b; the
// caller has checked the length.
func DecodeRanked(b []byte) RankedEvent {
	return decodeRecord(b, rankedLayout)
}

// appendRecord appends r's fields in the order of layout, little-endian.
func appendRecord(b []byte, layout []field, r RankedEvent) []byte {
	le := binary.LittleEndian
	for _, f := range layout {
		switch f {
		case fieldGen:
			b = le.AppendUint64(b, r.Gen)
		case fieldStep:
			b = le.AppendUint64(b, r.Step)
		case fieldBucket:
			b = le.AppendUint32(b, r.Bucket)
		case fieldRank:
			b = le.AppendUint32(b, r.Rank)
		case fieldBytes:
			b = le.AppendUint64(b, r.Bytes)
		case fieldDType:
			b = append(b, r.DType)
		case fieldStatus:
			b = append(b, r.Status)
		case fieldPad6:
			b = append(b, 0, 0, 0, 0, 0, 0)
		case fieldArrive:
			b = le.AppendUint64(b, uint64(r.TArrive))
		case fieldStart:
			b = le.AppendUint64(b, uint64(r.TStart))
		case fieldEnd:
			b = le.AppendUint64(b, uint64(r.TEnd))
		}
	}
	return b
}

// decodeRecord reads the fields of layout from the start of b.
func decodeRecord(b []byte, layout []field) RankedEvent {
	le := binary.LittleEndian
	var r RankedEvent
	for _, f := range layout {
		switch f {
		case fieldGen:
			r.Gen = le.Uint64(b)
		case fieldStep:
			r.Step = le.Uint64(b)
		case fieldBucket:
			r.Bucket = le.Uint32(b)
		case fieldRank:
			r.Rank = le.Uint32(b)
		case fieldBytes:
			r.Bytes = le.Uint64(b)
		case fieldDType:
			r.DType = b[0]
		case fieldStatus:
			r.Status = b[0]
		case fieldArrive:
			r.TArrive = int64(le.Uint64(b))
		case fieldStart:
			r.TStart = int64(le.Uint64(b))
		case fieldEnd:
			r.TEnd = int64(le.Uint64(b))
		}
		b = b[fieldSize[f]:]
	}
	return r
}
