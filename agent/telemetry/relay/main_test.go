package relay

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/leaktest"
)

// TestMain fails the run if goroutines of this package or of net/http
// (a Server's connections, a Client's transport) outlive the tests:
// every Server and Client is closed by its test.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := leaktest.Check("agent/telemetry/relay", 5*time.Second, "net/http"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}
