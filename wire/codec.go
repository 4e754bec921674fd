package wire

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
)

// The payload primitives: fixed-size little-endian integers, length-prefixed
// strings and byte slices, counted lists. Message codecs are written with
// them; the decoder's error is sticky, so a codec reads every field and
// checks once.

// encoder appends payload primitives to b.
type encoder struct{ b []byte }

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.LittleEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *encoder) i32(v int32)  { e.u32(uint32(v)) }
func (e *encoder) i64(v int64)  { e.u64(uint64(v)) }

func (e *encoder) bytes(p []byte) {
	e.u32(uint32(len(p)))
	e.b = append(e.b, p...)
}

func (e *encoder) str(s string) {
	e.u32(uint32(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) strs(ss []string) {
	e.u32(uint32(len(ss)))
	for _, s := range ss {
		e.str(s)
	}
}

// strMap encodes m with sorted keys so that the encoding is deterministic.
func (e *encoder) strMap(m map[string]string) {
	e.u32(uint32(len(m)))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		e.str(k)
		e.str(m[k])
	}
}

// decoder consumes payload primitives from b. After the first error every
// method returns a zero value and err keeps that first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, what)
	}
}

func (d *decoder) take(n uint64, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail(fmt.Sprintf("%s of %d bytes past end of payload (%d left)", what, n, len(d.b)))
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

// fixed returns the next n <= 8 bytes, or zeros after an error.
func (d *decoder) fixed(n int, what string) []byte {
	if p := d.take(uint64(n), what); p != nil {
		return p
	}
	return make([]byte, n)
}

func (d *decoder) u8() uint8   { return d.fixed(1, "uint8")[0] }
func (d *decoder) u16() uint16 { return binary.LittleEndian.Uint16(d.fixed(2, "uint16")) }
func (d *decoder) u32() uint32 { return binary.LittleEndian.Uint32(d.fixed(4, "uint32")) }
func (d *decoder) u64() uint64 { return binary.LittleEndian.Uint64(d.fixed(8, "uint64")) }
func (d *decoder) i32() int32  { return int32(d.u32()) }
func (d *decoder) i64() int64  { return int64(d.u64()) }

// bytes returns a length-prefixed byte slice aliasing the payload; empty is nil.
func (d *decoder) bytes() []byte {
	p := d.take(uint64(d.u32()), "bytes")
	if len(p) == 0 {
		return nil
	}
	return p
}

func (d *decoder) str() string { return string(d.take(uint64(d.u32()), "string")) }

// count reads a list count and checks that count items of at least minSize
// bytes each fit in the rest of the payload, so callers can allocate safely.
func (d *decoder) count(minSize int) int {
	n := d.u32()
	if d.err == nil && uint64(n)*uint64(minSize) > uint64(len(d.b)) {
		d.fail(fmt.Sprintf("list count %d exceeds payload (%d bytes left)", n, len(d.b)))
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

func (d *decoder) strs() []string {
	n := d.count(4)
	if n == 0 {
		return nil
	}
	ss := make([]string, 0, n)
	for range n {
		ss = append(ss, d.str())
	}
	return ss
}

func (d *decoder) strMap() map[string]string {
	n := d.count(8)
	if n == 0 {
		return nil
	}
	m := make(map[string]string, n)
	for range n {
		k, v := d.str(), d.str()
		if _, dup := m[k]; dup {
			d.fail(fmt.Sprintf("duplicate map key %q", k))
		}
		m[k] = v
	}
	return m
}

// strsMax is strs for a list of at most maxN strings of at most maxLen
// bytes each; what is named in the error.
func (d *decoder) strsMax(what string, maxN, maxLen int) []string {
	if !d.countAtMost(what, maxN) {
		return nil
	}
	ss := d.strs()
	for _, s := range ss {
		if len(s) > maxLen {
			d.fail(fmt.Sprintf("%s: an entry of %d bytes, limit %d", what, len(s), maxLen))
			return nil
		}
	}
	return ss
}

// strMapMax is strMap for a map of at most maxN entries, keys of at most
// maxKey bytes and values of at most maxValue.
func (d *decoder) strMapMax(what string, maxN, maxKey, maxValue int) map[string]string {
	if !d.countAtMost(what, maxN) {
		return nil
	}
	m := d.strMap()
	for k, v := range m {
		if len(k) > maxKey || len(v) > maxValue {
			d.fail(fmt.Sprintf("%s: key of %d bytes with a value of %d, limits %d and %d", what, len(k), len(v), maxKey, maxValue))
			return nil
		}
	}
	return m
}

// countAtMost peeks at the next list count and fails unless it is at most
// max, before anything is allocated for the list.
func (d *decoder) countAtMost(what string, max int) bool {
	if d.err != nil || len(d.b) < 4 {
		return d.err == nil // too short: the read that follows fails
	}
	if n := binary.LittleEndian.Uint32(d.b); n > uint32(max) {
		d.fail(fmt.Sprintf("%s: %d entries, limit %d", what, n, max))
		return false
	}
	return true
}
