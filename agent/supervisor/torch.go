package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// torchVersionScript prints the version of the torch package that the
// interpreter would import, read from torch/version.py without importing
// torch (an import costs seconds; this costs one interpreter start), or
// exits 3 when it finds no torch package.
const torchVersionScript = `import importlib.util, os, re, sys
s = importlib.util.find_spec("torch")
if not s:
    sys.exit(3)
if s.origin:
    t = open(os.path.join(os.path.dirname(s.origin), "version.py")).read()
    m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", t, re.M)
    print(m.group(1) if m else "")
`

// ErrNoTorch: the workers' interpreter ran and finds no torch package.
var ErrNoTorch = errors.New("no torch package")

// TorchVersion returns the version of PyTorch that python would import
// ("2.11.0+cu130"); "" and ErrNoTorch when python finds none; "" and
// another error when it cannot tell (no python, the probe took longer
// than timeout). It blocks for one interpreter start.
func TorchVersion(ctx context.Context, python string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "-c", torchVersionScript).Output()
	if ee, ok := errors.AsType[*exec.ExitError](err); ok && ee.ExitCode() == 3 {
		return "", ErrNoTorch
	}
	if err != nil {
		return "", fmt.Errorf("probe %s for torch: %w", python, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// asyncErrorHandlingVars names the variables that turn on ProcessGroupNCCL's
// asynchronous error handling for this PyTorch version, as its own torchrun
// sets them: TORCH_NCCL_ASYNC_ERROR_HANDLING from 2.2, where the old name
// draws a deprecation warning from every worker (twice, into the root-cause
// report's last stderr lines); NCCL_ASYNC_ERROR_HANDLING before 2.2, which
// reads only that one; both when the version is unknown.
func asyncErrorHandlingVars(torchVersion string) []string {
	const old, current = "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"
	major, minor, ok := majorMinor(torchVersion)
	switch {
	case !ok:
		return []string{old, current}
	case major > 2 || major == 2 && minor >= 2:
		return []string{current}
	default:
		return []string{old}
	}
}

// majorMinor parses the start of a version such as "2.11.0+cu130" or
// "2.2.0a0+git1234".
func majorMinor(v string) (major, minor int, ok bool) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	digits := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if digits >= 0 {
		parts[1] = parts[1][:digits]
	}
	minor, err2 := strconv.Atoi(parts[1])
	return major, minor, err1 == nil && err2 == nil
}
