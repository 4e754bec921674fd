// Package wire is the byte format shared by libddpshim.so and ddp-agent, so
// that each is written once: the control socket's frames and messages (the
// agent's server is agent/control, the worker's client shim/agentconn),
// and the collective record, which the control protocol's Events message and
// the telemetry relay's records batch (agent/telemetry/relay) both carry.
// It does no I/O of its own beyond ReadFrame and WriteFrame.
//
// Every frame is a 12-byte little-endian header followed by a payload:
//
//	magic uint16 (0xDA7A) | version uint8 (1) | type uint8 | id uint32 | length uint32
//
// Requests carry a non-zero id that the reply echoes; unsolicited frames
// (Events, Reformed, Abort) use id 0. Payload fields are fixed-size little-endian
// integers, strings and byte slices are a uint32 length followed by the bytes,
// lists are a uint32 count followed by the items. A payload must be consumed
// exactly; anything malformed is rejected with an error, never a panic.
package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Wire constants.
const (
	Magic      uint16 = 0xDA7A
	Version    uint8  = 1
	HeaderSize        = 12
	MaxPayload        = 16 << 20 // default and hard limit for a frame payload
)

// DefaultWriteTimeout bounds a write of either end that has no deadline of
// its own: the agent's writes to a worker, a worker's requests.
const DefaultWriteTimeout = 5 * time.Second

// Sentinel errors of the codec, usable with errors.Is.
var (
	ErrBadMagic  = errors.New("control: bad frame magic")
	ErrVersion   = errors.New("control: unsupported protocol version")
	ErrTooLarge  = errors.New("control: frame payload too large")
	ErrMalformed = errors.New("control: malformed frame")
)

// MsgType is the type byte of a frame header.
type MsgType uint8

// Message types.
const (
	TypeHello MsgType = iota + 1
	TypeWelcome
	TypeKVSet
	TypeKVGet
	TypeKVValue
	TypeOK
	TypeEvents
	TypeAbort
	TypeError
	TypeReformed
)

func (t MsgType) String() string {
	names := [...]string{"", "Hello", "Welcome", "KVSet", "KVGet", "KVValue", "OK", "Events", "Abort", "Error", "Reformed"}
	if t.valid() {
		return names[t]
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

func (t MsgType) valid() bool { return t >= TypeHello && t <= TypeReformed }

// Frame is one undecoded frame as read from the wire.
type Frame struct {
	Type    MsgType
	ID      uint32
	Payload []byte
}

// ReadFrame reads one frame from r. It blocks until a whole frame has been
// read or r fails. maxPayload <= 0 means MaxPayload. The header is validated
// before anything is allocated, and the payload buffer only grows with the
// bytes actually received. A clean end of stream before the first header byte
// returns an error wrapping io.EOF; a truncated frame wraps ErrMalformed.
func ReadFrame(r io.Reader, maxPayload int) (Frame, error) {
	if maxPayload <= 0 {
		maxPayload = MaxPayload
	}
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Frame{}, fmt.Errorf("read frame header: %w: %w", ErrMalformed, err)
		}
		return Frame{}, fmt.Errorf("read frame header: %w", err)
	}
	if m := binary.LittleEndian.Uint16(h[0:]); m != Magic {
		return Frame{}, fmt.Errorf("read frame header: %w: got %#04x", ErrBadMagic, m)
	}
	if h[2] != Version {
		return Frame{}, fmt.Errorf("read frame header: %w: got %d, want %d", ErrVersion, h[2], Version)
	}
	f := Frame{Type: MsgType(h[3]), ID: binary.LittleEndian.Uint32(h[4:])}
	if !f.Type.valid() {
		return Frame{}, fmt.Errorf("read frame header: %w: unknown message type %d", ErrMalformed, h[3])
	}
	n := binary.LittleEndian.Uint32(h[8:])
	if uint64(n) > uint64(maxPayload) {
		return Frame{}, fmt.Errorf("read %v frame: %w: %d bytes, limit %d", f.Type, ErrTooLarge, n, maxPayload)
	}
	if n == 0 {
		return f, nil
	}
	var buf bytes.Buffer
	buf.Grow(int(min(n, 64<<10)))
	if _, err := io.CopyN(&buf, r, int64(n)); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: %w", ErrMalformed, io.ErrUnexpectedEOF)
		}
		return Frame{}, fmt.Errorf("read %v frame payload: %w", f.Type, err)
	}
	f.Payload = buf.Bytes()
	return f, nil
}

// WriteFrame encodes m as one frame with the given id and writes it to w in a
// single Write call. It blocks as long as w.Write does; callers sharing w
// must serialize calls.
func WriteFrame(w io.Writer, id uint32, m Message) error {
	b, err := AppendFrame(nil, id, m)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write %v frame: %w", m.Type(), err)
	}
	return nil
}

// AppendFrame appends the encoded frame for m to dst, for a caller that
// writes it itself (under its own deadline and lock).
func AppendFrame(dst []byte, id uint32, m Message) ([]byte, error) {
	start := len(dst)
	e := encoder{b: append(dst, make([]byte, HeaderSize)...)}
	m.encode(&e)
	n := len(e.b) - start - HeaderSize
	if n > MaxPayload {
		return dst, fmt.Errorf("encode %v frame: %w: %d bytes, limit %d", m.Type(), ErrTooLarge, n, MaxPayload)
	}
	h := e.b[start:]
	binary.LittleEndian.PutUint16(h[0:], Magic)
	h[2] = Version
	h[3] = byte(m.Type())
	binary.LittleEndian.PutUint32(h[4:], id)
	binary.LittleEndian.PutUint32(h[8:], uint32(n))
	return e.b, nil
}

// Decode decodes the payload of f into the Message for f.Type. It returns an
// error wrapping ErrMalformed for an unknown type, a payload that ends early
// or one with trailing bytes. Byte slices in the result alias f.Payload.
func Decode(f Frame) (Message, error) {
	d := &decoder{b: f.Payload}
	var m Message
	switch f.Type {
	case TypeHello:
		m = decodeHello(d)
	case TypeWelcome:
		m = decodeWelcome(d)
	case TypeKVSet:
		m = KVSet{Key: d.str(), Value: d.bytes()}
	case TypeKVGet:
		m = KVGet{Key: d.str(), TimeoutMillis: d.u32()}
	case TypeKVValue:
		m = KVValue{Value: d.bytes()}
	case TypeOK:
		m = OK{}
	case TypeEvents:
		m = decodeEvents(d)
	case TypeAbort:
		m = Abort{Reason: d.str()}
	case TypeError:
		m = Error{Code: ErrorCode(d.u16()), Message: d.str()}
	case TypeReformed:
		m = decodeReformed(d)
	default:
		return nil, fmt.Errorf("decode frame: %w: unknown message type %d", ErrMalformed, uint8(f.Type))
	}
	if d.err == nil && len(d.b) > 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	if d.err != nil {
		return nil, fmt.Errorf("decode %v: %w", f.Type, d.err)
	}
	return m, nil
}
