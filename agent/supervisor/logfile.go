package supervisor

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
)

// LogLoss is a worker log file (stdout.log, stderr.log) that misses
// output: writes to it failed (a full disk, an I/O error).
type LogLoss struct {
	Path     string
	Rank     int
	Lost     int64 // bytes of the worker's output not in the file
	Failures int   // writes that failed
	Err      error // the first failure
}

func (l LogLoss) String() string {
	return fmt.Sprintf("%s: %d bytes lost in %d failed writes (first: %v)", l.Path, l.Lost, l.Failures, l.Err)
}

// logFile is one worker log file. A write that fails costs the file, never
// the run nor the console copy, but it is never silent: the first failure
// is logged at once with the file, the error and the bytes lost; later
// ones are counted; when the stream ends the loss goes to onLoss (the
// run's exit summary). Writing goes on after a failure, since the disk may
// get space again: the first write that works then marks the gap in the
// file itself.
type logFile struct {
	w      io.WriteCloser
	path   string
	rank   int
	log    *slog.Logger
	onLoss func(LogLoss) // nil: the loss is only logged

	mu     sync.Mutex
	loss   LogLoss
	inGap  bool  // the last write failed
	gapLen int64 // bytes lost since the last write that worked
}

func newLogFile(w io.WriteCloser, path string, rank int, log *slog.Logger, onLoss func(LogLoss)) *logFile {
	return &logFile{w: w, path: path, rank: rank, log: log, onLoss: onLoss, loss: LogLoss{Path: path, Rank: rank}}
}

// write writes p, or counts what of it was lost.
func (l *logFile) write(p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inGap {
		if _, err := fmt.Fprintf(l.w, "\n[ddp-agent: %d bytes of output lost here: %v]\n", l.gapLen, l.loss.Err); err != nil {
			l.failed(int64(len(p)), err) // no output after a gap that is not marked
			return
		}
		l.inGap, l.gapLen = false, 0
	}
	if n, err := l.w.Write(p); err != nil {
		l.failed(int64(len(p)-n), err)
	}
}

// failed counts a failed write; the file's first is logged at once.
func (l *logFile) failed(lost int64, err error) {
	l.loss.Lost += lost
	l.loss.Failures++
	l.inGap = true
	l.gapLen += lost
	if l.loss.Err != nil {
		return
	}
	l.loss.Err = err
	l.log.Error("worker log file write failed: the file is incomplete; later failures are only counted",
		"rank", l.rank, "file", l.path, "err", err, "lost_bytes", l.loss.Lost)
}

// close closes the file and hands on its loss, if it had one.
func (l *logFile) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.w.Close(); err != nil {
		l.failed(0, fmt.Errorf("close: %w", err))
	}
	if l.loss.Failures == 0 {
		return
	}
	l.log.Warn("worker log file incomplete", "rank", l.rank, "file", l.path, "lost_bytes", l.loss.Lost,
		"failed_writes", l.loss.Failures, "first_err", l.loss.Err)
	if l.onLoss != nil {
		l.onLoss(l.loss)
	}
}
