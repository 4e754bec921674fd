package disk

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// judge turns one look at a path into its verdict. err is the look's own
// failure (it hung). A path that cannot be written is an error, yet only
// ActionWarn: restarting the workers frees no disk and fixes no mount,
// and a job that is not checkpointing right now loses nothing yet. Low
// space, low inodes and slow writes are warnings, sent before a
// checkpoint would fail.
func judge(path string, s sample, err error, c config) detector.Finding {
	f := detector.Finding{Subject: path}
	switch {
	case err != nil:
		return bad(f, detector.SeverityWarning, "the check of %s did not finish (a hung file system?): %v", path, err)
	case errors.Is(s.StatErr, fs.ErrNotExist):
		return bad(f, detector.SeverityError, "%s is missing: checkpoints to it will fail", path)
	case s.StatErr != nil:
		return bad(f, detector.SeverityError, "cannot check %s: %v: checkpoints to it may fail", path, s.StatErr)
	case s.WriteErr != nil:
		return bad(f, detector.SeverityError, "%s is not writable: %v: checkpoints to it will fail", path, s.WriteErr)
	}
	var warns []string
	if need := c.minFree.need(s.Total); s.Avail < need {
		warns = append(warns, fmt.Sprintf("checkpoints to %s may fail: %s free (%s of %s; min-free %s)",
			path, formatBytes(s.Avail), percent(s.Avail, s.Total), formatBytes(s.Total), c.minFree.text))
	}
	if need := c.minInodes.need(s.Files); s.Files > 0 && s.Ffree < need {
		warns = append(warns, fmt.Sprintf("checkpoints to %s may fail: %d inodes free (%s of %d; min-inodes %s)",
			path, s.Ffree, percent(s.Ffree, s.Files), s.Files, c.minInodes.text))
	}
	if s.Latency > c.maxLatency {
		warns = append(warns, fmt.Sprintf("a %d-byte write and fsync to %s took %s (max-write-latency %s)",
			probeSize, path, s.Latency.Round(time.Millisecond), c.maxLatency))
	}
	if len(warns) > 0 {
		return bad(f, detector.SeverityWarning, "%s", strings.Join(warns, "; "))
	}
	f.Message = fmt.Sprintf("%s: %s free (%s), write and fsync in %s", path, formatBytes(s.Avail), percent(s.Avail, s.Total), s.Latency.Round(time.Microsecond))
	if s.Files > 0 {
		f.Message += fmt.Sprintf(", %d inodes free (%s)", s.Ffree, percent(s.Ffree, s.Files))
	}
	return f
}

// bad fills in a finding that is not healthy; all of this plugin's ask
// for no more than a warning's action.
func bad(f detector.Finding, s detector.Severity, format string, args ...any) detector.Finding {
	f.Severity, f.Action, f.Message = s, detector.ActionWarn, fmt.Sprintf(format, args...)
	return f
}

func percent(part, whole uint64) string {
	if whole == 0 {
		return "?%"
	}
	return fmt.Sprintf("%.1f%%", float64(part)*100/float64(whole))
}
