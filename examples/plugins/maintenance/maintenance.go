package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

const (
	defaultFile     = "/etc/ddp-agent/maintenance"
	defaultInterval = "10s"
	headLimit       = 4096 // the message is the file's first line; no more is read
)

// maintenance is the detector. The plugin server calls Configure and Watch
// on goroutines of its own, so the settings are behind a lock.
type maintenance struct {
	mu       sync.Mutex
	file     string
	interval time.Duration
}

func (*maintenance) Info(context.Context) (plugins.Info, error) {
	return plugins.Info{
		Name:    "maintenance",
		Kind:    plugins.KindDetector,
		Version: "0.1.0",
		Summary: "drains the node while a maintenance file exists; its first line is the reason",
		Options: []plugins.Option{
			{Name: "file", Default: defaultFile, Help: "the file whose existence drains the node"},
			{Name: "interval", Default: defaultInterval, Help: "how often to look"},
		},
	}, nil
}

// Configure checks the options. A look is one stat and one small read, so
// the heartbeat promise is the interval itself.
func (m *maintenance) Configure(ctx context.Context, cfg plugins.Config) (detector.Schedule, error) {
	info, _ := m.Info(ctx)
	if err := cfg.Check(info); err != nil {
		return detector.Schedule{}, err
	}
	v := cfg.Get("interval", defaultInterval)
	interval, err := time.ParseDuration(v)
	if err != nil || interval <= 0 {
		return detector.Schedule{}, fmt.Errorf("plugin maintenance: option interval=%q: want a duration above 0, such as 10s", v)
	}
	m.mu.Lock()
	m.file, m.interval = cfg.Get("file", defaultFile), interval
	m.mu.Unlock()
	return detector.Schedule{Every: interval}, nil
}

// Watch looks at once, then every interval, and sends every verdict: the
// healthy ones are the detector's heartbeat.
func (m *maintenance) Watch(ctx context.Context, emit func(detector.Finding) error) error {
	m.mu.Lock()
	file, interval := m.file, m.interval
	m.mu.Unlock()
	if interval <= 0 {
		return errors.New("plugin maintenance: Watch before Configure")
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if err := emit(look(file)); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// look is one verdict about file.
func look(file string) detector.Finding {
	f := detector.Finding{Subject: file, Time: time.Now()}
	reason, err := firstLine(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		f.Severity, f.Action, f.Message = detector.SeverityOK, detector.ActionNone, "no maintenance file"
	case err != nil:
		// Cannot tell: say so, but do not drain a node on a doubt.
		f.Severity, f.Action, f.Message = detector.SeverityWarning, detector.ActionWarn, fmt.Sprintf("cannot read the maintenance file: %v", err)
	default:
		f.Severity, f.Action = detector.SeverityError, detector.ActionDrainNode
		f.Message = "node in maintenance"
		if reason != "" {
			f.Message += ": " + reason
		}
	}
	return f
}

func firstLine(file string) (string, error) {
	fh, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	head, err := io.ReadAll(io.LimitReader(fh, headLimit))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", file, err)
	}
	line, _, _ := strings.Cut(string(head), "\n")
	return strings.TrimSpace(strings.ToValidUTF8(line, "\uFFFD")), nil
}
