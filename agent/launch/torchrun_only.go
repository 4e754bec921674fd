package launch

// torchrunOnly checks the torchrun 2.x flags that only make sense inside
// torchrun's Python: they are accepted at the values that change nothing
// here and refused, with the reason, otherwise, rather than taken as
// unknown flags or silently ignored.
func (r rawFlags) torchrunOnly() error {
	switch r["event-log-handler"] {
	case "null", "console":
	default:
		return usagef("--event-log-handler %q: torch.distributed.elastic's event handlers run inside torchrun; ddp-agent logs its events and exports them through OpenTelemetry (--otel-endpoint). Accepted: null, console", r["event-log-handler"])
	}
	if v := r["logs-specs"]; v != "" {
		return usagef("--logs-specs %q: torchrun's LogsSpecs are Python plugins; ddp-agent lays out logs as --log-dir, --redirects and --tee say", v)
	}
	return nil
}
