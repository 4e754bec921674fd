package nccl

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Environment of the tests against the real NCCL (layout_test.go,
// real_test.go).
const (
	// envHeaders is the directory of cached headers, VERSION/nccl.h, as
	// scripts/nccl-headers.sh writes them.
	envHeaders = "DDP_AGENT_NCCL_HEADERS"
	// envLib is the real libnccl.so.2 (a wheel's nvidia/nccl/lib); its
	// include/nccl.h is compared too. Not DDP_AGENT_NCCL_LIB, which would
	// hand the real NCCL to every other test of the run.
	envLib = "DDP_AGENT_TEST_NCCL_LIB"
	// envRequire, when not empty, turns a missing header or library from
	// a skip into a failure (CI sets it).
	envRequire = "DDP_AGENT_REQUIRE_NCCL"
)

// ncclHeader is one real nccl.h: name (its version, or "installed") and
// the directory that holds it.
type ncclHeader struct{ name, dir string }

// headerDirs lists the cached headers, oldest first, then the installed
// one next to $DDP_AGENT_TEST_NCCL_LIB.
func headerDirs() []ncclHeader {
	root := os.Getenv(envHeaders)
	if root == "" {
		if c, err := os.UserCacheDir(); err == nil {
			root = filepath.Join(c, "ddp-agent", "nccl-headers")
		}
	}
	var hs []ncclHeader
	if root != "" {
		files, _ := filepath.Glob(filepath.Join(root, "*", "nccl.h"))
		for _, f := range files {
			hs = append(hs, ncclHeader{name: filepath.Base(filepath.Dir(f)), dir: filepath.Dir(f)})
		}
	}
	slices.SortFunc(hs, func(a, b ncclHeader) int { return cmpVersions(a.name, b.name) })
	if lib := os.Getenv(envLib); lib != "" {
		inc := filepath.Join(filepath.Dir(lib), "..", "include")
		if _, err := os.Stat(filepath.Join(inc, "nccl.h")); err == nil {
			hs = append(hs, ncclHeader{name: "installed", dir: inc})
		}
	}
	return hs
}

// cmpVersions orders "2.9.1" before "2.18.3"; a part that is not a number
// compares as text.
func cmpVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		na, ea := strconv.Atoi(pa[i])
		nb, eb := strconv.Atoi(pb[i])
		if c := cmp.Compare(na, nb); ea == nil && eb == nil && c != 0 {
			return c
		}
		if c := strings.Compare(pa[i], pb[i]); (ea != nil || eb != nil) && c != 0 {
			return c
		}
	}
	return cmp.Compare(len(pa), len(pb))
}

// requireOrSkip fails the test when $DDP_AGENT_REQUIRE_NCCL is set, and
// skips it otherwise.
func requireOrSkip(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(envRequire) != "" {
		t.Fatalf("%s (%s is set)", msg, envRequire)
	}
	t.Skipf("%s; set %s=1 to make this a failure", msg, envRequire)
}

// TestLayout compiles testdata/layout against every real nccl.h it finds:
// the shim's own declarations (ddpnccl.h) in one translation unit, the
// header in another. Each ncclConfig_t field the shim declares must sit at
// the header's offset with its size and type; the unique id, every result
// code, data type and reduction op, the config magic and "undefined"
// values, NCCL_CONFIG_INITIALIZER's fields and the version formula must
// agree, as must the Go constants of this package; and every function
// pointer of ddpnccl_lib must have the type of NCCL's prototype.
func TestLayout(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		requireOrSkip(t, "gcc not found")
	}
	headers := headerDirs()
	if len(headers) == 0 {
		requireOrSkip(t, "no real nccl.h: run scripts/nccl-headers.sh (caches them in %s, default "+
			"$XDG_CACHE_HOME/ddp-agent/nccl-headers) or point %s at a wheel's lib/libnccl.so.2", envHeaders, envLib)
	}
	funcs := writeFuncs(t)
	for _, h := range headers {
		t.Run(h.name, func(t *testing.T) {
			out := runLayout(t, h.dir, funcs)
			checkLayout(t, parseLayout(t, out))
		})
	}
}

var symRE = regexp.MustCompile(`SYM\((\w+), "(\w+)", [01]\)`)

