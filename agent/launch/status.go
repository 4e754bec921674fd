package launch

// ParseRdzvConf parses a --rdzv-conf value as `ddp-agent run` does, for
// other commands that reach the same store (`ddp-agent status`): the TLS
// files, protocol and etcd_prefix must mean the same there. Errors are
// *UsageError.
func ParseRdzvConf(v string) (RdzvConf, error) { return parseRdzvConf(v) }
