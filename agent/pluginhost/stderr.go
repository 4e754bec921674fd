package pluginhost

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"golang.org/x/time/rate"
)

// stderrTail keeps the last lines a plugin wrote to stderr (go-plugin
// hands over each line), so that the line saying why a plugin failed
// names its last words: a panic, "crashing on purpose".
//
// It takes the stderr at stderrRate bytes a second at most, by making
// the writer wait: go-plugin's copy of the stream then waits, and the
// plugin's writes with it. A plugin writing its stderr as fast as it
// could took 60 % of a core of the agent, on a node that trains.
type stderrTail struct {
	mu    sync.Mutex
	lines []string
	pace  *rate.Limiter
}

const (
	tailLines   = 3
	tailLineMax = 300
	stderrRate  = 64 << 10
)

func newStderrTail() *stderrTail {
	return &stderrTail{pace: rate.NewLimiter(stderrRate, stderrRate)}
}

// Write takes what the plugin wrote, a line or several (its os.Stderr
// comes over go-plugin's stdio stream in chunks).
func (t *stderrTail) Write(p []byte) (int, error) {
	for rest := len(p); rest > 0; rest -= stderrRate {
		_ = t.pace.WaitN(context.Background(), min(rest, stderrRate)) // fails only for n > burst
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, raw := range strings.Split(string(p), "\n") {
		line := plainLine(strings.TrimSpace(raw))
		if line == "" {
			continue
		}
		if len(line) > tailLineMax {
			line = line[:tailLineMax] + "..."
		}
		t.lines = append(t.lines, line)
	}
	if len(t.lines) > tailLines {
		t.lines = t.lines[len(t.lines)-tailLines:]
	}
	return len(p), nil
}

// plainLine is what a stderr line says: the message of the SDK's JSON
// log lines at info or above (their debug lines are go-plugin's chatter),
// any other line as it is.
func plainLine(line string) string {
	if !strings.HasPrefix(line, "{") {
		return line
	}
	var entry struct {
		Level   string `json:"@level"`
		Message string `json:"@message"`
	}
	if json.Unmarshal([]byte(line), &entry) != nil {
		return line
	}
	if entry.Level == "trace" || entry.Level == "debug" {
		return ""
	}
	return entry.Message
}

// wrap adds the plugin's last stderr lines to err.
func (t *stderrTail) wrap(err error) error {
	if t == nil || err == nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return err
	}
	return fmt.Errorf("%w; its last stderr: %s", err, strings.Join(t.lines, " | "))
}

// handshakeError says in one line what go-plugin's many-line
// "Unrecognized remote plugin message" means.
func handshakeError(err error) error {
	msg := err.Error()
	const unrecognized = "Unrecognized remote plugin message: "
	i := strings.Index(msg, unrecognized)
	if i < 0 {
		return err
	}
	got, _, _ := strings.Cut(msg[i+len(unrecognized):], "\n")
	if got == "" {
		return fmt.Errorf("no go-plugin handshake: the plugin exited or wrote nothing to stdout")
	}
	return fmt.Errorf("no go-plugin handshake: the plugin wrote %q to stdout instead", got)
}
