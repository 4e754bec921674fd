package k8s

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// kinds are the objects the manifests may hold, by apiVersion and kind; any
// other is an error, so a typo in either is caught here and not by kubectl.
var kinds = map[string]func() any{
	"v1/Service":                    func() any { return new(corev1.Service) },
	"batch/v1/Job":                  func() any { return new(batchv1.Job) },
	"apps/v1/StatefulSet":           func() any { return new(appsv1.StatefulSet) },
	"policy/v1/PodDisruptionBudget": func() any { return new(policyv1.PodDisruptionBudget) },
}

// manifest is one YAML document of a file, decoded.
type manifest struct {
	file string // base name
	doc  int    // 1-based position among the file's non-empty documents
	obj  any    // *batchv1.Job, *corev1.Service, ...
}

func (m manifest) String() string { return fmt.Sprintf("%s document %d", m.file, m.doc) }

// splitDocuments splits a YAML stream on its "---" lines and drops the
// documents that hold only comments and blank lines.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if hasContent(cur.Bytes()) {
			docs = append(docs, bytes.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimRight(line, " \t") == "---" {
			flush()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	flush()
	return docs
}

func hasContent(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			return true
		}
	}
	return false
}

// decodeStrict decodes one YAML document into the k8s.io/api type of its
// apiVersion and kind. Unknown fields, duplicate keys, trailing data and an
// unknown kind are errors, and so is a key the typed object does not give
// back under the same spelling (encoding/json matches keys regardless of
// case; the API server does not).
func decodeStrict(doc []byte) (any, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return nil, fmt.Errorf("type meta: %w", err)
	}
	newObj, ok := kinds[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("unknown kind %q of apiVersion %q (known: %s)", tm.Kind, tm.APIVersion, knownKinds())
	}
	obj := newObj()
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%s: trailing data after the object", tm.Kind)
	}
	back, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var orig, round any
	if err := json.Unmarshal(js, &orig); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(back, &round); err != nil {
		return nil, err
	}
	if err := sameKeys("", orig, round); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

func knownKinds() string {
	var ks []string
	for k := range kinds {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}

// sameKeys reports a key of orig missing from round, the object decoded and
// encoded again: misspelt in case, or dropped. A zero value (false, 0, "",
// an empty list or map) may be missing: omitempty drops it.
func sameKeys(path string, orig, round any) error {
	switch o := orig.(type) {
	case map[string]any:
		r, _ := round.(map[string]any)
		for k, v := range o {
			rv, ok := r[k]
			if !ok {
				if isZero(v) {
					continue
				}
				return fmt.Errorf("field %s%s is not one of the type's (check its spelling and case)", path, k)
			}
			if err := sameKeys(path+k+".", v, rv); err != nil {
				return err
			}
		}
	case []any:
		r, _ := round.([]any)
		for i, v := range o {
			if i >= len(r) {
				return fmt.Errorf("list %s lost its item %d", strings.TrimSuffix(path, "."), i)
			}
			if err := sameKeys(fmt.Sprintf("%s%d.", path, i), v, r[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

func isZero(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Map, reflect.Slice:
		return rv.Len() == 0
	}
	return rv.IsZero()
}

// loadManifests decodes every document of every YAML file here.
func loadManifests(t *testing.T) []manifest {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no manifests (*.yaml) found")
	}
	var all []manifest
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs := splitDocuments(data)
		if len(docs) == 0 {
			t.Errorf("%s: no documents", f)
		}
		for i, d := range docs {
			obj, err := decodeStrict(d)
			if err != nil {
				t.Errorf("%s document %d: %v", f, i+1, err)
				continue
			}
			all = append(all, manifest{file: f, doc: i + 1, obj: obj})
		}
	}
	return all
}

// TestManifestsDecodeStrictly: every document of every manifest is an
// object of a known kind with only fields its type has, and the files
// this test checks further are all there.
func TestManifestsDecodeStrictly(t *testing.T) {
	ms := loadManifests(t)
	count := map[string]int{}
	for _, m := range ms {
		count[m.file+" "+reflect.TypeOf(m.obj).Elem().Name()]++
	}
	for _, want := range []string{
		"launcher.yaml Job", "launcher.yaml Service",
		"sidecar.yaml Job", "sidecar.yaml Service",
		"etcd.yaml StatefulSet", "etcd.yaml Service", "etcd.yaml PodDisruptionBudget",
	} {
		if count[want] == 0 {
			t.Errorf("no %s", want)
		}
	}
}

// TestDecoderRejects: the strict decoder refuses what the API server (or
// kubectl apply --validate=strict) would, so the test above can fail.
func TestDecoderRejects(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"unknown field", "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  completionMode: Indexed\n  paralelism: 2\n", "unknown field \"paralelism\""},
		{"unknown nested field", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  clusterIP: None\n  ports:\n  - {name: a, port: 1, targetPorts: 1}\n", "unknown field \"targetPorts\""},
		{"wrong case", "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: e}\nspec:\n  Replicas: 3\n", "field spec.Replicas"},
		{"wrong type", "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  completions: four\n", "cannot unmarshal"},
		{"duplicate key", "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  completions: 4\n  completions: 5\n", "already set"},
		{"unknown kind", "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: j}\n", "unknown kind \"JobSet\""},
		{"kind of another version", "apiVersion: batch/v1beta1\nkind: Job\nmetadata: {name: j}\n", "unknown kind"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeStrict([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	good := "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  completionMode: Indexed\n  parallelism: 2\n  suspend: false\n"
	if _, err := decodeStrict([]byte(good)); err != nil {
		t.Errorf("a valid Job (with a zero value given) was refused: %v", err)
	}
}

// TestDecoderRejectsFixture: a whole manifest with one misspelt field, as
// a person would write it, fails to load.
func TestDecoderRejectsFixture(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "unknown_field.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := splitDocuments(data)
	if len(docs) != 1 {
		t.Fatalf("got %d documents, want 1", len(docs))
	}
	if _, err := decodeStrict(docs[0]); err == nil || !strings.Contains(err.Error(), `unknown field "terminationGracePeriodSecond"`) {
		t.Errorf("got %v, want the unknown field named", err)
	}
}

func TestSplitDocuments(t *testing.T) {
	in := "# only a comment\n---\na: 1\n---   \n\n---\n# c\nb: 2\n"
	got := splitDocuments([]byte(in))
	if len(got) != 2 || !strings.Contains(string(got[0]), "a: 1") || !strings.Contains(string(got[1]), "b: 2") {
		t.Errorf("got %q, want the two documents with content", got)
	}
}
