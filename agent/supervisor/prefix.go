package supervisor

import (
	"os"
	"strconv"
	"strings"
)

// DefaultPrefix is what goes before each worker line on the console:
// the global rank, unique across the job's nodes (torchrun 2.x's default,
// [${role_name}${local_rank}]:, repeats on every node).
const DefaultPrefix = "[rank${rank}]:"

// RenderPrefix fills tmpl's macros, as torchrun's --log-line-prefix-template
// does, for worker id of role; "" renders DefaultPrefix.
func RenderPrefix(tmpl, role string, id Worker) string {
	if tmpl == "" {
		tmpl = DefaultPrefix
	}
	if !strings.Contains(tmpl, "${") {
		return tmpl
	}
	host, _ := os.Hostname()
	return strings.NewReplacer(
		"${role_name}", role,
		"${local_rank}", strconv.Itoa(id.LocalRank),
		"${rank}", strconv.Itoa(id.Rank),
		"${hostname}", host,
	).Replace(tmpl)
}
