package export

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// traceFile writes the Chrome trace event format (a JSON array of events,
// which ui.perfetto.dev and chrome://tracing open) to
// <dir>/trace-gen<N>.json, one file per generation. Events are collected in
// a buffer and written with one write per batch, so a killed agent leaves
// whole events behind: the format allows the closing bracket to be
// missing. Not safe for concurrent use.
type traceFile struct {
	dir     string
	job     string
	log     *slog.Logger
	started bool   // a file was opened (or tried)
	gen     uint64 // of the current file
	f       *os.File
	buf     bytes.Buffer
	n       int            // events in the file
	pids    map[string]int // host → pid
	ranks   map[int]bool   // ranks with a thread_name
	err     error          // the first error; the generation's file is given up
}

// Process ids: the job's own track, then one process per host.
const (
	jobPID   = 1
	firstPID = 2
)

// event is one trace event.
type event struct {
	Name  string         `json:"name"`
	Cat   string         `json:"cat,omitempty"`
	Ph    string         `json:"ph"`
	TS    json.Number    `json:"ts,omitempty"`
	Dur   json.Number    `json:"dur,omitempty"`
	PID   int            `json:"pid"`
	TID   int            `json:"tid"`
	Scope string         `json:"s,omitempty"`
	Args  map[string]any `json:"args,omitempty"`
}

// micros is t as the format's microseconds since the Unix epoch, written
// exactly (a float64 would round to a quarter microsecond).
func micros(t time.Time) json.Number {
	ns := t.UnixNano()
	return json.Number(strconv.FormatInt(ns/1000, 10) + "." + fmt.Sprintf("%03d", ns%1000))
}

func dur(d time.Duration) json.Number {
	d = max(d, 0)
	return json.Number(strconv.FormatInt(int64(d/time.Microsecond), 10) + "." + fmt.Sprintf("%03d", int64(d%time.Microsecond)))
}

func newTraceFile(dir, job string, log *slog.Logger) (*traceFile, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("trace dir: %w", err)
	}
	return &traceFile{dir: dir, job: job, log: log}, nil
}

// path is the file of generation gen.
func (tf *traceFile) path(gen uint64) string {
	return filepath.Join(tf.dir, fmt.Sprintf("trace-gen%d.json", gen))
}

// use makes gen's file the current one: a later generation closes the
// current file and starts its own; events of an earlier one go on in the
// current file.
func (tf *traceFile) use(gen uint64) {
	if tf.started && gen <= tf.gen {
		return
	}
	tf.close()
	tf.started, tf.gen, tf.err = true, gen, nil
	f, err := os.OpenFile(tf.path(gen), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		tf.fail(err)
		return
	}
	tf.f, tf.n = f, 0
	tf.pids, tf.ranks = map[string]int{}, map[int]bool{}
	tf.add(event{Name: "process_name", Ph: "M", PID: jobPID, Args: map[string]any{"name": fmt.Sprintf("job %s generation %d", tf.job, gen)}})
	tf.add(event{Name: "process_sort_index", Ph: "M", PID: jobPID, Args: map[string]any{"sort_index": 0}})
	tf.add(event{Name: "thread_name", Ph: "M", PID: jobPID, TID: 0, Args: map[string]any{"name": "steps"}})
}

// thread returns the pid and tid of rank, adding the metadata events that
// name its host and itself the first time.
func (tf *traceFile) thread(rank int, host, gpu string) (pid, tid int) {
	pid, ok := tf.pids[host]
	if !ok {
		pid = firstPID + len(tf.pids)
		tf.pids[host] = pid
		name := host
		if name == "" {
			name = "unknown host"
		}
		tf.add(event{Name: "process_name", Ph: "M", PID: pid, Args: map[string]any{"name": name}})
		tf.add(event{Name: "process_sort_index", Ph: "M", PID: pid, Args: map[string]any{"sort_index": pid}})
	}
	if !tf.ranks[rank] {
		tf.ranks[rank] = true
		name := fmt.Sprintf("rank %d", rank)
		if gpu != "" {
			name += " (GPU " + gpu + ")"
		}
		tf.add(event{Name: "thread_name", Ph: "M", PID: pid, TID: rank, Args: map[string]any{"name": name}})
		tf.add(event{Name: "thread_sort_index", Ph: "M", PID: pid, TID: rank, Args: map[string]any{"sort_index": rank}})
	}
	return pid, rank
}

// add buffers ev; flush writes the buffer.
func (tf *traceFile) add(ev event) {
	if tf.f == nil {
		return
	}
	b, err := json.Marshal(ev)
	if err != nil {
		tf.fail(err)
		return
	}
	if tf.n == 0 {
		tf.buf.WriteString("[\n")
	} else {
		tf.buf.WriteString(",\n")
	}
	tf.buf.Write(b)
	tf.n++
}

// flush writes the buffered events with one write.
func (tf *traceFile) flush() error {
	if tf.f == nil || tf.buf.Len() == 0 {
		return tf.err
	}
	_, err := tf.f.Write(tf.buf.Bytes())
	tf.buf.Reset()
	if err != nil {
		tf.fail(err)
	}
	return tf.err
}

// fail gives up the current generation's file after err, logging it once.
func (tf *traceFile) fail(err error) {
	if tf.err == nil {
		tf.err = err
		tf.log.Warn("perfetto trace file: giving up this generation's file", "path", tf.path(tf.gen), "err", err)
	}
	if tf.f != nil {
		tf.f.Close()
		tf.f = nil
	}
	tf.buf.Reset()
}

// close ends the current file with the closing bracket and closes it.
func (tf *traceFile) close() error {
	if tf.f == nil {
		return tf.err
	}
	if tf.n == 0 {
		tf.buf.WriteString("[")
	}
	tf.buf.WriteString("\n]\n")
	if err := tf.flush(); err != nil {
		return err
	}
	err := tf.f.Close()
	tf.f = nil
	if err != nil {
		tf.fail(err)
	}
	return err
}
