package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// runDir returns the directory for this run's attempts. With a log dir
// (or --redirects/--tee, which need files, as in torchrun) it is kept;
// otherwise it only holds error files and is removed at exit.
func (a *Agent) runDir(runID string) (dir string, keep bool, err error) {
	cfg := a.cfg
	switch {
	case cfg.LogDir != "":
		if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
			return "", false, fmt.Errorf("create log dir: %w", err)
		}
		// A run id reused across launches gets a fresh directory: nothing is overwritten.
		for i := 0; ; i++ {
			dir = filepath.Join(cfg.LogDir, runID)
			if i > 0 {
				dir += "_" + strconv.Itoa(i)
			}
			err := os.Mkdir(dir, 0o755)
			if err == nil {
				return dir, true, nil
			}
			if !errors.Is(err, os.ErrExist) {
				return "", false, fmt.Errorf("create run log dir: %w", err)
			}
		}
	case cfg.KeepLogs:
		dir, err = os.MkdirTemp("", "ddp-agent-logs-"+runID+"-")
		if err != nil {
			return "", false, fmt.Errorf("create log dir: %w", err)
		}
		return dir, true, nil
	default:
		dir, err = os.MkdirTemp("", "ddp-agent-run-")
		if err != nil {
			return "", false, fmt.Errorf("create run dir: %w", err)
		}
		return dir, false, nil
	}
}

func logDirAttr(dir string, keep bool) string {
	if keep {
		return dir
	}
	return "(none)"
}

// streams is the supervisor's Spec.Streams: the configured one, or the
// console, and with a log dir every stream's file too (as --log-dir alone
// does).
func (a *Agent) streams() func(int) supervisor.Streams {
	if a.cfg.Streams != nil {
		return a.cfg.Streams
	}
	files := a.cfg.LogDir != ""
	return func(int) supervisor.Streams {
		return supervisor.Streams{ConsoleOut: true, ConsoleErr: true, FileOut: files, FileErr: files}
	}
}
