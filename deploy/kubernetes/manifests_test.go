package kubernetes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../.."

// kustomizationFile lists the manifests kubectl apply -k applies.
const kustomizationFile = "kustomization.yaml"

// toolsDir holds manifests applied by hand, outside the kustomization.
const toolsDir = "tools"

// bins are the binaries the image holds, built once for every test: the
// node binary as the Dockerfile builds it (CGO_ENABLED=0) and envexec.
var bins struct{ node, envexec string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvwarden-deploy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.node, bins.envexec = filepath.Join(dir, "node"), filepath.Join(dir, "envexec")
	// Run by the pods' user too (cluster_test.go), as the image's are.
	err = errors.Join(os.Chmod(dir, 0o755), goBuild(repoRoot, bins.node, "./cmd/node"), goBuild("..", bins.envexec, "./envexec"))
	code := 1
	if err == nil {
		code = m.Run()
	} else {
		fmt.Fprintln(os.Stderr, err)
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// goBuild builds pkg of the module in dir into out, static as in the image.
func goBuild(dir, out, pkg string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s in %s: %w\n%s", pkg, dir, err, b)
	}
	return nil
}

// kustomization is the part of kustomization.yaml these manifests use:
// resources only, so that what the tests check is what kubectl applies.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

// manifest is one YAML document, decoded into its API type.
type manifest struct {
	where string // file#index, for messages
	obj   runtime.Object
}

// name is the object's kind and name, as kubectl names it.
func (m manifest) name() string {
	acc, _ := m.obj.(metav1.Object)
	return m.obj.GetObjectKind().GroupVersionKind().Kind + "/" + acc.GetName()
}

// fileSet is manifest files by name, relative to this package's
// directory: the files on disk, or those with a mistake planted in one.
type fileSet map[string][]byte

// readFiles reads the kustomization's resources and the tools; it refuses
// a YAML file in either directory that neither lists.
func readFiles() (fileSet, error) {
	k, err := os.ReadFile(kustomizationFile)
	if err != nil {
		return nil, err
	}
	var kz kustomization
	if err := strictYAML(k, &kz); err != nil {
		return nil, fmt.Errorf("%s: %w (it may list resources only)", kustomizationFile, err)
	}
	if kz.APIVersion != "kustomize.config.k8s.io/v1beta1" || kz.Kind != "Kustomization" {
		return nil, fmt.Errorf("%s: apiVersion %q kind %q, want kustomize.config.k8s.io/v1beta1 Kustomization",
			kustomizationFile, kz.APIVersion, kz.Kind)
	}
	tools, err := filepath.Glob(filepath.Join(toolsDir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	on, err := filepath.Glob("*.yaml")
	if err != nil {
		return nil, err
	}
	for _, f := range on {
		if f != kustomizationFile && !slices.Contains(kz.Resources, f) {
			return nil, fmt.Errorf("%s is not among the resources of %s", f, kustomizationFile)
		}
	}
	files := fileSet{}
	for _, f := range append(kz.Resources, tools...) {
		if files[f], err = os.ReadFile(f); err != nil {
			return nil, fmt.Errorf("%s: %w", kustomizationFile, err)
		}
	}
	return files, nil
}

// inKustomization says whether file is applied by kubectl apply -k (not a
// tool applied by hand).
func inKustomization(file string) bool { return !strings.HasPrefix(file, toolsDir+"/") }

// decodeAll decodes every document of every file, in file order.
func decodeAll(files fileSet) ([]manifest, []string) {
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	var out []manifest
	var problems []string
	for _, f := range names {
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(files[f])))
		for i := 0; ; i++ {
			doc, err := r.Read()
			if err == io.EOF {
				break
			}
			where := fmt.Sprintf("%s#%d", f, i)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", where, err))
				break
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			m, errs := decode(where, doc)
			problems = append(problems, errs...)
			if m.obj != nil {
				out = append(out, m)
			}
		}
	}
	return out, problems
}

// stripComments drops the comment lines of a YAML document, so that a
// document of comments only counts as empty.
func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for line := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			b.Write(line)
		}
	}
	return b.Bytes()
}

// scheme knows the kinds the manifests may use; any other is refused.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme,
		policyv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// decode decodes one document strictly into its API type: a duplicate
// key, an unknown field (field names are case-sensitive, as the API
// server's decoder has them) or a value of the wrong type is a problem,
// and so is a required field that is missing.
func decode(where string, doc []byte) (manifest, []string) {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return manifest{}, []string{fmt.Sprintf("%s: %v", where, err)}
	}
	var tm metav1.TypeMeta
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(j, &tm); err != nil {
		return manifest{}, []string{fmt.Sprintf("%s: %v", where, err)}
	}
	obj, err := scheme.New(schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind))
	if err != nil {
		return manifest{}, []string{fmt.Sprintf("%s: apiVersion %q kind %q: %v", where, tm.APIVersion, tm.Kind, err)}
	}
	strict, err := sigsjson.UnmarshalStrict(j, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return manifest{}, []string{fmt.Sprintf("%s: %v", where, err)}
	}
	var problems []string
	for _, e := range strict {
		problems = append(problems, fmt.Sprintf("%s: %v", where, e))
	}
	var raw any
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(j, &raw); err != nil {
		return manifest{}, []string{fmt.Sprintf("%s: %v", where, err)}
	}
	for _, f := range missingRequired(obj, raw) {
		problems = append(problems, fmt.Sprintf("%s: required field %s is missing", where, f))
	}
	return manifest{where: where, obj: obj}, problems
}

// strictYAML decodes YAML into v, refusing unknown and duplicate fields.
func strictYAML(y []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(y)
	if err != nil {
		return err
	}
	strict, err := sigsjson.UnmarshalStrict(j, v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// validate is every check of every manifest: what decoding found, then
// the references between objects and kvwarden's invariants.
func validate(files fileSet) []string {
	ms, problems := decodeAll(files)
	if len(problems) > 0 {
		return problems // later checks would only repeat what is broken
	}
	problems = append(problems, checkObjects(ms)...)
	return append(problems, checkNodes(ms)...)
}

// TestManifests is the check CI runs: no problem in any manifest.
func TestManifests(t *testing.T) {
	files, err := readFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range validate(files) {
		t.Error(p)
	}
}
