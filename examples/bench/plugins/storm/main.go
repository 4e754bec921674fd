// Command storm is a detector plugin for examples/bench/plugins, with two
// modes chosen by its binary's name: "storm" sends -rate (option rate,
// default 1000) warning findings a second for option for (default 10s),
// each with a new message, so that the agent tells every one to its
// notifiers; "slow" takes option delay (default 2s) to answer Configure
// and to make each of its checks, the slowest a healthy detector may be.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

type storm struct {
	name  string
	rate  int
	dur   time.Duration
	delay time.Duration
}

func (s *storm) Info(context.Context) (plugins.Info, error) {
	return plugins.Info{Name: s.name, Kind: plugins.KindDetector, Version: "0.1.0", Summary: "benchmark load: " + s.name,
		Options: []plugins.Option{{Name: "rate", Default: "1000"}, {Name: "for", Default: "10s"}, {Name: "delay", Default: "2s"}}}, nil
}

func (s *storm) Configure(_ context.Context, cfg plugins.Config) (detector.Schedule, error) {
	var err error
	if s.rate, err = strconv.Atoi(cfg.Get("rate", "1000")); err != nil || s.rate < 1 {
		return detector.Schedule{}, fmt.Errorf("rate %q: want a positive integer", cfg["rate"])
	}
	if s.dur, err = time.ParseDuration(cfg.Get("for", "10s")); err != nil {
		return detector.Schedule{}, fmt.Errorf("for: %w", err)
	}
	if s.delay, err = time.ParseDuration(cfg.Get("delay", "2s")); err != nil {
		return detector.Schedule{}, fmt.Errorf("delay: %w", err)
	}
	if s.name == "slow" {
		time.Sleep(s.delay)
		return detector.Schedule{Every: 2 * s.delay}, nil
	}
	return detector.Schedule{Every: time.Second}, nil
}

func (s *storm) Watch(ctx context.Context, emit func(detector.Finding) error) error {
	if s.name == "slow" {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(s.delay):
			}
			if err := emit(detector.Finding{Subject: "node", Message: "slow but healthy"}); err != nil {
				return err
			}
		}
	}
	tick := time.NewTicker(time.Second / time.Duration(s.rate))
	defer tick.Stop()
	end := time.Now().Add(s.dur)
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			f := detector.Finding{Subject: "node", Severity: detector.SeverityOK, Message: "calm"}
			if now.Before(end) {
				f = detector.Finding{Subject: "node", Severity: detector.SeverityWarning, Action: detector.ActionWarn,
					Message: "storm finding " + strconv.Itoa(n)}
			}
			if err := emit(f); err != nil {
				return err
			}
		}
	}
}

func main() {
	detector.Serve(&storm{name: filepath.Base(os.Args[0])})
}