// writeFuncs writes funcs.h for nccl_side.c: ddpnccl.h's ddpnccl_lib
// typedef and one LAYOUT_FUNC(field, ncclName) per entry of ddpnccl.c's
// symbol table. It returns the directory.
func writeFuncs(t *testing.T) string {
	t.Helper()
	h, err := os.ReadFile("ddpnccl.h")
	if err != nil {
		t.Fatal(err)
	}
	c, err := os.ReadFile("ddpnccl.c")
	if err != nil {
		t.Fatal(err)
	}
	end := strings.Index(string(h), "} ddpnccl_lib;")
	start := strings.LastIndex(string(h[:max(end, 0)]), "typedef struct {")
	if end < 0 || start < 0 {
		t.Fatal("ddpnccl.h: no `typedef struct { ... } ddpnccl_lib;`")
	}
	syms := symRE.FindAllStringSubmatch(string(c), -1)
	if len(syms) < 8 {
		t.Fatalf("ddpnccl.c: found %d SYM(field, \"name\", required) entries, want the whole table", len(syms))
	}
	var b strings.Builder
	b.WriteString("/* Written by layout_test.go from ddpnccl.h and ddpnccl.c. */\n")
	b.WriteString(string(h[start:end]) + "} ddpnccl_lib;\n\n#define LAYOUT_FUNCS")
	for _, s := range syms {
		fmt.Fprintf(&b, " \\\n  LAYOUT_FUNC(%s, %s)", s[1], s[2])
	}
	b.WriteString("\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "funcs.h"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runLayout builds testdata/layout against the nccl.h in dir and returns
// its output. The command is
//
//	gcc -std=gnu11 -Wall -Werror -I. -Itestdata/layout -o layout \
//	  testdata/layout/main.c testdata/layout/shim_side.c ddpnccl.c \
//	  -Itestdata/layout/cuda -IDIR -IFUNCS testdata/layout/nccl_side.c -ldl
//
// (the -I options apply to every file; shim_side.c reaches only
// ddpnccl.h, nccl_side.c only nccl.h and the CUDA stubs).
func runLayout(t *testing.T, dir, funcs string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "layout")
	args := []string{"-std=gnu11", "-Wall", "-Werror", "-I.", "-Itestdata/layout", "-o", bin,
		"testdata/layout/main.c", "testdata/layout/shim_side.c", "ddpnccl.c",
		"-Itestdata/layout/cuda", "-I" + dir, "-I" + funcs, "testdata/layout/nccl_side.c", "-ldl"}
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	return string(out)
}

// layoutRow is one line of the layout program's output.
type layoutRow struct {
	kind, name string
	f          []string // the remaining columns
}

func parseLayout(t *testing.T, out string) []layoutRow {
	t.Helper()
	var rows []layoutRow
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) < 3 {
			t.Fatalf("layout output line %q: want kind, name, values", sc.Text())
		}
		rows = append(rows, layoutRow{kind: f[0], name: f[1], f: f[2:]})
	}
	return rows
}

// since is when nccl.h began to declare a value the shim declares, for
// headers older than that (from 2.18 on). Before 2.29 the magic appears
// only as NCCL_CONFIG_INITIALIZER's literal, compared as
// NCCL_CONFIG_INITIALIZER.magic.
var since = map[string]Version{
	"ncclTimeout":    ParseVersion(23000),
	"NCCL_API_MAGIC": ParseVersion(22900),
}

// goValues are this package's constants, by the C name they stand for.
var goValues = map[string]int64{
	"ncclInt8": Int8, "ncclUint8": Uint8, "ncclInt32": Int32, "ncclUint32": Uint32, "ncclInt64": Int64,
	"ncclUint64": Uint64, "ncclFloat16": Float16, "ncclFloat32": Float32, "ncclFloat64": Float64,
	"ncclBfloat16": BFloat16,
	"ncclSum":      Sum, "ncclProd": Prod, "ncclMax": Max, "ncclMin": Min, "ncclAvg": Avg,
	"ncclSuccess": int64(Success), "ncclUnhandledCudaError": int64(UnhandledCudaError),
	"ncclSystemError": int64(SystemError), "ncclInternalError": int64(InternalError),
	"ncclInvalidArgument": int64(InvalidArgument), "ncclInvalidUsage": int64(InvalidUsage),
	"ncclRemoteError": int64(RemoteError), "ncclInProgress": int64(InProgress), "ncclTimeout": int64(Timeout),
	"NCCL_UNIQUE_ID_BYTES": UniqueIDBytes,
}

var versionRE = regexp.MustCompile(`^NCCL_VERSION\((\d+), (\d+), (\d+)\)$`)

