package main

import (
	"sort"

	"github.com/ddp-agent/ddp-agent/plugins/bundled/disk"
	"github.com/ddp-agent/ddp-agent/plugins/bundled/exec"
	"github.com/ddp-agent/ddp-agent/plugins/bundled/nic"
	"github.com/ddp-agent/ddp-agent/plugins/bundled/webhook"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// registry maps a bundled plugin's name (its Info.Name, which the agent
// checks) to what serves it.
type registry map[string]func()

// bundled is every plugin this binary serves. A new bundled plugin is one
// line here.
func bundled() registry {
	return registry{
		"exec":    func() { detector.Serve(exec.New()) },
		"nic":     func() { detector.Serve(nic.New()) },
		"disk":    func() { detector.Serve(disk.New()) },
		"webhook": func() { notifier.Serve(webhook.New()) },
	}
}

func (r registry) names() []string {
	names := make([]string, 0, len(r))
	for name := range r {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
