package launch

import "github.com/ddp-agent/ddp-agent/agent/supervisor"

// KeepLogs reports whether --redirects or --tee ask for log files, which
// torchrun writes (to a temporary directory) even without --log-dir.
func (c *Config) KeepLogs() bool { return c.Redirects.Any() || c.Tee.Any() }

// Streams maps --redirects, --tee and --log-dir onto each local rank's
// worker: redirected streams go to their file only, teed ones to file and
// console, and with --log-dir every stream is also written to its file.
func (c *Config) Streams() func(localRank int) supervisor.Streams {
	return c.streams(c.LogDir != "" || c.KeepLogs())
}

// streams is Streams for a run that has (logging) or has not a directory
// for log files.
func (c *Config) streams(logging bool) func(int) supervisor.Streams {
	return func(lr int) supervisor.Streams {
		red, tee := c.Redirects.For(lr), c.Tee.For(lr)
		all := logging && c.LogDir != ""
		return supervisor.Streams{
			ConsoleOut: !red.Has(StdOut),
			ConsoleErr: !red.Has(StdErr),
			FileOut:    logging && (all || red.Has(StdOut) || tee.Has(StdOut)),
			FileErr:    logging && (all || red.Has(StdErr) || tee.Has(StdErr)),
		}
	}
}
