package sidecar

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// SocketEnv overrides the sidecar's socket path, for the sidecar and for
// the hook alike.
const SocketEnv = envname.Socket

// DefaultSocket is the node's sidecar socket for user uid: under
// $XDG_RUNTIME_DIR (a per-user tmpfs, 0700, where systemd makes one),
// else under /tmp in a directory named after the uid. The Python package
// computes the same path (ddp_agent/_sidecar.py).
func DefaultSocket(uid int, getenv func(string) string) string {
	if p := getenv(SocketEnv); p != "" {
		return p
	}
	if d := getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "ddp-agent", "sidecar.sock")
	}
	return filepath.Join(os.TempDir(), "ddp-agent-sidecar-"+strconv.Itoa(uid), "sidecar.sock")
}

// checkDir refuses a socket directory that is not the user's alone: the
// socket is the sidecar's whole admission boundary, and control.ListenSidecar
// would make an existing directory 0700 (a home directory, say). A
// missing directory is made 0700.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sidecar socket directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("sidecar socket directory %s is not a directory", dir)
	case ok && int(st.Uid) != os.Getuid():
		return fmt.Errorf("sidecar socket directory %s belongs to uid %d, not to this user (%d): give the socket a directory of its own (--socket)", dir, st.Uid, os.Getuid())
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("sidecar socket directory %s has mode %o: it must be this user's alone (0700); give the socket a directory of its own (--socket)", dir, fi.Mode().Perm())
	}
	return nil
}

// clearStale removes a socket file no sidecar answers on (the last one
// was killed), and refuses when one does: two sidecars for one user on a
// node would split its jobs' ranks.
func clearStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("another sidecar is serving %s", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("check %s: %w", path, err)
	}
	return os.Remove(path)
}
