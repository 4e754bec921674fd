package agent

import (
	"sync"

	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// logLosses gathers the worker log files of the whole run that miss
// output because writes to them failed (a full disk), for the exit
// summary: each was reported when its first write failed, but that line
// may be far up a long log, and a file that looks complete but is not is
// worse than none.
type logLosses struct {
	mu    sync.Mutex
	files []supervisor.LogLoss
	more  int // past maxLossLines: counted, not kept
}

// maxLossLines bounds the summary: a full disk under a large group makes
// two incomplete files per worker.
const maxLossLines = 20

func (l *logLosses) add(loss supervisor.LogLoss) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.files) >= maxLossLines {
		l.more++
		return
	}
	l.files = append(l.files, loss)
}

// summarize logs the incomplete files, if any: the last lines of the run.
func (a *Agent) summarizeLogLosses() {
	l := &a.losses
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.files) == 0 {
		return
	}
	var lost int64
	for _, f := range l.files {
		lost += f.Lost
	}
	a.log.Error("incomplete worker log files: writes to them failed (what also went to the console is complete there)",
		"files", len(l.files)+l.more, "lost_bytes_listed", lost)
	for _, f := range l.files {
		a.log.Error("incomplete worker log file", "file", f.Path, "rank", f.Rank, "lost_bytes", f.Lost,
			"failed_writes", f.Failures, "first_err", f.Err)
	}
	if l.more > 0 {
		a.log.Error("more incomplete worker log files, not listed", "count", l.more)
	}
}
