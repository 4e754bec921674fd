package shm

import (
	"bytes"
	"os"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestVec: gather and scatter move a vec's bytes in order across its
// buffers, empty ones included, from any offset.
func TestVec(t *testing.T) {
	v := vec{make([]byte, 3), nil, make([]byte, 5), {}, make([]byte, 1)}
	src := []byte("abcdefghi")
	v.scatter(0, src)
	if got := bytes.Join(v, nil); !bytes.Equal(got, src) {
		t.Fatalf("scatter: %q", got)
	}
	for off := range len(src) {
		for n := 0; off+n <= len(src); n++ {
			dst := make([]byte, n)
			v.gather(dst, off)
			if !bytes.Equal(dst, src[off:off+n]) {
				t.Errorf("gather %d bytes at %d: %q", n, off, dst)
			}
		}
	}
	v.scatter(4, []byte("XYZ"))
	if got := string(bytes.Join(v, nil)); got != "abcdXYZhi" {
		t.Errorf("scatter at 4: %q", got)
	}
	if v.size() != 9 {
		t.Errorf("size %d", v.size())
	}
}

// TestSlice: a vec's and a remote table's bytes lo to hi are the same
// bytes however the buffers are cut, with no empty pieces.
func TestSlice(t *testing.T) {
	v := vec{make([]byte, 3), nil, make([]byte, 5), {}, make([]byte, 1)}
	src := []byte("abcdefghi")
	v.scatter(0, src)
	var remote []unix.RemoteIovec
	base := uintptr(1000)
	for _, b := range v {
		if len(b) > 0 { // as table() leaves them out
			remote = append(remote, unix.RemoteIovec{Base: base, Len: len(b)})
		}
		base += uintptr(len(b)) + 100
	}
	for lo := 0; lo <= len(src); lo++ {
		for hi := lo; hi <= len(src); hi++ {
			s := v.slice(lo, hi)
			if got := string(bytes.Join(s, nil)); got != string(src[lo:hi]) {
				t.Errorf("slice(%d, %d): %q", lo, hi, got)
			}
			r := sliceRemote(remote, lo, hi)
			if len(r) != len(s) {
				t.Fatalf("slice(%d, %d): %d pieces, sliceRemote %d", lo, hi, len(s), len(r))
			}
			for i := range s {
				if len(s[i]) == 0 || r[i].Len != len(s[i]) {
					t.Errorf("slice(%d, %d): piece %d of %d bytes, remote %d", lo, hi, i, len(s[i]), r[i].Len)
				}
			}
			// Buffers start 100 bytes past the end of the one before:
			// the first three bytes at 1000, the next five at 1203, the
			// last at 1408.
			want := 1000 + uintptr(lo)
			if lo >= 3 {
				want += 200
			}
			if lo >= 8 {
				want += 200
			}
			if hi > lo && r[0].Base != want {
				t.Errorf("slice(%d, %d): first remote piece at %d", lo, hi, r[0].Base)
			}
		}
	}
}

// TestPieces: a vec and a remote table of as many bytes, cut differently
// into buffers, come in pieces of max bytes (the last shorter) that match
// byte for byte, with no empty entries.
func TestPieces(t *testing.T) {
	v := vec{make([]byte, 3), nil, make([]byte, 5), {}, make([]byte, 1)}
	src := []byte("abcdefghi")
	v.scatter(0, src)
	remote := []unix.RemoteIovec{{Base: 100, Len: 4}, {Base: 200, Len: 1}, {Base: 300, Len: 4}}
	for max := 1; max <= 10; max++ {
		ps, rs := v.pieces(max), remotePieces(remote, max)
		if want := (len(src) + max - 1) / max; len(ps) != want || len(rs) != want {
			t.Fatalf("max %d: %d and %d pieces, want %d", max, len(ps), len(rs), want)
		}
		for i := range ps {
			got := bytes.Join(ps[i], nil)
			if string(got) != string(src[i*max:min((i+1)*max, len(src))]) {
				t.Errorf("max %d: piece %d is %q", max, i, got)
			}
			n, start := 0, -1
			for _, r := range rs[i] {
				if r.Len == 0 {
					t.Errorf("max %d: piece %d has an empty remote entry", max, i)
				}
				if start < 0 {
					start = int(r.Base)
				}
				n += r.Len
			}
			// The remote bytes i*max on start where the table puts them.
			off := i * max
			want := 100 + off
			if off >= 4 {
				want = 200 + off - 4
			}
			if off >= 5 {
				want = 300 + off - 5
			}
			if n != len(got) || start != want {
				t.Errorf("max %d: remote piece %d has %d bytes from %d, want %d from %d", max, i, n, start, len(got), want)
			}
			for _, b := range ps[i] {
				if len(b) == 0 {
					t.Errorf("max %d: piece %d has an empty buffer", max, i)
				}
			}
		}
	}
}

// TestVMReadVec: a receiver's buffers cut one way fill from a root's cut
// another, more pieces on each side than one process_vm_readv takes
// (iovMax), through the table the root publishes (this process stands for
// both).
func TestVMReadVec(t *testing.T) {
	const size = 3*iovMax*7 + 5
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i * 7)
	}
	// The root: pieces of 7 bytes and an empty one.
	var root vec
	for off := 0; off < size; off += 7 {
		root = append(root, src[off:min(off+7, size)])
		if off == 70 {
			root = append(root, nil)
		}
	}
	tab := table(root)
	remote, err := readTable(os.Getpid(), uintptr(unsafe.Pointer(&tab[0])), size)
	if err != nil {
		t.Fatal(err)
	}
	if len(remote) != (size+6)/7 {
		t.Fatalf("%d remote buffers, want %d (the empty one left out)", len(remote), (size+6)/7)
	}
	// The receiver: pieces of 3 bytes, then one large one.
	dst := make([]byte, size)
	var local vec
	for off := 0; off < 3*2000; off += 3 {
		local = append(local, dst[off:off+3])
	}
	local = append(local, dst[3*2000:])
	if err := vmReadVec(os.Getpid(), local, remote); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("the receiver's bytes differ from the root's")
	}
	if _, err := readTable(os.Getpid(), uintptr(unsafe.Pointer(&tab[0])), size+1); err == nil {
		t.Error("a table of other sizes than this rank's: no error")
	}
	runtime.KeepAlive(tab)
	if err := vmReadVec(os.Getpid(), vec{make([]byte, 4)}, []unix.RemoteIovec{{Base: 8, Len: 4}}); err == nil {
		t.Error("reading an unmapped address: no error")
	}
}
