// Package plugins is the contract between ddp-agent and its plugins: site
// health checks (detectors) and places where a job's events must be heard
// (notifiers). Each plugin is a process of its own, started by the agent
// over github.com/hashicorp/go-plugin (gRPC only, AutoMTLS, a handshake
// cookie and a protocol version), so a plugin that crashes or hangs never
// stops training.
//
// The two kinds are laid out alike: plugins/detector and plugins/notifier
// each hold the interface and its plain types (<kind>.go), the go-plugin
// glue and Serve (plugin.go), and a harness for plugin authors' tests
// (testing.go). The wire messages are in plugins/proto. This package holds
// what both share: the handshake, a plugin's self-description and its
// configuration.
package plugins

import (
	"fmt"
	"sort"
	"strings"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// ProtocolVersion is the version of the plugin protocol this agent speaks.
// A plugin built for another is refused at the handshake with one line
// saying both versions; it is raised when a message or a call changes
// incompatibly, never for an addition.
const ProtocolVersion = 1

// The handshake cookie: go-plugin's guard against a plugin binary being
// run by hand (it then prints what it is and exits), not a secret.
const (
	MagicCookieKey   = envname.PluginCookie
	MagicCookieValue = "8f4c1d2e-ddp-agent-plugin-v1"
)

// Kind is what a plugin does for the agent.
type Kind string

// The plugin kinds.
const (
	KindDetector Kind = "detector" // checks the node's health
	KindNotifier Kind = "notifier" // hears the job's events
)

// Info is how a plugin describes itself: `ddp-agent plugins` prints it,
// and the agent checks a --plugin's keys against Options before starting
// anything.
type Info struct {
	Name    string // the name --plugin takes for a bundled plugin, e.g. "exec"
	Kind    Kind
	Version string // the plugin's own version, e.g. "0.1.0"
	Summary string // one line: what it does
	Options []Option
}

// Option is one key a plugin accepts in --plugin NAME,key=value.
type Option struct {
	Name     string
	Default  string // "" means none
	Help     string
	Required bool
}

// Config is a plugin's key=value settings from the command line.
type Config map[string]string

// Check reports the first key that info does not accept, or a required
// one missing, as an error naming the plugin and its options.
func (c Config) Check(info Info) error {
	known := make(map[string]bool, len(info.Options))
	for _, o := range info.Options {
		known[o.Name] = true
		if o.Required && c[o.Name] == "" {
			return fmt.Errorf("plugin %s: option %q is required (options: %s)", info.Name, o.Name, optionNames(info))
		}
	}
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !known[k] {
			return fmt.Errorf("plugin %s: unknown option %q (options: %s)", info.Name, k, optionNames(info))
		}
	}
	return nil
}

func optionNames(info Info) string {
	if len(info.Options) == 0 {
		return "none"
	}
	names := make([]string, len(info.Options))
	for i, o := range info.Options {
		names[i] = o.Name
	}
	return strings.Join(names, ", ")
}

// Get returns the value of key, or def when it is unset or empty.
func (c Config) Get(key, def string) string {
	if v, ok := c[key]; ok && v != "" {
		return v
	}
	return def
}
