package disk

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// probeSize is what the write probe writes: one page, the smallest write
// that goes through the file system's allocation and journal as a
// checkpoint's does.
const probeSize = 4096

// sample is one look at a path.
type sample struct {
	StatErr      error  // statfs failed (missing: errors.Is(err, fs.ErrNotExist)); the rest is unknown
	Total, Avail uint64 // bytes; Avail is what a writer other than root may use, as df shows
	Files, Ffree uint64 // inodes; Files 0: the file system does not count them (btrfs)
	WriteErr     error  // the write probe failed
	Latency      time.Duration
}

// takeSample looks at path: statfs, then a write and fsync of a small
// temporary file in it, removed after.
func takeSample(path string) sample {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return sample{StatErr: &os.PathError{Op: "statfs", Path: path, Err: err}}
	}
	unit := uint64(st.Frsize) // the unit of the block counts; Bsize is the preferred I/O size
	if unit == 0 {
		unit = uint64(st.Bsize)
	}
	s := sample{Total: st.Blocks * unit, Avail: st.Bavail * unit, Files: st.Files, Ffree: st.Ffree}
	s.Latency, s.WriteErr = writeProbe(path)
	return s
}

// writeProbe writes probeSize bytes to a new file in dir, fsyncs and
// closes it, and says how long that took; the file is removed either way.
func writeProbe(dir string) (time.Duration, error) {
	start := time.Now()
	f, err := os.CreateTemp(dir, ".ddp-agent-disk-probe-*")
	if err != nil {
		return 0, fmt.Errorf("create a file: %w", err)
	}
	_, werr := f.Write(make([]byte, probeSize))
	serr := f.Sync()
	cerr := f.Close()
	took := time.Since(start)
	rerr := os.Remove(f.Name())
	if err := errors.Join(werr, serr, cerr); err != nil {
		return took, fmt.Errorf("write %d bytes and fsync: %w", probeSize, err)
	}
	if rerr != nil {
		return took, fmt.Errorf("remove the probe file: %w", rerr)
	}
	return took, nil
}
