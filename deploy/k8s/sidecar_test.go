package k8s

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ddp-agent/ddp-agent/agent/launch"
)

// sidecarSources define the sidecar's flags: its own, and the telemetry
// flags of agent/observe's flag helper. Its parser is in package main and
// cannot be imported; this test reads the flag names and kinds from the
// sources instead, so a renamed or removed flag fails here.
var sidecarSources = []string{"../../agent/cmd/ddp-agent/sidecar.go", "../../agent/observe/flags.go"}

// sidecarFlags returns the sidecar's flags, each with whether it is a
// boolean, from the fs.XxxVar and fs.Func calls in sidecarSources.
func sidecarFlags(t *testing.T) map[string]bool {
	t.Helper()
	flags := map[string]bool{}
	for _, src := range sidecarSources {
		f, err := parser.ParseFile(token.NewFileSet(), src, nil, 0)
		if err != nil {
			t.Fatalf("the sidecar's flags: %v", err)
		}
		addFlags(f, flags)
	}
	for _, want := range []string{"socket", "hang-timeout", "metrics-addr"} {
		if _, ok := flags[want]; !ok {
			t.Fatalf("found %v in %v, no --%s: has the flag set moved?", flags, sidecarSources, want)
		}
	}
	return flags
}

// addFlags adds the flags that f's fs.XxxVar and fs.Func calls define.
func addFlags(f *ast.File, flags map[string]bool) {
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "fs" {
			return true
		}
		arg := 0 // fs.Func(name, ...), fs.String(name, ...)
		if strings.HasSuffix(sel.Sel.Name, "Var") {
			arg = 1 // fs.StringVar(&v, name, ...)
		}
		if len(call.Args) <= arg {
			return true
		}
		lit, ok := call.Args[arg].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		name, err := strconv.Unquote(lit.Value)
		if err == nil {
			flags[name] = strings.HasPrefix(sel.Sel.Name, "Bool")
		}
		return true
	})
}

// checkSidecarArgs checks `ddp-agent sidecar` arguments as Go's flag package
// would take them, against the sidecar's flags, and the values of those
// whose meaning this test knows.
func checkSidecarArgs(t *testing.T, args []string, flags map[string]bool) {
	t.Helper()
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			t.Errorf("argument %q: the sidecar takes flags only", a)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		isBool, ok := flags[name]
		if !ok {
			t.Errorf("flag -%s is not one of the sidecar's (%v)", name, sidecarSources)
			continue
		}
		if !isBool && !hasVal {
			if i+1 >= len(args) {
				t.Errorf("flag -%s needs a value", name)
				continue
			}
			i++
			val = args[i]
		}
		var err error
		switch name {
		case "hang-timeout":
			if val != "auto" {
				_, err = time.ParseDuration(val)
			}
		case "job-linger":
			var d time.Duration
			if d, err = time.ParseDuration(val); err == nil && d < time.Second {
				t.Errorf("--job-linger %v: at least 1s", d)
			}
		case "metrics-addr":
			_, err = addrPort(val)
		}
		if err != nil {
			t.Errorf("--%s %q: %v", name, val, err)
		}
	}
}

// TestNativeSidecars: every `ddp-agent sidecar` is a native sidecar (an init
// container with restartPolicy Always) that starts before the trainer, shares
// its socket with it through a volume mounted at the same path, and runs as
// the same uid, which the sidecar requires of its peers.
func TestNativeSidecars(t *testing.T) {
	flags := sidecarFlags(t)
	n := 0
	for _, j := range all[batchv1.Job](loadManifests(t)) {
		spec := j.obj.Spec.Template.Spec
		for _, sc := range spec.InitContainers {
			if !isCommand(sc, "ddp-agent", "sidecar") {
				continue
			}
			n++
			t.Run(j.obj.Name+"/"+sc.Name, func(t *testing.T) {
				if sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
					t.Error("not a native sidecar: restartPolicy is not Always (it would run to completion before the trainer)")
				}
				if sc.StartupProbe == nil {
					t.Error("no startupProbe: the trainer may start before the socket exists")
				}
				if spec.ShareProcessNamespace == nil || !*spec.ShareProcessNamespace {
					t.Error("shareProcessNamespace is off: the sidecar sees no worker pids (no stacks, no host monitor)")
				}
				env, err := containerEnv(sc, pod{name: j.obj.Name + "-0-x7k2p"})
				if err != nil {
					t.Fatal(err)
				}
				args, err := argv(sc, env)
				if err != nil {
					t.Fatal(err)
				}
				checkSidecarArgs(t, args[2:], flags)
				checkSocketShared(t, spec, sc, env["DDP_AGENT_SOCKET"])
			})
		}
	}
	if n == 0 {
		t.Error("no `ddp-agent sidecar` in the manifests")
	}
}

