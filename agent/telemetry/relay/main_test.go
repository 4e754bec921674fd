package relay

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the run if goroutines of this package or of net/http
// (a Server's connections, a Client's transport) outlive the tests:
// every Server and Client is closed by its test.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := checkLeaks(5 * time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// checkLeaks waits up to wait for the goroutines whose stacks mention this
// package or net/http to end, and lists those that do not.
func checkLeaks(wait time.Duration) error {
	var leaked []string
	for end := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		leaked = leaked[:0]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "relay.TestMain") || strings.Contains(g, "relay.checkLeaks") {
				continue
			}
			if strings.Contains(g, "agent/telemetry/relay.") || strings.Contains(g, "net/http.") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("%d goroutines leaked:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
	}
}
