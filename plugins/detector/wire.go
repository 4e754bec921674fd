package detector

import (
	"fmt"
	"time"

	detectorv1 "github.com/ddp-agent/ddp-agent/plugins/detector/proto"
	"github.com/ddp-agent/ddp-agent/plugins/internal/wiretime"
)

// The wire enums start at 1 (0 is UNSPECIFIED, refused), so a plugin in
// another language that forgets a field is caught rather than read as
// "healthy, do nothing".

func severityToWire(s Severity) (detectorv1.Severity, error) {
	switch s {
	case SeverityOK:
		return detectorv1.Severity_SEVERITY_OK, nil
	case SeverityWarning:
		return detectorv1.Severity_SEVERITY_WARNING, nil
	case SeverityError:
		return detectorv1.Severity_SEVERITY_ERROR, nil
	}
	return 0, fmt.Errorf("%v is not a severity", s)
}

func severityFromWire(s detectorv1.Severity) (Severity, error) {
	switch s {
	case detectorv1.Severity_SEVERITY_OK:
		return SeverityOK, nil
	case detectorv1.Severity_SEVERITY_WARNING:
		return SeverityWarning, nil
	case detectorv1.Severity_SEVERITY_ERROR:
		return SeverityError, nil
	case detectorv1.Severity_SEVERITY_UNSPECIFIED:
		return 0, fmt.Errorf("severity not set")
	}
	return 0, fmt.Errorf("severity %d unknown", int32(s))
}

func actionToWire(a Action) (detectorv1.Action, error) {
	switch a {
	case ActionNone:
		return detectorv1.Action_ACTION_NONE, nil
	case ActionWarn:
		return detectorv1.Action_ACTION_WARN, nil
	case ActionRestartWorkers:
		return detectorv1.Action_ACTION_RESTART_WORKERS, nil
	case ActionDrainNode:
		return detectorv1.Action_ACTION_DRAIN_NODE, nil
	}
	return 0, fmt.Errorf("%v is not an action", a)
}

func actionFromWire(a detectorv1.Action) (Action, error) {
	switch a {
	case detectorv1.Action_ACTION_NONE:
		return ActionNone, nil
	case detectorv1.Action_ACTION_WARN:
		return ActionWarn, nil
	case detectorv1.Action_ACTION_RESTART_WORKERS:
		return ActionRestartWorkers, nil
	case detectorv1.Action_ACTION_DRAIN_NODE:
		return ActionDrainNode, nil
	case detectorv1.Action_ACTION_UNSPECIFIED:
		return 0, fmt.Errorf("action not set")
	}
	return 0, fmt.Errorf("action %d unknown", int32(a))
}

func findingToWire(f Finding) (*detectorv1.Finding, error) {
	sev, err := severityToWire(f.Severity)
	if err != nil {
		return nil, err
	}
	act, err := actionToWire(f.Action)
	if err != nil {
		return nil, err
	}
	return &detectorv1.Finding{
		Subject:      f.Subject,
		Severity:     sev,
		Action:       act,
		Message:      f.Message,
		TimeUnixNano: wiretime.To(f.Time),
	}, nil
}

func findingFromWire(msg *detectorv1.Finding) (Finding, error) {
	sev, err := severityFromWire(msg.GetSeverity())
	if err != nil {
		return Finding{}, err
	}
	act, err := actionFromWire(msg.GetAction())
	if err != nil {
		return Finding{}, err
	}
	return Finding{
		Subject:  msg.GetSubject(),
		Severity: sev,
		Action:   act,
		Message:  msg.GetMessage(),
		Time:     wiretime.From(msg.GetTimeUnixNano()),
	}, nil
}

func scheduleFromWire(resp *detectorv1.ConfigureResponse) Schedule {
	return Schedule{Every: time.Duration(resp.GetEveryNanos())}
}
