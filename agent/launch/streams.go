package launch

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// KeepLogs reports whether --redirects, --tee or a --duplicate-*-filters
// ask for log files, which torchrun writes (to a temporary directory)
// even without --log-dir.
func (c *Config) KeepLogs() bool {
	return c.Redirects.Any() || c.Tee.Any() || len(c.DupOut) > 0 || len(c.DupErr) > 0
}

// Streams maps --redirects, --tee, --log-dir, --local-ranks-filter and
// --log-line-prefix-template onto each local rank's worker: redirected
// streams go to their file only, teed ones to file and console, with
// --log-dir every stream is also written to its file, and a rank the
// filter leaves out is not shown on the console (its files are kept).
func (c *Config) Streams() func(localRank int) supervisor.Streams {
	return c.streams(c.LogDir != "" || c.KeepLogs())
}

// streams is Streams for a run that has (logging) or has not a directory
// for log files.
func (c *Config) streams(logging bool) func(int) supervisor.Streams {
	return func(lr int) supervisor.Streams {
		red, tee := c.Redirects.For(lr), c.Tee.For(lr)
		all := logging && c.LogDir != ""
		shown := c.LocalRanksFilter == nil || c.LocalRanksFilter[lr]
		return supervisor.Streams{
			ConsoleOut: shown && !red.Has(StdOut),
			ConsoleErr: shown && !red.Has(StdErr),
			Prefix:     c.LinePrefix,
			DupOut:     c.DupOut,
			DupErr:     c.DupErr,
			FileOut:    logging && (all || red.Has(StdOut) || tee.Has(StdOut)),
			FileErr:    logging && (all || red.Has(StdErr) || tee.Has(StdErr)),
		}
	}
}

// parseRanks reads --local-ranks-filter: local ranks separated by commas;
// "" is nil (no filter).
func parseRanks(v string) (map[int]bool, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	ranks := map[int]bool{}
	for _, part := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a local rank (give them as 0,1,2)", part)
		}
		ranks[n] = true
	}
	return ranks, nil
}
