package store

import (
	"os"
	"testing"

	"github.com/ddp-agent/ddp-agent/internal/tempdir"
)

// TestStartLocksItsDir: a store's own temp dir is locked while it runs,
// so another agent's sweep keeps it, and gone after Close.
func TestStartLocksItsDir(t *testing.T) {
	srv := startServer(t, ServerConfig{})
	dir := srv.tempDir.Path
	if stale, err := tempdir.Stale(dir); err != nil || stale {
		t.Errorf("a running store's dir judged stale (%v, %v)", stale, err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after Close (%v)", dir, err)
	}
}
