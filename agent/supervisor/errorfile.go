package supervisor

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"
)

// ErrorFile is what a worker wrote to TORCHELASTIC_ERROR_FILE, typically
// through torch.distributed.elastic's @record decorator.
type ErrorFile struct {
	Message   string    // e.g. "RuntimeError: CUDA out of memory"
	Traceback string    // the Python call stack, when recorded
	Time      time.Time // zero when not recorded
}

// errorFileLimit bounds what is read: the file is the worker's to write.
const errorFileLimit = 1 << 20

// readErrorFile parses both layouts torchelastic writes: a structured
// {"message": {"message", "extraInfo": {"py_callstack", "timestamp"}}} from
// Python, and {"message": "..."} from elsewhere.
func readErrorFile(path string) (*ErrorFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var raw struct {
		Message json.RawMessage `json:"message"`
	}
	dec := json.NewDecoder(io.LimitReader(f, errorFileLimit))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("parse error file %s: %w", path, err)
	}
	var s string
	if json.Unmarshal(raw.Message, &s) == nil {
		return &ErrorFile{Message: s}, nil
	}
	var structured struct {
		Message   string `json:"message"`
		ExtraInfo struct {
			PyCallstack string `json:"py_callstack"`
			Timestamp   string `json:"timestamp"`
		} `json:"extraInfo"`
	}
	if err := json.Unmarshal(raw.Message, &structured); err != nil {
		return nil, fmt.Errorf("parse error file %s: %w", path, err)
	}
	ef := &ErrorFile{Message: structured.Message, Traceback: structured.ExtraInfo.PyCallstack}
	if ts, err := strconv.ParseInt(structured.ExtraInfo.Timestamp, 10, 64); err == nil {
		ef.Time = time.Unix(ts, 0)
	}
	return ef, nil
}

// Raising reports whether a worker still running has written its
// TORCHELASTIC_ERROR_FILE: it raised, and its exit follows. torch's
// @record writes the file as the exception leaves the script's main (and
// ddp_agent's spare, which runs the script, where @record did not),
// before the interpreter unwinds (its atexit handlers, torch's teardown),
// which under load takes seconds.
func (g *Group) Raising() bool {
	return slices.ContainsFunc(g.alive(), func(w *worker) bool { return !w.raised().IsZero() })
}

// raised is when the worker wrote its error file; zero while it has not.
func (w *worker) raised() time.Time {
	if fi, err := os.Stat(w.errorFile); err == nil && fi.Size() > 0 {
		return fi.ModTime()
	}
	return time.Time{}
}
