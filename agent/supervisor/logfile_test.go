package supervisor

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

// fullDisk takes room bytes, then fails every write with ENOSPC until
// freed.
type fullDisk struct {
	bytes.Buffer
	room   int
	closed bool
}

func (d *fullDisk) Write(p []byte) (int, error) {
	if len(p) <= d.room {
		d.room -= len(p)
		return d.Buffer.Write(p)
	}
	n := d.room
	d.Buffer.Write(p[:n])
	d.room = 0
	return n, &os.PathError{Op: "write", Path: "stdout.log", Err: syscall.ENOSPC}
}

func (d *fullDisk) Close() error { d.closed = true; return nil }

// TestLogFileLoss: the first failed write is logged at once with the file,
// the error and the bytes lost; later ones only counted; the loss is
// handed on when the file closes; a write that works again after a gap
// first marks the gap in the file.
func TestLogFileLoss(t *testing.T) {
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	disk := &fullDisk{room: 10}
	var losses []LogLoss
	l := newLogFile(disk, "/logs/0/stdout.log", 3, log, func(ll LogLoss) { losses = append(losses, ll) })

	l.write([]byte("0123456789abcdef")) // 6 bytes lost
	if got := logs.String(); !strings.Contains(got, "worker log file write failed") || !strings.Contains(got, "file=/logs/0/stdout.log") ||
		!strings.Contains(got, "no space left on device") || !strings.Contains(got, "lost_bytes=6") || !strings.Contains(got, "rank=3") {
		t.Fatalf("the first failure was not reported at once with file, error and bytes lost:\n%s", got)
	}
	for i := 0; i < 5; i++ {
		l.write([]byte("xxxx")) // counted, not logged: 20 bytes
	}
	if n := strings.Count(logs.String(), "write failed"); n != 1 {
		t.Errorf("%d failure lines, want 1 per file:\n%s", n, logs.String())
	}
	disk.room = 1 << 10 // space again
	l.write([]byte("back\n"))
	l.close()
	if !disk.closed {
		t.Error("the file was not closed")
	}
	if want := "0123456789\n[ddp-agent: 26 bytes of output lost here: write stdout.log: no space left on device]\nback\n"; disk.String() != want {
		t.Errorf("file holds %q, want %q", disk.String(), want)
	}
	if len(losses) != 1 || losses[0].Lost != 26 || losses[0].Failures != 6 || losses[0].Rank != 3 ||
		losses[0].Path != "/logs/0/stdout.log" || !errors.Is(losses[0].Err, syscall.ENOSPC) {
		t.Errorf("losses handed on: %+v, want one of 26 bytes in 6 writes", losses)
	}
	if !strings.Contains(logs.String(), "worker log file incomplete") || !strings.Contains(logs.String(), "lost_bytes=26") {
		t.Errorf("no count at close:\n%s", logs.String())
	}
}

// TestLogFileNoLoss: a file that took everything reports nothing.
func TestLogFileNoLoss(t *testing.T) {
	var logs syncbuf.Buffer
	called := false
	l := newLogFile(&fullDisk{room: 100}, "x", 0, slog.New(slog.NewTextHandler(&logs, nil)), func(LogLoss) { called = true })
	l.write([]byte("fits"))
	l.close()
	if called || logs.String() != "" {
		t.Errorf("a complete file was reported: called %v, logs %q", called, logs.String())
	}
}

// TestStreamFileLossKeepsConsole: a worker whose log file fails still has
// every line on the console, and the group hands the loss on.
func TestStreamFileLossKeepsConsole(t *testing.T) {
	disk := &fullDisk{room: 100}
	var losses []LogLoss
	var console syncbuf.Buffer
	s := newStream([]byte("[rank0]:"), false)
	s.console = NewConsole(&console)
	s.file = newLogFile(disk, "stdout.log", 0, quiet(), func(l LogLoss) { losses = append(losses, l) })
	in := strings.Repeat(strings.Repeat("z", 99)+"\n", 50)
	s.copy(strings.NewReader(in))
	if got := strings.Count(console.String(), "[rank0]:"); got != 50 {
		t.Errorf("console has %d lines, want 50", got)
	}
	if len(losses) != 1 || losses[0].Lost != int64(len(in)-100) {
		t.Errorf("losses %+v, want %d bytes", losses, len(in)-100)
	}
}

// TestGroupLogLossOnFullFilesystem: a worker writing more than a tiny
// tmpfs holds; the loss reaches Spec.OnLogLoss and the console has it all.
func TestGroupLogLossOnFullFilesystem(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("cannot mount a 64 KiB tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	spec, out, _ := testSpec(t, "lines:300", 2, Streams{ConsoleOut: true, ConsoleErr: true, FileOut: true, FileErr: true})
	spec.AttemptDir = filepath.Join(dir, "attempt_0")
	lossCh := make(chan LogLoss, 4)
	spec.OnLogLoss = func(l LogLoss) { lossCh <- l }
	g := New(spec, quiet())
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	g.Stop(syscall.SIGTERM, time.Second)
	close(lossCh)
	var total int64
	files := map[string]bool{}
	for l := range lossCh {
		files[filepath.Base(filepath.Dir(l.Path))+"/"+filepath.Base(l.Path)] = true
		total += l.Lost
		if !errors.Is(l.Err, syscall.ENOSPC) {
			t.Errorf("%s: first error %v, want ENOSPC", l.Path, l.Err)
		}
	}
	// 2 × 300 KB of output for 64 KiB: both stdout logs lose most of it.
	if !files["0/stdout.log"] || !files["1/stdout.log"] || total < 2*300_000-64<<10 {
		t.Errorf("losses %v totalling %d bytes", files, total)
	}
	if got := strings.Count(out.String(), "\n"); got != 2*300 {
		t.Errorf("console has %d lines, want %d", got, 2*300)
	}
}
