package e2e

import (
	"strings"
	"testing"
)

// repeatedKey finds the first log line (slog's text format) that gives a
// key twice, as `component=ddp-agent component=etcd` once did: a logfmt
// reader keeps one of the two, and which is up to it.
func repeatedKey(log string) (line, key string, found bool) {
	for _, line := range strings.Split(log, "\n") {
		if !strings.HasPrefix(line, "time=") {
			continue // a worker's line, or a report's or stack's body
		}
		seen := map[string]bool{}
		for _, k := range logKeys(line) {
			if seen[k] {
				return line, k, true
			}
			seen[k] = true
		}
	}
	return "", "", false
}

// logKeys returns the keys of one line of slog's text format, in order:
// the words before an = that is outside a quoted value.
func logKeys(line string) []string {
	var keys []string
	quoted, start := false, 0
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case quoted && c == '\\':
			i++ // an escaped quote or backslash
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == ' ':
			start = i + 1
		case c == '=' && start >= 0:
			keys = append(keys, line[start:i])
			start = -1 // the value's own = signs are not keys
		}
	}
	return keys
}

func TestLogKeys(t *testing.T) {
	line := `time=2026-11-29T07:44:56.915Z level=INFO msg="a = b \" c=d" component=ddp-agent cmd=[a=b] endpoint=127.0.0.1:1`
	if got := strings.Join(logKeys(line), ","); got != "time,level,msg,component,cmd,endpoint" {
		t.Errorf("keys %s", got)
	}
	if _, k, ok := repeatedKey("[rank0]: x=1 x=2\n" + line + "\n" + line + " component=etcd\n"); !ok || k != "component" {
		t.Errorf("repeatedKey found %q, %v", k, ok)
	}
	if _, k, ok := repeatedKey(line); ok {
		t.Errorf("repeatedKey found %q in a line without a repeat", k)
	}
}
