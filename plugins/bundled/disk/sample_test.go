package disk

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

func TestTakeSample(t *testing.T) {
	dir := t.TempDir()
	s := takeSample(dir)
	if s.StatErr != nil || s.WriteErr != nil || s.Total == 0 || s.Avail == 0 || s.Latency <= 0 {
		t.Fatalf("a temp dir: %+v", s)
	}
	if es, _ := os.ReadDir(dir); len(es) != 0 {
		t.Fatalf("the probe left %v behind", es)
	}
	if s := takeSample(filepath.Join(dir, "missing")); !errors.Is(s.StatErr, fs.ErrNotExist) {
		t.Fatalf("a missing dir: %+v", s)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if s := takeSample(file); s.StatErr != nil || s.WriteErr == nil {
		t.Fatalf("a file, not a dir: %+v, want a write error", s)
	}
}

// A look that hangs (a dead NFS server) is a warning within the timeout,
// and the next check answers at once while it stays hung; the other
// paths are judged all along.
func TestWatcherHung(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	take := func(p string) sample {
		if p == "/nfs" {
			<-release
		}
		return sample{Total: 100, Avail: 50, Latency: time.Millisecond}
	}
	c, err := parseConfig(map[string]string{"paths": "/ckpt,/nfs", "timeout": "200ms"})
	if err != nil {
		t.Fatal(err)
	}
	w := newWatcher(c, take)
	start := time.Now()
	got := w.check(context.Background())
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("check took %s with a 200ms timeout", d)
	}
	if len(got) != 2 || got[0].Severity != detector.SeverityOK || got[1].Severity != detector.SeverityWarning ||
		!strings.Contains(got[1].Message, "the check of /nfs did not finish") {
		t.Fatalf("verdicts %+v; want /ckpt ok and /nfs hung", got)
	}
	if got = w.check(context.Background()); !strings.Contains(got[1].Message, "still hung") {
		t.Fatalf("second check: %+v", got[1])
	}
}
