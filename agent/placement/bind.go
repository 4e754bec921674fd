package placement

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/ddp-agent/ddp-agent/nvml"
)

// BindCommand is the hidden ddp-agent command that binds a worker and
// execs it: "ddp-agent __bind --cpus 0-15 --mem 3 [--strict] -- argv...".
// main hands the arguments after it to Exec.
//
// A trampoline because the binding must be in place before the worker's
// first instruction: Go's os/exec has no hook between fork and exec to set
// it in the child, and setting the affinity of a running pid races with
// the threads Python and CUDA start early (each thread keeps the mask it
// was created with). CPU affinity and the memory policy both survive
// execve, so binding itself and then exec'ing the worker is exact.
const BindCommand = "__bind"

// Args returns the argument prefix that binds w when put after the
// ddp-agent executable and before the worker's argv: BindCommand, its
// flags and "--". Nil when w is not bound at all.
func (w Worker) Args() []string {
	if len(w.CPUs) == 0 && w.MemNode < 0 {
		return nil
	}
	args := []string{BindCommand}
	if len(w.CPUs) > 0 {
		args = append(args, "--cpus", w.CPUs.String())
	}
	if w.MemNode >= 0 {
		args = append(args, "--mem", strconv.Itoa(w.MemNode))
		if w.StrictMem {
			args = append(args, "--strict")
		}
	}
	return append(args, "--")
}

// binding is a parsed BindCommand.
type binding struct {
	cpus   nvml.CPUList // nil: leave the affinity alone
	mem    int          // -1: leave the memory policy alone
	strict bool
	argv   []string
}

// parseBind reads the arguments after BindCommand.
func parseBind(args []string) (binding, error) {
	fset := flag.NewFlagSet(BindCommand, flag.ContinueOnError)
	fset.SetOutput(io.Discard)
	cpus := fset.String("cpus", "", "CPUs to run on, as in taskset -c")
	mem := fset.Int("mem", -1, "NUMA node for memory")
	strict := fset.Bool("strict", false, "bind memory to the node (MPOL_BIND) instead of preferring it")
	if err := fset.Parse(args); err != nil {
		return binding{}, fmt.Errorf("bind worker: %w", err)
	}
	b := binding{mem: *mem, strict: *strict, argv: fset.Args()}
	if *cpus != "" {
		l, err := nvml.ParseCPUList(*cpus)
		if err != nil {
			return binding{}, fmt.Errorf("bind worker: --cpus: %w", err)
		}
		b.cpus = l
	}
	switch {
	case b.mem < -1:
		return binding{}, fmt.Errorf("bind worker: --mem %d: want a NUMA node id", b.mem)
	case b.strict && b.mem < 0:
		return binding{}, errors.New("bind worker: --strict needs --mem")
	case len(b.argv) == 0:
		return binding{}, errors.New("bind worker: no command after the flags")
	}
	return b, nil
}
