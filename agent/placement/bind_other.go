//go:build !linux

package placement

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/ddp-agent/ddp-agent/nvml"
)

// Exec would bind the process and exec the command (see the Linux
// version); binding needs Linux, so it only checks the arguments.
func Exec(args []string) error {
	if _, err := parseBind(args); err != nil {
		return err
	}
	return fmt.Errorf("bind worker on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

// Affinity returns nil, no restriction: this system has no CPU affinity
// the agent reads.
func Affinity() (nvml.CPUList, error) { return nil, nil }

// MemsAllowed returns nil, no restriction.
func MemsAllowed() (nvml.CPUList, error) { return nil, nil }
