// Package tempdir makes the agent's temporary directories, each of which
// lives as long as the process that made it, and removes those whose
// process is gone.
//
// A directory holds a lock file that its process keeps locked (flock,
// exclusive) for its whole life; the kernel releases the lock when the
// process dies, however it dies. A SIGKILLed agent leaves its directories
// behind (an embedded store's data, tens to hundreds of MiB; the job's
// TLS key; the run's error files; the control socket): its guard removes
// them at once (agent/guard), and the next agent that starts a store on
// the host removes what is left.
package tempdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// The kinds of directory, by name prefix.
const (
	// Etcd: an embedded store's data dir; also the job's TLS files
	// (ddp-agent-etcd-tls-), which the same pattern finds.
	Etcd = "ddp-agent-etcd-"
	// Run: a run's error files and attempt dirs, when its logs are not kept.
	Run = "ddp-agent-run-"
	// Control: the control socket's dir.
	Control = "ddp-agent-ctl-"
)

// Kinds is every kind, for a sweep.
func Kinds() []string { return []string{Etcd, Run, Control} }

const (
	ownerLock = "owner.lock"
	// unlockedGrace: an etcd dir without its lock file is one an agent
	// from before the locks left, or one another agent is creating right
	// now (MkdirTemp, then the lock); only older ones are stale. Other
	// kinds are stale only by their lock: one without its lock file may
	// be a live agent's from before the locks.
	unlockedGrace = time.Minute
)

// Dir is a temporary directory locked by this process.
type Dir struct {
	Path string
	lock *os.File
}

// Make creates a fresh private directory named prefix+random under parent
// ("" is the system's temp dir) and locks it.
func Make(parent, prefix string) (*Dir, error) {
	path, err := os.MkdirTemp(parent, prefix+"*")
	if err != nil {
		return nil, err
	}
	lock, err := Lock(path)
	if err != nil {
		os.RemoveAll(path)
		return nil, err
	}
	return &Dir{Path: path, lock: lock}, nil
}

// Remove removes the directory and releases its lock; nil-safe.
func (d *Dir) Remove() error {
	if d == nil {
		return nil
	}
	err := os.RemoveAll(d.Path)
	d.lock.Close()
	return err
}

// Lock creates dir's lock file and locks it; the returned file holds the
// lock until it is closed or the process ends (it is close-on-exec: no
// child inherits it).
func Lock(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ownerLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return f, nil
}

// RemoveStale removes the directories of the given kinds under parent
// whose process is gone, and returns them, with an error naming those it
// could not remove. A dir that cannot be judged is left alone: it may be
// another user's (the temp dir is shared).
func RemoveStale(parent string, kinds []string, now time.Time) ([]string, error) {
	var removed []string
	var errs []error
	for _, kind := range kinds {
		dirs, _ := filepath.Glob(filepath.Join(parent, kind+"*"))
		for _, dir := range dirs {
			if stale, err := stale(dir, now, kind == Etcd); err != nil || !stale {
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, dir)
		}
	}
	return removed, errors.Join(errs...)
}

// Stale reports whether dir's process is gone: its lock can be taken.
func Stale(dir string) (bool, error) { return stale(dir, time.Time{}, false) }

// stale reports whether dir's process is gone: its lock can be taken, or,
// with lockless, it has no lock file and is older than unlockedGrace. The
// lock taken is released at once: removing the dir does not need it.
func stale(dir string, now time.Time, lockless bool) (bool, error) {
	st, err := os.Lstat(dir)
	if err != nil || !st.IsDir() {
		return false, err
	}
	f, err := os.OpenFile(filepath.Join(dir, ownerLock), os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return lockless && now.Sub(st.ModTime()) > unlockedGrace, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil // its process is alive
		}
		return false, err
	}
	return true, nil
}
