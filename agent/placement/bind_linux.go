package placement

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ddp-agent/ddp-agent/nvml"
)

// Memory policies of set_mempolicy(2) (linux/mempolicy.h); x/sys/unix
// does not name them.
const (
	mpolPreferred = 1
	mpolBind      = 2
)

// Exec binds the calling process as the arguments after BindCommand say
// and execs the command that follows them, resolved through PATH, with
// os.Environ(). It returns only on error, naming what failed; the
// process must then exit. See BindCommand for why a trampoline.
func Exec(args []string) error {
	b, err := parseBind(args)
	if err != nil {
		return err
	}
	path, err := exec.LookPath(b.argv[0])
	if err != nil {
		return fmt.Errorf("bind worker: %w", err)
	}
	// Affinity and memory policy are per thread, and execve keeps those of
	// the thread that calls it: the goroutine stays on this one thread
	// from here to the exec. It is never unlocked: should anything fail,
	// the thread is discarded when the goroutine ends rather than handed,
	// bound, to other goroutines.
	runtime.LockOSThread()
	if len(b.cpus) > 0 {
		set := unix.NewCPUSet(slices.Max(b.cpus) + 1)
		for _, c := range b.cpus {
			set.Set(c)
		}
		if err := unix.SchedSetaffinityDynamic(0, set); err != nil {
			return fmt.Errorf("bind worker to CPUs %s: %w", b.cpus, err)
		}
	}
	if b.mem >= 0 {
		mode, name := mpolPreferred, "prefer"
		if b.strict {
			mode, name = mpolBind, "bind"
		}
		if err := setMemPolicy(mode, b.mem); err != nil {
			return fmt.Errorf("bind worker memory (%s) to NUMA node %d: %w", name, b.mem, err)
		}
	}
	if err := syscall.Exec(path, b.argv, os.Environ()); err != nil {
		return fmt.Errorf("exec worker %s: %w", path, err)
	}
	return errors.New("exec worker: returned without an error") // execve does not return on success
}

// setMemPolicy sets the calling thread's memory policy to mode over the
// single node. The nodemask is an array of unsigned long; the kernel reads
// maxnode-1 bits of it (get_nodes decrements maxnode first), hence the +1,
// as numactl passes it.
func setMemPolicy(mode, node int) error {
	mask := make([]uint, node/bits.UintSize+1)
	mask[node/bits.UintSize] |= 1 << (node % bits.UintSize)
	maxnode := len(mask)*bits.UintSize + 1
	_, _, errno := unix.Syscall(unix.SYS_SET_MEMPOLICY, uintptr(mode), uintptr(unsafe.Pointer(&mask[0])), uintptr(maxnode))
	if errno != 0 {
		return errno
	}
	return nil
}

// MemsAllowed returns the NUMA nodes this process may allocate on
// (Mems_allowed_list in /proc/self/status: its cpuset's mems).
func MemsAllowed() (nvml.CPUList, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, fmt.Errorf("memory nodes allowed: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Mems_allowed_list:"); ok {
			l, err := nvml.ParseCPUList(strings.TrimSpace(v))
			if err != nil {
				return nil, fmt.Errorf("memory nodes allowed: %w", err)
			}
			return l, nil
		}
	}
	return nil, errors.New("memory nodes allowed: no Mems_allowed_list in /proc/self/status")
}

// Affinity returns the CPUs the calling process may run on
// (sched_getaffinity of the calling thread, which a Go program does not
// change: the cgroup cpuset and any taskset applied to it).
func Affinity() (nvml.CPUList, error) {
	// The kernel refuses a mask shorter than its own (EINVAL); start at
	// glibc's CPU_SETSIZE and grow.
	for size := 1024; size <= 1<<22; size *= 2 {
		set := unix.NewCPUSet(size)
		err := unix.SchedGetaffinityDynamic(0, set)
		if errors.Is(err, unix.EINVAL) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("CPU affinity: %w", err)
		}
		cpus := nvml.CPUList{}
		for c := range size {
			if set.IsSet(c) {
				cpus = append(cpus, c)
			}
		}
		return cpus, nil
	}
	return nil, errors.New("CPU affinity: mask larger than 4M CPUs")
}
