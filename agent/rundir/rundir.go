// Package rundir is a run's directory on disk: where its attempts' worker
// logs, error files and Perfetto traces go, kept or removed at exit, and
// the worker log files that miss output because writes to them failed.
package rundir

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/internal/tempdir"
)

// Dir is a run's directory.
type Dir struct {
	Path string
	Keep bool // the logs are the user's to keep: never removed
	tmp  *tempdir.Dir
}

// Remove removes a directory that is not kept.
func (d *Dir) Remove() error { return d.tmp.Remove() }

// Make returns the directory for run runID's attempts. With a log dir it
// is LogDir/<run id> (a fresh one when the id was used before) and kept;
// with keepLogs (--redirects or --tee, which need files, as in torchrun)
// it is a kept temporary directory; otherwise it only holds error files
// and Remove removes it at exit (or the agent's guard, if the agent dies:
// internal/tempdir).
func Make(logDir string, keepLogs bool, runID string) (*Dir, error) {
	switch {
	case logDir != "":
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			return nil, fmt.Errorf("create log dir: %w", err)
		}
		// A run id reused across launches gets a fresh directory: nothing is overwritten.
		for i := 0; ; i++ {
			dir := filepath.Join(logDir, runID)
			if i > 0 {
				dir += "_" + strconv.Itoa(i)
			}
			err := os.Mkdir(dir, 0o755)
			if err == nil {
				return &Dir{Path: dir, Keep: true}, nil
			}
			if !errors.Is(err, os.ErrExist) {
				return nil, fmt.Errorf("create run log dir: %w", err)
			}
		}
	case keepLogs:
		dir, err := os.MkdirTemp("", "ddp-agent-logs-"+runID+"-")
		if err != nil {
			return nil, fmt.Errorf("create log dir: %w", err)
		}
		return &Dir{Path: dir, Keep: true}, nil
	default:
		tmp, err := tempdir.Make("", tempdir.Run)
		if err != nil {
			return nil, fmt.Errorf("create run dir: %w", err)
		}
		return &Dir{Path: tmp.Path, tmp: tmp}, nil
	}
}

// LogAttr is the run directory for the log: itself when kept, else
// "(none)".
func LogAttr(dir string, keep bool) string {
	if keep {
		return dir
	}
	return "(none)"
}

// Losses gathers the worker log files of the whole run that miss output
// because writes to them failed (a full disk), for the exit summary: each
// was reported when its first write failed, but that line may be far up a
// long log, and a file that looks complete but is not is worse than none.
// The zero value is ready; safe for concurrent use.
type Losses struct {
	mu    sync.Mutex
	files []supervisor.LogLoss
	more  int // past maxLossLines: counted, not kept
}

// maxLossLines bounds the summary: a full disk under a large group makes
// two incomplete files per worker.
const maxLossLines = 20

// Add is the supervisor's Spec.OnLogLoss.
func (l *Losses) Add(loss supervisor.LogLoss) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.files) >= maxLossLines {
		l.more++
		return
	}
	l.files = append(l.files, loss)
}

// Summarize logs the incomplete files, if any: the last lines of the run.
func (l *Losses) Summarize(log *slog.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.files) == 0 {
		return
	}
	var lost int64
	for _, f := range l.files {
		lost += f.Lost
	}
	log.Error("incomplete worker log files: writes to them failed (what also went to the console is complete there)",
		"files", len(l.files)+l.more, "lost_bytes_listed", lost)
	for _, f := range l.files {
		log.Error("incomplete worker log file", "file", f.Path, "rank", f.Rank, "lost_bytes", f.Lost,
			"failed_writes", f.Failures, "first_err", f.Err)
	}
	if l.more > 0 {
		log.Error("more incomplete worker log files, not listed", "count", l.more)
	}
}