// checkLayout judges the rows: every difference is one error naming the
// item, the shim's value and the header's.
func checkLayout(t *testing.T, rows []layoutRow) {
	t.Helper()
	info := map[string][]string{}
	for _, r := range rows {
		if r.kind == "info" {
			info[r.name] = r.f
		}
	}
	code, err := strconv.Atoi(first(info["NCCL_VERSION_CODE"]))
	if err != nil {
		t.Fatalf("no NCCL_VERSION_CODE in the layout output: %v", err)
	}
	hv := ParseVersion(code)
	t.Logf("nccl.h %s (NCCL_VERSION_CODE %d); sizeof(ncclConfig_t): shim %s, nccl.h %s",
		first(info["NCCL_MAJOR.MINOR.PATCH"]), code, first(info["sizeof(ncclConfig_t)"]), at(info["sizeof(ncclConfig_t)"], 1))
	if got, want := hv.String(), first(info["NCCL_MAJOR.MINOR.PATCH"]); got != want {
		t.Errorf("ParseVersion(%d) = %s, nccl.h says %s", code, got, want)
	}
	if got := VersionCode(hv.Major, hv.Minor, hv.Patch); got != code {
		t.Errorf("VersionCode(%d, %d, %d) = %d, nccl.h's NCCL_VERSION_CODE is %d", hv.Major, hv.Minor, hv.Patch, got, code)
	}
	checkConfigSize(t, info)

	n := 0
	for _, r := range rows {
		switch r.kind {
		case "value":
			n++
			checkValue(t, hv, r)
		case "func":
			n++
			if first(r.f) != "1" {
				t.Errorf("ddpnccl_lib's pointer for %s does not have the type of nccl.h's prototype", r.name)
			}
		}
	}
	if n < 60 {
		t.Errorf("only %d items compared: the layout program's output is incomplete", n)
	}
}

func checkValue(t *testing.T, hv Version, r layoutRow) {
	t.Helper()
	if len(r.f) != 4 {
		t.Errorf("layout output for %s: %q, want shim, nccl and two types", r.name, r.f)
		return
	}
	shim, nccl, shimType, ncclType := r.f[0], r.f[1], r.f[2], r.f[3]
	if nccl == "absent" {
		if s, ok := since[r.name]; !ok || hv.AtLeast(s.Major, s.Minor, s.Patch) {
			t.Errorf("%s: nccl.h %s does not declare it (the shim has %s)", r.name, hv, shim)
		}
	} else if shim != nccl {
		t.Errorf("%s: shim declares %s, nccl.h %s has %s", r.name, shim, hv, nccl)
	}
	if shimType != ncclType {
		t.Errorf("%s: shim's field is %q, nccl.h %s has %q", r.name, shimType, hv, ncclType)
	}
	v, err := strconv.ParseInt(shim, 10, 64)
	if err != nil {
		t.Errorf("%s: shim value %q: %v", r.name, shim, err)
		return
	}
	if g, ok := goValues[r.name]; ok && g != v {
		t.Errorf("%s: Go constant is %d, ddpnccl.h says %d", r.name, g, v)
	}
	if slices.Contains(resultNames[:], r.name) {
		if got := Result(v).String(); got != r.name {
			t.Errorf("Result(%d).String() = %q, want %q", v, got, r.name)
		}
	}
	if m := versionRE.FindStringSubmatch(r.name); m != nil {
		x, _ := strconv.Atoi(m[1])
		y, _ := strconv.Atoi(m[2])
		z, _ := strconv.Atoi(m[3])
		if got := VersionCode(x, y, z); int64(got) != v {
			t.Errorf("VersionCode(%d, %d, %d) = %d, NCCL_VERSION gives %d", x, y, z, got, v)
		}
		if got := ParseVersion(int(v)); got.Major != x || got.Minor != y || got.Patch != z {
			t.Errorf("ParseVersion(%d) = %s, want %d.%d.%d", v, got, x, y, z)
		}
	}
}

// checkConfigSize: Go's view of ncclConfig_t and DDPNCCL_CONFIG_VERSION is
// the C one, and NCCL's struct is never smaller than the shim's (NCCL
// copies min(config.size, its own size) bytes).
func checkConfigSize(t *testing.T, info map[string][]string) {
	t.Helper()
	sz := info["sizeof(ncclConfig_t)"]
	shim, err1 := strconv.Atoi(first(sz))
	nccl, err2 := strconv.Atoi(at(sz, 1))
	if err1 != nil || err2 != nil {
		t.Fatalf("sizeof(ncclConfig_t) in the layout output: %q", sz)
	}
	if shim != configSize() {
		t.Errorf("sizeof(ncclConfig_t): C says %d, Go's configSize %d", shim, configSize())
	}
	if shim > nccl {
		t.Errorf("sizeof(ncclConfig_t): shim's %d is larger than nccl.h's %d", shim, nccl)
	}
	if got := first(info["DDPNCCL_CONFIG_VERSION"]); got != strconv.Itoa(configVersion()) {
		t.Errorf("DDPNCCL_CONFIG_VERSION: C says %s, Go's configVersion %d", got, configVersion())
	}
}

func first(f []string) string { return at(f, 0) }

func at(f []string, i int) string {
	if i < len(f) {
		return f[i]
	}
	return ""
}
