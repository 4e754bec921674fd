package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
)

// Console is where prefixed worker output goes. Each Write holds whole
// lines, so lines of different ranks never interleave mid-line.
type Console struct {
	mu  sync.Mutex
	out io.Writer
}

// NewConsole wraps w (usually os.Stdout or os.Stderr) for concurrent use.
func NewConsole(w io.Writer) *Console { return &Console{out: w} }

// Write writes p, which should hold whole lines, in one piece. Errors are
// dropped: a broken console must not stop a worker's output to its log file.
func (c *Console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = c.out.Write(p)
	return len(p), nil
}

const (
	readChunk  = 64 << 10
	maxLine    = 64 << 10 // longer lines are split, so a newline-free flood cannot grow memory
	tailLines  = 20
	tailMaxLen = 1 << 10
)

// stream copies one worker pipe to its sinks until EOF or close: the console
// with a "[rankN]:" prefix per line, a log file verbatim, and a ring of the
// last lines (for the failure report). It never blocks the agent's own
// goroutines: only the goroutine running copy waits on a slow console.
type stream struct {
	// prefix is set at the start, and again when a warm spare takes a
	// rank (setPrefix), while copy reads it.
	prefix   atomic.Pointer[[]byte]
	console  *Console // nil: not shown
	file     *logFile // nil: not logged
	keepTail bool     // remember the last lines (stderr only: nothing reads stdout's)
	// dup, when set, gets the lines that hold one of filters (the
	// attempt's filtered_std*.log, opened for appending by every rank).
	dup     *os.File
	filters [][]byte

	mu   sync.Mutex
	tail [][]byte
	next int
}

func newStream(prefix []byte, keepTail bool) *stream {
	s := &stream{keepTail: keepTail}
	s.prefix.Store(&prefix)
	return s
}

func (s *stream) setPrefix(prefix []byte) { s.prefix.Store(&prefix) }

func (s *stream) copy(r io.Reader) {
	buf := make([]byte, readChunk)
	var partial []byte
	var out bytes.Buffer
	for {
		n, err := r.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if s.file != nil {
				s.file.write(chunk) // a full disk costs the log (reported), not the run nor the console
			}
			out.Reset()
			for len(chunk) > 0 {
				i := bytes.IndexByte(chunk, '\n')
				if i < 0 {
					partial = append(partial, chunk...)
					if len(partial) >= maxLine {
						s.line(&out, partial)
						partial = partial[:0]
					}
					break
				}
				line := chunk[:i]
				if len(partial) > 0 {
					line = append(partial, line...)
					partial = partial[:0]
				}
				s.line(&out, line)
				chunk = chunk[i+1:]
			}
			if s.console != nil && out.Len() > 0 {
				s.console.Write(out.Bytes())
			}
		}
		if err != nil {
			if len(partial) > 0 {
				out.Reset()
				s.line(&out, partial)
				if s.console != nil {
					s.console.Write(out.Bytes())
				}
			}
			if s.file != nil {
				s.file.close()
			}
			if s.dup != nil {
				s.dup.Close()
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) {
				s.remember([]byte("[ddp-agent: reading worker output: " + err.Error() + "]"))
			}
			return
		}
	}
}

func (s *stream) line(out *bytes.Buffer, line []byte) {
	prefix := *s.prefix.Load()
	if bytes.HasPrefix(line, prefix) {
		// torch 2.x's excepthook puts "[rank0]: " before each line of a
		// worker's traceback, which the default prefix would double.
		prefix = nil
	}
	if s.keepTail {
		s.remember(line)
	}
	if s.dup != nil && holdsAny(line, s.filters) {
		// One write per line on a file opened for appending: the ranks'
		// lines do not interleave.
		if _, err := s.dup.Write(slices.Concat(prefix, line, []byte{'\n'})); err != nil {
			s.remember([]byte("[ddp-agent: writing " + s.dup.Name() + ": " + err.Error() + "; no more lines go there]"))
			s.dup.Close()
			s.dup = nil
		}
	}
	if s.console != nil {
		out.Write(prefix)
		out.Write(line)
		out.WriteByte('\n')
	}
}

func (s *stream) remember(line []byte) {
	if len(line) > tailMaxLen {
		line = line[:tailMaxLen]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.tail) < tailLines {
		s.tail = append(s.tail, bytes.Clone(line))
		return
	}
	s.tail[s.next] = append(s.tail[s.next][:0], line...)
	s.next = (s.next + 1) % tailLines
}

// lastLines returns up to tailLines most recent lines, oldest first.
func (s *stream) lastLines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.tail))
	for i := range s.tail {
		out = append(out, string(s.tail[(s.next+i)%len(s.tail)]))
	}
	return out
}

// holdsAny reports whether line holds one of filters.
func holdsAny(line []byte, filters [][]byte) bool {
	for _, f := range filters {
		if bytes.Contains(line, f) {
			return true
		}
	}
	return false
}

// openDup opens dir/name for appending when there are filters (nil
// otherwise).
func openDup(dir, name string, filters []string) (*os.File, error) {
	if len(filters) == 0 {
		return nil, nil
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("filtered log file: %w", err)
	}
	return f, nil
}

func bytesOf(ss []string) [][]byte {
	var b [][]byte
	for _, s := range ss {
		b = append(b, []byte(s))
	}
	return b
}