// checkSocketShared: the socket is in a subdirectory of a volume the sidecar
// mounts; every container that names the socket mounts that volume at the
// same path, names the same socket and runs as the sidecar's uid.
func checkSocketShared(t *testing.T, spec corev1.PodSpec, sc corev1.Container, sock string) {
	t.Helper()
	if sock == "" {
		t.Fatal("the sidecar has no DDP_AGENT_SOCKET: it and the hook would each pick a per-user path of their own")
	}
	var mount *corev1.VolumeMount
	for i, m := range sc.VolumeMounts {
		if strings.HasPrefix(sock, strings.TrimSuffix(m.MountPath, "/")+"/") {
			mount = &sc.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("socket %s is on no volume of the sidecar: the trainer cannot reach it", sock)
	}
	if path.Dir(sock) == path.Clean(mount.MountPath) {
		t.Errorf("socket %s at the volume's root, which is root's: the hook refuses it; put it in a subdirectory", sock)
	}
	uid := effectiveUID(spec, sc)
	if uid == nil || *uid == 0 {
		t.Errorf("sidecar uid %s: set runAsUser (not root) so that the trainer's is known to match", uidString(uid))
	}
	peers := 0
	for _, c := range spec.Containers {
		v := envVar(c, "DDP_AGENT_SOCKET")
		if v == nil {
			continue
		}
		peers++
		if v.Value != sock {
			t.Errorf("container %s: DDP_AGENT_SOCKET %q, the sidecar's is %q", c.Name, v.Value, sock)
		}
		shared := false
		for _, m := range c.VolumeMounts {
			shared = shared || (m.Name == mount.Name && m.MountPath == mount.MountPath)
		}
		if !shared {
			t.Errorf("container %s does not mount volume %s at %s, as the sidecar does", c.Name, mount.Name, mount.MountPath)
		}
		if cu := effectiveUID(spec, c); uid != nil && (cu == nil || *cu != *uid) {
			t.Errorf("container %s runs as uid %s, the sidecar as %d: the sidecar admits only its own uid", c.Name, uidString(cu), *uid)
		}
	}
	if peers == 0 {
		t.Error("no container names DDP_AGENT_SOCKET: the sidecar watches nobody")
	}
	for _, v := range spec.Volumes {
		if v.Name == mount.Name && v.EmptyDir == nil {
			t.Errorf("volume %s is not an emptyDir: a socket left by another pod could be found there", v.Name)
		}
	}
}

func uidString(uid *int64) string {
	if uid == nil {
		return "unset (the image's user)"
	}
	return strconv.FormatInt(*uid, 10)
}

// TestTorchrunCommands: an unchanged torchrun command line beside the
// sidecar is also one `ddp-agent run` takes (it is a drop-in for torchrun),
// in the environment of every pod: a typo in a torchrun flag fails here.
func TestTorchrunCommands(t *testing.T) {
	for _, j := range all[batchv1.Job](loadManifests(t)) {
		for _, c := range j.obj.Spec.Template.Spec.Containers {
			if !isCommand(c, "torchrun", "") {
				continue
			}
			for i := 0; i < int(*j.obj.Spec.Completions); i++ {
				env, err := containerEnv(c, pod{index: i, name: j.obj.Name + "-" + strconv.Itoa(i) + "-x7k2p"})
				if err != nil {
					t.Fatal(err)
				}
				args, err := argv(c, env)
				if err != nil {
					t.Fatal(err)
				}
				host := launch.Host{CPUs: 96, GPUs: func() (int, error) { return gpus(c), nil }}
				cfg, err := launch.Parse(args[1:], func(k string) string { return env[k] }, host)
				if err != nil {
					t.Fatalf("%s/%s pod %d: %v", j.obj.Name, c.Name, i, err)
				}
				if cfg.NodeRank != i || cfg.NNodesMax != int(*j.obj.Spec.Completions) {
					t.Errorf("%s/%s pod %d: node %d of %d, want %d of %d", j.obj.Name, c.Name, i, cfg.NodeRank, cfg.NNodesMax, i, *j.obj.Spec.Completions)
				}
			}
		}
	}
}
