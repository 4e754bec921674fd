package exec

import (
	"fmt"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// verdict turns how a check ended into a finding about the node. Only the
// four documented exit codes ask for anything; a check that cannot run,
// crashes or hangs is a warning about the check, never a reason to stop
// the job.
func verdict(res result, timeout time.Duration) detector.Finding {
	f := detector.Finding{Subject: "node", Severity: detector.SeverityWarning, Action: detector.ActionWarn, Time: time.Now()}
	line := firstLine(res.output)
	switch {
	case res.startErr != nil:
		f.Message = fmt.Sprintf("exec check cannot start: %v", res.startErr)
	case res.timedOut:
		f.Message = fmt.Sprintf("exec check timed out after %v and was killed with its process group", timeout)
	case res.signal != "":
		f.Message = withLine(fmt.Sprintf("exec check died of %s", res.signal), line)
	case res.exitCode == 0:
		f.Severity, f.Action = detector.SeverityOK, detector.ActionNone
		f.Message = orDefault(line, "exec check passed")
	case res.exitCode == 1:
		f.Message = orDefault(line, "exec check warns (exit 1)")
	case res.exitCode == 2:
		f.Severity, f.Action = detector.SeverityError, detector.ActionRestartWorkers
		f.Message = orDefault(line, "exec check asks to restart the workers (exit 2)")
	case res.exitCode == 3:
		f.Severity, f.Action = detector.SeverityError, detector.ActionDrainNode
		f.Message = orDefault(line, "exec check asks to drain the node (exit 3)")
	default:
		f.Message = withLine(fmt.Sprintf("exec check exited %d, which is none of 0 ok, 1 warn, 2 restart workers, 3 drain node", res.exitCode), line)
	}
	return f
}

// firstLine is the output's first line as printable UTF-8: the message
// goes to logs, a report and a proto string, which must be valid UTF-8.
func firstLine(out string) string {
	line, _, _ := strings.Cut(out, "\n")
	line = strings.ToValidUTF8(line, "\uFFFD")
	line = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, line)
	return strings.TrimSpace(line)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func withLine(msg, line string) string {
	if line == "" {
		return msg
	}
	return msg + ": " + line
}
