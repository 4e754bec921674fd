package disk

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

func TestJudge(t *testing.T) {
	c := config{maxLatency: 2 * time.Second}
	c.minFree, _ = parseBar("5%", true)
	c.minInodes, _ = parseBar("1%", false)
	absolute := c
	absolute.minFree, _ = parseBar("1GiB", true)
	ok := sample{Total: 100 << 30, Avail: 40 << 30, Files: 1e6, Ffree: 5e5, Latency: 3 * time.Millisecond}
	with := func(change func(*sample)) sample { s := ok; change(&s); return s }
	for _, tc := range []struct {
		name string
		s    sample
		err  error
		c    config
		sev  detector.Severity
		msg  string
	}{
		{"healthy", ok, nil, c, detector.SeverityOK, "/ckpt: 40.0 GiB free (40.0%), write and fsync in 3ms, 500000 inodes free (50.0%)"},
		{"low space", with(func(s *sample) { s.Avail = 4 << 30 }), nil, c, detector.SeverityWarning,
			"checkpoints to /ckpt may fail: 4.0 GiB free (4.0% of 100.0 GiB; min-free 5%)"},
		{"just enough", with(func(s *sample) { s.Avail = 5 << 30 }), nil, c, detector.SeverityOK, "/ckpt: 5.0 GiB free"},
		{"low space by size", with(func(s *sample) { s.Avail = 512 << 20 }), nil, absolute, detector.SeverityWarning, "512.0 MiB free (0.5% of 100.0 GiB; min-free 1GiB)"},
		{"low inodes", with(func(s *sample) { s.Ffree = 9999 }), nil, c, detector.SeverityWarning,
			"checkpoints to /ckpt may fail: 9999 inodes free (1.0% of 1000000; min-inodes 1%)"},
		{"no inode count (btrfs)", with(func(s *sample) { s.Files, s.Ffree = 0, 0 }), nil, c, detector.SeverityOK, "write and fsync in 3ms"},
		{"slow", with(func(s *sample) { s.Latency = 2500 * time.Millisecond }), nil, c, detector.SeverityWarning,
			"a 4096-byte write and fsync to /ckpt took 2.5s (max-write-latency 2s)"},
		{"all three, all said", sample{Total: 100, Avail: 1, Files: 100, Ffree: 0, Latency: time.Minute}, nil, c, detector.SeverityWarning,
			"1 B free (1.0% of 100 B; min-free 5%); checkpoints to /ckpt may fail: 0 inodes free (0.0% of 100; min-inodes 1%); a 4096-byte"},
		{"missing", sample{StatErr: &fs.PathError{Op: "statfs", Path: "/ckpt", Err: syscall.ENOENT}}, nil, c, detector.SeverityError,
			"/ckpt is missing: checkpoints to it will fail"},
		{"stat fails", sample{StatErr: &fs.PathError{Op: "statfs", Path: "/ckpt", Err: syscall.EIO}}, nil, c, detector.SeverityError,
			"cannot check /ckpt: statfs /ckpt: input/output error"},
		{"read-only", with(func(s *sample) { s.WriteErr = &os.PathError{Op: "open", Path: "/ckpt/x", Err: syscall.EROFS} }), nil, c, detector.SeverityError,
			"/ckpt is not writable: open /ckpt/x: read-only file system"},
		{"hung", sample{}, errors.New("hung: no answer within 10s"), c, detector.SeverityWarning,
			"the check of /ckpt did not finish (a hung file system?): hung: no answer within 10s"},
	} {
		f := judge("/ckpt", tc.s, tc.err, tc.c)
		wantAct := detector.ActionWarn
		if tc.sev == detector.SeverityOK {
			wantAct = detector.ActionNone
		}
		if f.Subject != "/ckpt" || f.Severity != tc.sev || f.Action != wantAct || !strings.Contains(f.Message, tc.msg) {
			t.Errorf("%s: got %s/%s %q; want %s/%s containing %q", tc.name, f.Severity, f.Action, f.Message, tc.sev, wantAct, tc.msg)
		}
	}
}
