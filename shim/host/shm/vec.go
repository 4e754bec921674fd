package shm

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// vec is a broadcast's buffers, taken as one run of bytes in order: the
// tensors of a model's state go in one collective, each straight from and
// into its own memory, rather than one collective each (a round of the
// ranks' handshakes apiece) or through a packed copy.
type vec [][]byte

// size is the bytes of all the buffers.
func (v vec) size() int {
	n := 0
	for _, b := range v {
		n += len(b)
	}
	return n
}

// gather copies v's bytes from offset off on into dst, len(dst) of them.
func (v vec) gather(dst []byte, off int) {
	for _, b := range v {
		if len(dst) == 0 {
			return
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		n := copy(dst, b[off:])
		dst, off = dst[n:], 0
	}
}

// scatter copies src into v's bytes from offset off on.
func (v vec) scatter(off int, src []byte) {
	for _, b := range v {
		if len(src) == 0 {
			return
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		n := copy(b[off:], src)
		src, off = src[n:], 0
	}
}

// slice is v's bytes lo to hi, as the pieces of v's buffers they fall in.
func (v vec) slice(lo, hi int) vec {
	var out vec
	for _, b := range v {
		if from, to := max(lo, 0), min(hi, len(b)); from < to {
			out = append(out, b[from:to])
		}
		lo, hi = lo-len(b), hi-len(b)
	}
	return out
}

// sliceRemote is remote's bytes lo to hi, as vec.slice cuts a vec.
func sliceRemote(remote []unix.RemoteIovec, lo, hi int) []unix.RemoteIovec {
	var out []unix.RemoteIovec
	for _, r := range remote {
		if from, to := max(lo, 0), min(hi, r.Len); from < to {
			out = append(out, unix.RemoteIovec{Base: r.Base + uintptr(from), Len: to - from})
		}
		lo, hi = lo-r.Len, hi-r.Len
	}
	return out
}

// pieces cuts v into runs of max bytes (the last may be shorter), in
// order, in one pass: remotePieces cuts a remote table of as many bytes at
// the same offsets.
func (v vec) pieces(max int) []vec {
	var out []vec
	var cur vec
	room := max
	for _, b := range v {
		for len(b) > 0 {
			n := min(len(b), room)
			cur, b, room = append(cur, b[:n]), b[n:], room-n
			if room == 0 {
				out, cur, room = append(out, cur), nil, max
			}
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// remotePieces is vec.pieces for a remote table.
func remotePieces(remote []unix.RemoteIovec, max int) [][]unix.RemoteIovec {
	var out [][]unix.RemoteIovec
	var cur []unix.RemoteIovec
	room := max
	for _, r := range remote {
		for r.Len > 0 {
			n := min(r.Len, room)
			cur = append(cur, unix.RemoteIovec{Base: r.Base, Len: n})
			r, room = unix.RemoteIovec{Base: r.Base + uintptr(n), Len: r.Len - n}, room-n
			if room == 0 {
				out, cur, room = append(out, cur), nil, max
			}
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// table is what a broadcast's root publishes the address of: how many
// buffers, then each one's address and length.
func table(v vec) []uint64 {
	t := make([]uint64, 1, 1+2*len(v))
	for _, b := range v {
		if len(b) > 0 {
			t = append(t, uint64(addrOf(b)), uint64(len(b)))
		}
	}
	t[0] = uint64(len(t)-1) / 2
	return t
}

// maxEntries bounds a table a peer reads: far more buffers than a model has
// tensors, far fewer than a corrupt count could ask it to allocate.
const maxEntries = 1 << 20

// readTable reads the table at addr in process pid (a peer's, in the
// broadcast's protocol) and checks that its buffers hold size bytes in all,
// as this rank's do.
func readTable(pid int, addr uintptr, size int) ([]unix.RemoteIovec, error) {
	var n uint64
	if err := vmRead(pid, unsafe.Slice((*byte)(unsafe.Pointer(&n)), 8), addr); err != nil {
		return nil, err
	}
	if n > maxEntries {
		return nil, fmt.Errorf("the peer's table has %d buffers, more than %d", n, maxEntries)
	}
	t := make([]uint64, 2*n)
	if n > 0 {
		if err := vmRead(pid, unsafe.Slice((*byte)(unsafe.Pointer(&t[0])), 16*n), addr+8); err != nil {
			return nil, err
		}
	}
	remote := make([]unix.RemoteIovec, n)
	total := 0
	for i := range remote {
		remote[i] = unix.RemoteIovec{Base: uintptr(t[2*i]), Len: int(t[2*i+1])}
		total += remote[i].Len
	}
	if total != size {
		return nil, fmt.Errorf("the peer's buffers hold %d bytes, this rank's %d", total, size)
	}
	return remote, nil
}

// iovMax is the most iovecs a process_vm_readv or _writev takes on either
// side (IOV_MAX).
const iovMax = 1024

// vmReadVec fills local, in order, from the remote buffers of process pid,
// in order.
func vmReadVec(pid int, local vec, remote []unix.RemoteIovec) error {
	return vmCopyVec(unix.ProcessVMReadv, "process_vm_readv", pid, local, remote)
}

// vmWriteVec writes local, in order, into the remote buffers of process
// pid, in order.
func vmWriteVec(pid int, local vec, remote []unix.RemoteIovec) error {
	return vmCopyVec(unix.ProcessVMWritev, "process_vm_writev", pid, local, remote)
}

// vmCopyVec runs process_vm_readv or _writev between local and remote until
// all is copied: the two sides may be cut differently, and the kernel may
// copy less than asked (a call stops at a page it cannot reach), so each
// call goes on from where the last ended, on both sides.
func vmCopyVec(call func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error), name string,
	pid int, local vec, remote []unix.RemoteIovec) error {
	li, lo := 0, 0 // local buffer and offset in it
	ri, ro := 0, 0 // remote buffer and offset in it
	for {
		for li < len(local) && lo == len(local[li]) {
			li, lo = li+1, 0
		}
		for ri < len(remote) && ro == remote[ri].Len {
			ri, ro = ri+1, 0
		}
		if li == len(local) || ri == len(remote) {
			return nil
		}
		liov := make([]unix.Iovec, 0, min(iovMax, len(local)-li))
		for i := li; i < len(local) && len(liov) < iovMax; i++ {
			b := local[i]
			if i == li {
				b = b[lo:]
			}
			if len(b) == 0 {
				continue
			}
			v := unix.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			liov = append(liov, v)
		}
		riov := make([]unix.RemoteIovec, 0, min(iovMax, len(remote)-ri))
		for i := ri; i < len(remote) && len(riov) < iovMax; i++ {
			r := remote[i]
			if i == ri {
				r = unix.RemoteIovec{Base: r.Base + uintptr(ro), Len: r.Len - ro}
			}
			riov = append(riov, r)
		}
		n, err := call(pid, liov, riov, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if n == 0 {
			return fmt.Errorf("%s: no progress", name)
		}
		for m := n; m > 0; {
			k := min(m, len(local[li])-lo)
			lo, m = lo+k, m-k
			for m > 0 && lo == len(local[li]) {
				li, lo = li+1, 0
			}
		}
		for m := n; m > 0; {
			k := min(m, remote[ri].Len-ro)
			ro, m = ro+k, m-k
			for m > 0 && ro == remote[ri].Len {
				ri, ro = ri+1, 0
			}
		}
	}
}
