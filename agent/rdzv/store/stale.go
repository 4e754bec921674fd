package store

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// An agent's temporary etcd data dir lives as long as the agent: Close
// removes it, and a SIGKILL leaves it behind (a store that served a job
// leaves tens to hundreds of MiB). So the dir holds a lock file that its
// agent holds locked (flock, exclusive) for its whole life; the kernel
// releases the lock when the process dies, however it dies. An agent
// starting a store removes every such dir whose lock it can take.
const (
	tempDirPattern = "ddp-agent-etcd-*"
	ownerLock      = "owner.lock"
	// unlockedGrace: a dir without its lock file may be one another agent
	// is creating right now (MkdirTemp, then the lock); only older ones
	// are stale.
	unlockedGrace = time.Minute
)

// lockDir creates dir's lock file and locks it; the returned file holds
// the lock until it is closed or the process ends.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ownerLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("etcd data dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("etcd data dir lock %s: %w", f.Name(), err)
	}
	return f, nil
}

// removeStale removes the temporary etcd data dirs under parent whose
// agent is gone, and returns them. A dir that cannot be judged or removed
// is left alone (it may be another user's: the temp dir is shared).
func removeStale(parent string, now time.Time, log *slog.Logger) []string {
	dirs, _ := filepath.Glob(filepath.Join(parent, tempDirPattern))
	var removed []string
	for _, dir := range dirs {
		if stale, err := staleDir(dir, now); err != nil || !stale {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("remove the etcd data dir of an agent that is gone", "dir", dir, "err", err)
			continue
		}
		removed = append(removed, dir)
	}
	if len(removed) > 0 {
		log.Info("removed etcd data dirs of agents that are gone", "dirs", removed)
	}
	return removed
}

// staleDir reports whether dir's agent is gone: its lock can be taken,
// or it has no lock file and is older than unlockedGrace. The lock taken
// is released at once: removing the dir does not need it.
func staleDir(dir string, now time.Time) (bool, error) {
	st, err := os.Lstat(dir)
	if err != nil || !st.IsDir() {
		return false, err
	}
	f, err := os.OpenFile(filepath.Join(dir, ownerLock), os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return now.Sub(st.ModTime()) > unlockedGrace, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil // its agent is alive
		}
		return false, err
	}
	return true, nil
}
