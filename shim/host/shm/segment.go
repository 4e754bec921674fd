package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Segment layout. Every field is little-endian and naturally aligned; the
// words that ranks poll sit on lines of their own (line bytes apart, two
// cache lines, so the adjacent-line prefetcher does not couple them).
//
//	0            global header: magic, version, world, segment bytes, depth, file size
//	line         abort word: 0, or 1+rank of the first rank that aborted
//	ctlOff+r*ctlStride   control block of rank r:
//	   +0        collective header: seq, dtype, op, closed, count (u64),
//	             the buffer's address (u64); then, set once: pid, the
//	             single-copy verdict, the probe word's address (u64); then
//	             the single copy's gate and writing words (gate.go)
//	   +line     in: steps whose inputs rank r has published
//	   +2*line   red: steps whose owned segment rank r has reduced and published
//	   +3*line   done: steps whose results rank r has copied out
//	   +4*line   waiters: goroutines sleeping in FUTEX_WAIT on r's counters
//	dataOff+r*slotBytes  slot of rank r: depth entries of world segments of
//	             segBytes; in entry e, segment j != r holds r's input for the
//	             owner j, segment r holds the result of r's own chunk.
const (
	magic   uint64 = 0x31_4d_48_53_50_44_44 // "DDPSHM1"
	version uint32 = 3

	line      = 128
	ctlOff    = 2 * line
	ctlStride = 5 * line
	pageSize  = 4096

	// depth is the number of ring entries in a slot: a rank may run up to
	// depth-1 steps ahead of the slowest reader of its slot.
	depth = 4

	// maxWorld bounds the header so a corrupt file cannot ask for a huge one.
	maxWorld = 4096
)

// Header field offsets.
const (
	offMagic   = 0
	offVersion = 8
	offWorld   = 12
	offSeg     = 16
	offDepth   = 24
	offSize    = 32
	offDirect  = 40 // Config.DirectMin of the segment (rank 0's)
	offAbort   = line

	// Within a control block.
	offSeq     = 0
	offDType   = 4
	offOp      = 8
	offClosed  = 12
	offCount   = 16
	offAddr    = 24
	offPid     = 32
	offCMA     = 36
	offProbe   = 40
	offGate    = 48
	offWriting = 52
	offIn      = line
	offRed     = 2 * line
	offDone    = 3 * line
	offWaiters = 4 * line
)

// geometry is the derived shape of a segment.
type geometry struct {
	world    int
	segBytes int // bytes of one segment: the unit a step moves per chunk
	slot     int // bytes of one rank's slot: depth*world*segBytes
	dataOff  int
	size     int // bytes of the file
}

func newGeometry(world, segBytes int) geometry {
	g := geometry{world: world, segBytes: segBytes, slot: depth * world * segBytes}
	g.dataOff = alignUp(ctlOff+world*ctlStride, pageSize)
	g.size = g.dataOff + world*g.slot
	return g
}

// geometryFor derives the segment size from a per-rank slot budget.
func geometryFor(world, slotBytes int) (geometry, error) {
	if world < 1 || world > maxWorld {
		return geometry{}, fmt.Errorf("world size %d out of range [1, %d]", world, maxWorld)
	}
	seg := (slotBytes / (depth * world)) &^ 63
	if seg < 64 {
		return geometry{}, fmt.Errorf("slot of %d bytes too small for %d ranks: need at least %d", slotBytes, world, depth*world*64)
	}
	return newGeometry(world, seg), nil
}

func alignUp(n, a int) int { return (n + a - 1) / a * a }

// rankCtl points at one rank's control block in the mapping.
type rankCtl struct {
	seq, dtype, op, closed *uint32
	count, addr            *uint64
	pid, cma               *uint32
	probe                  *uint64
	gate, writing          *uint32
	in, red, done, waiters *uint32
}

func u32(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
func u64(mem []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }

// create makes the file at path (O_EXCL, mode 0600), sizes it and writes the
// header; the magic number goes last, so a rank that opens the file early
// sees a bad header rather than a half-written one.
func create(path string, geo geometry, directMin int64) (mem []byte, err error) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "create", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	defer func() {
		if err != nil {
			syscall.Unlink(path)
		}
	}()
	if err := syscall.Ftruncate(fd, int64(geo.size)); err != nil {
		return nil, &os.PathError{Op: "truncate", Path: path, Err: err}
	}
	mem, err = syscall.Mmap(fd, 0, geo.size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	atomic.StoreUint32(u32(mem, offVersion), version)
	atomic.StoreUint32(u32(mem, offWorld), uint32(geo.world))
	atomic.StoreUint64(u64(mem, offSeg), uint64(geo.segBytes))
	atomic.StoreUint32(u32(mem, offDepth), depth)
	atomic.StoreUint64(u64(mem, offSize), uint64(geo.size))
	atomic.StoreUint64(u64(mem, offDirect), uint64(directMin))
	atomic.StoreUint64(u64(mem, offMagic), magic)
	return mem, nil
}

// errBadSegment marks a file that is not a segment of this version.
var errBadSegment = errors.New("not a shared-memory segment of this version")

// open maps an existing file after checking its header against world.
func open(path string, world int) ([]byte, geometry, error) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, geometry{}, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, geometry{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, geometry{}, fmt.Errorf("%s: not a regular file: %w", path, errBadSegment)
	}
	if st.Uid != uint32(os.Geteuid()) {
		return nil, geometry{}, fmt.Errorf("%s: owned by uid %d, not by this user", path, st.Uid)
	}
	var hdr [ctlOff]byte
	if n, err := syscall.Pread(fd, hdr[:], 0); err != nil {
		return nil, geometry{}, &os.PathError{Op: "read", Path: path, Err: err}
	} else if n < len(hdr) {
		return nil, geometry{}, fmt.Errorf("%s: %d bytes: %w", path, st.Size, errBadSegment)
	}
	le := binary.LittleEndian
	if le.Uint64(hdr[offMagic:]) != magic || le.Uint32(hdr[offVersion:]) != version {
		return nil, geometry{}, fmt.Errorf("%s: bad magic or version: %w", path, errBadSegment)
	}
	if w := le.Uint32(hdr[offWorld:]); w != uint32(world) {
		return nil, geometry{}, fmt.Errorf("%s: made for %d ranks, not %d", path, w, world)
	}
	seg, d := le.Uint64(hdr[offSeg:]), le.Uint32(hdr[offDepth:])
	if seg < 64 || seg%64 != 0 || seg > 1<<30 || d != depth || world < 1 || world > maxWorld {
		return nil, geometry{}, fmt.Errorf("%s: segment %d bytes, depth %d: %w", path, seg, d, errBadSegment)
	}
	geo := newGeometry(world, int(seg))
	if size := le.Uint64(hdr[offSize:]); size != uint64(geo.size) || st.Size != int64(geo.size) {
		return nil, geometry{}, fmt.Errorf("%s: %d bytes (header says %d), want %d: %w", path, st.Size, size, geo.size, errBadSegment)
	}
	mem, err := syscall.Mmap(fd, 0, geo.size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, geometry{}, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	return mem, geo, nil
}
