package kubernetes

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The manifests' command lines run as the kubelet would run them, one
// process per role's pod, on this machine: each pod gets a loopback
// address of its own (all of 127.0.0.0/8 is loopback on Linux) and the
// ports the manifests name, its volumes become directories laid out as the
// kubelet lays them out, from the Secrets that deploy/README.md's commands
// make, and the gossip Service's name resolves to every pod's address, as
// cluster DNS resolves a headless Service. Run as root (as CI runs), the
// processes run as the pods' user with their fsGroup, so that a file mode
// the node cannot read fails here. What this leaves out is Kubernetes
// itself: scheduling, the pod network, DNS, the kubelet.

// modelDir is the stories260K model, outside the repository.
const modelDir = repoRoot + "/../shared/models/stories260K"

// readme is the page whose commands make the credentials.
const readme = "../README.md"

// podAddr is the address the test gives each role's pod.
var podAddr = map[string]string{"router": "127.0.10.1", "prefill": "127.0.10.2", "decode": "127.0.10.3"}

// waitFor bounds each wait for a process to serve, a probe to answer, a
// drain to finish.
const waitFor = 60 * time.Second

func TestManifestsServe(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs a loopback address per pod (127.0.10.x), which only Linux routes without setup")
	}
	if _, err := os.Stat(filepath.Join(modelDir, "stories260K.bin")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the model the manifests serve: %v", err)
		}
		t.Skipf("the model the manifests serve: %v", err)
	}
	files, err := readFiles()
	if err != nil {
		t.Fatal(err)
	}
	ms, problems := decodeAll(files)
	if len(problems) > 0 {
		t.Fatal(strings.Join(problems, "\n"))
	}
	var p []string
	pods := nodePods(ms, func(where, format string, args ...any) { p = append(p, where+": "+fmt.Sprintf(format, args...)) })
	if len(p) > 0 {
		t.Fatal(strings.Join(p, "\n"))
	}
	work := t.TempDir()
	secrets, keys := runCredentials(t, work)

	if len(keys) == 0 {
		t.Fatalf("%s's Credentials make no API key (node keys new)", readme)
	}

	procs := map[string]*proc{}
	for _, n := range pods { // in the order of roles, the router first: the others join it
		procs[n.role] = startPod(t, n, ms, secrets)
	}
	router, decode := procs["router"], procs["decode"]
	url := "http://" + net.JoinHostPort(podAddr["router"], httpPort(router.node))
	waitStatus(t, url+"/readyz", "", http.StatusOK)

	t.Run("API", func(t *testing.T) { waitStatus(t, url+"/v1/models", keys[0], http.StatusOK) })
	t.Run("generate", func(t *testing.T) { generate(t, work, router.node) })
	t.Run("dashboard and alerts", func(t *testing.T) { checkMonitoring(t, procs) })
	t.Run("keys reloaded on SIGHUP", func(t *testing.T) { rotateKey(t, work, router, url) })
	t.Run("preStop drains", func(t *testing.T) {
		preStop(t, decode)
		waitStatus(t, url+"/readyz", "", http.StatusServiceUnavailable) // no decode node left
	})
	for _, role := range []string{"router", "prefill"} {
		procs[role].stop(t, syscall.SIGTERM)
	}
}

// runCredentials runs the commands of README.md's Credentials section in
// work: node certs and node keys as they are (with the binary under test
// for go run ./cmd/node), and kubectl create secret as the Secrets it
// would make, by name and key. It returns them and the API keys printed.
func runCredentials(t *testing.T, work string) (map[string]map[string][]byte, []string) {
	t.Helper()
	cmds, err := readmeCommands("## Credentials")
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]map[string][]byte{}
	var keys []string
	for _, line := range cmds {
		f := strings.Fields(line)
		switch {
		case len(f) > 3 && slices.Equal(f[:3], []string{"go", "run", "./cmd/node"}):
			out := runNode(t, work, f[3:]...)
			if f[3] == "keys" {
				keys = append(keys, strings.TrimSpace(out))
			}
		case slices.Equal(f, []string{"kubectl", "create", "namespace", "kvwarden"}):
		case len(f) > 6 && slices.Equal(f[:5], []string{"kubectl", "-n", "kvwarden", "create", "secret"}):
			name, data := secretFrom(t, work, f[5], f[6], f[7:])
			secrets[name] = data
		default:
			t.Fatalf("%s: a command this test does not know how to run: %s", readme, line)
		}
	}
	return secrets, keys
}

// readmeCommands are the lines of the first sh block after heading, with
// continued lines joined and comments dropped.
func readmeCommands(heading string) ([]string, error) {
	b, err := os.ReadFile(readme)
	if err != nil {
		return nil, err
	}
	_, rest, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		return nil, fmt.Errorf("%s has no section %q", readme, heading)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	block, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		return nil, fmt.Errorf("%s: section %q has no sh block", readme, heading)
	}
	var out []string
	for _, line := range strings.Split(strings.ReplaceAll(block, "\\\n", " "), "\n") {
		if cmd, _, _ := strings.Cut(line, " #"); strings.TrimSpace(cmd) != "" {
			out = append(out, strings.TrimSpace(cmd))
		}
	}
	return out, nil
}

// secretFrom is the Secret "kubectl create secret TYPE NAME ARGS" makes of
// files in work.
func secretFrom(t *testing.T, work, typ, name string, args []string) (string, map[string][]byte) {
	t.Helper()
	data := map[string][]byte{}
	for _, a := range args {
		flag, value, _ := strings.Cut(a, "=")
		key, file := "", value
		switch {
		case typ == "generic" && flag == "--from-file":
			key, file, _ = strings.Cut(value, "=")
		case typ == "tls" && flag == "--cert":
			key = corev1.TLSCertKey
		case typ == "tls" && flag == "--key":
			key = corev1.TLSPrivateKeyKey
		default:
			t.Fatalf("%s: kubectl create secret %s %s: %s is not known to this test", readme, typ, name, a)
		}
		b, err := os.ReadFile(filepath.Join(work, file))
		if err != nil {
			t.Fatalf("%s: secret %s: %v", readme, name, err)
		}
		data[key] = b
	}
	return name, data
}

// runNode runs the node binary in dir and returns its standard output.
func runNode(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bins.node, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %q: %v\n%s%s", args, err, out, stderr.Bytes())
	}
	return string(out)
}

// pod is one role's pod laid out here: its address, its volumes as
// directories by mount path, and, when the test runs as root (as CI
// does), the user and groups its securityContext runs it as.
type pod struct {
	addr   string
	mounts map[string]string
	cred   *syscall.Credential
}

// local is path p of the pod's filesystem, here.
func (p pod) local(path string) string {
	best := ""
	for m := range p.mounts {
		if (path == m || strings.HasPrefix(path, m+"/")) && len(m) > len(best) {
			best = m
		}
	}
	if best == "" {
		return path
	}
	return p.mounts[best] + strings.TrimPrefix(path, best)
}

// layOut makes n's pod: a directory for each volume its container mounts,
// filled as the kubelet fills it: a Secret's items with the volume's mode,
// owned by the pod's fsGroup, so that a mode the pod's user cannot read
// fails here as it would there.
func layOut(t *testing.T, n nodePod, secrets map[string]map[string][]byte) pod {
	t.Helper()
	p := pod{addr: podAddr[n.role], mounts: map[string]string{}}
	sc := n.dep.Spec.Template.Spec.SecurityContext
	if os.Geteuid() == 0 {
		p.cred = &syscall.Credential{Uid: uint32(*sc.RunAsUser), Gid: uint32(*sc.RunAsGroup), Groups: []uint32{uint32(*sc.FSGroup)}}
	}
	model, err := filepath.Abs(modelDir)
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: its parent is open to its owner only.
	root, err := os.MkdirTemp("", "kvwarden-pod-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	base := openDir(t, root, n.role)
	for _, m := range n.c.VolumeMounts {
		_, v := mountAt(n, m.MountPath)
		dir := openDir(t, base, v.Name)
		switch {
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				p.writeItems(t, dir, secrets, src.Secret.Name, src.Secret.Items, v.Projected.DefaultMode)
			}
		case v.Secret != nil:
			p.writeItems(t, dir, secrets, v.Secret.SecretName, v.Secret.Items, v.Secret.DefaultMode)
		case v.PersistentVolumeClaim != nil:
			dir = model // the model volume, filled as README.md fills it
		case v.EmptyDir != nil:
			if err := os.Chmod(dir, 0o777); err != nil { // as the kubelet makes an emptyDir
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s: volume %s is of a kind this test does not lay out", n.where, v.Name)
		}
		p.mounts[m.MountPath] = dir
	}
	return p
}

// openDir makes dir/name, and dir, traversable by the pod's user.
func openDir(t *testing.T, dir, name string) string {
	t.Helper()
	d := filepath.Join(dir, name)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(os.Chmod(dir, 0o755), os.Chmod(d, 0o755)); err != nil {
		t.Fatal(err)
	}
	return d
}

// writeItems writes the items of Secret name into dir, as a Secret or
// projected volume has them: each with its own mode, else the volume's
// (the API's default, 0644, if unset).
func (p pod) writeItems(t *testing.T, dir string, secrets map[string]map[string][]byte, name string, items []corev1.KeyToPath,
	defaultMode *int32) {
	t.Helper()
	s, ok := secrets[name]
	if !ok {
		t.Fatalf("the manifests mount Secret %s, which %s does not make", name, readme)
	}
	for _, it := range items {
		b, ok := s[it.Key]
		if !ok {
			t.Fatalf("the manifests mount key %s of Secret %s, which %s does not put in it", it.Key, name, readme)
		}
		mode := cmp.Or(it.Mode, defaultMode, ptr(corev1.SecretVolumeSourceDefaultMode))
		p.writeFile(t, filepath.Join(dir, it.Path), b, os.FileMode(*mode))
	}
}

func ptr[T any](v T) *T { return &v }

// writeFile puts a file into one of the pod's Secret volumes as the
// kubelet does: whole (a rename), with mode, owned by root and the pod's
// fsGroup.
func (p pod) writeFile(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	tmp := path + ".new"
	err := os.WriteFile(tmp, b, 0o600)
	if err == nil && p.cred != nil {
		err = os.Chown(tmp, 0, int(p.cred.Groups[0]))
	}
	if err == nil {
		err = os.Chmod(tmp, mode)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// env is the pod's environment for its container, as the kubelet sets it,
// with the paths of its volumes here.
func (p pod) env(c corev1.Container) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + p.local("/tmp"), "TMPDIR=" + p.local("/tmp")}
	for k, v := range sampleEnv(c, p.addr) {
		if strings.HasPrefix(v, "/") {
			v = p.local(v)
		}
		env = append(env, k+"="+v)
	}
	return env
}

// runArgs are the container's args as the kubelet passes them (each
// $(VAR) expanded), with the pod's paths here, its HTTP wildcard bound to
// its own address (each pod has a network namespace of its own; here they
// share one) and the gossip Service resolved to every pod's address.
func (p pod) runArgs(n nodePod, ms []manifest) []string {
	vars := sampleEnv(n.c, p.addr)
	out := []string{"run"}
	for _, a := range n.c.Args[1:] {
		name, value, _ := strings.Cut(expand(a, vars), "=")
		switch {
		case name == "--http":
			value = strings.Replace(value, "0.0.0.0:", p.addr+":", 1)
		case name == "--join":
			var addrs []string
			for _, j := range strings.Split(value, ",") {
				host, port, _ := net.SplitHostPort(j)
				if serviceNamed(ms, host) == nil {
					addrs = append(addrs, j)
					continue
				}
				for _, role := range roles {
					addrs = append(addrs, net.JoinHostPort(podAddr[role], port))
				}
			}
			value = strings.Join(addrs, ",")
		case strings.HasPrefix(value, "/"):
			value = p.local(value)
		}
		if value == "" && !strings.Contains(a, "=") {
			out = append(out, name)
		} else {
			out = append(out, name+"="+value)
		}
	}
	return out
}

// proc is a running pod's node process.
type proc struct {
	cmd     *exec.Cmd
	node    nodePod
	pod     pod
	serving chan struct{} // closed at the "serving on" line
	done    chan error    // the process's exit
	mu      sync.Mutex
	log     bytes.Buffer // its stdout and stderr, for failures
}

func (pr *proc) Write(b []byte) (int, error) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.log.Write(b)
}

func (pr *proc) output() string {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.log.String()
}

// startPod starts n's pod and waits until its node serves.
func startPod(t *testing.T, n nodePod, ms []manifest, secrets map[string]map[string][]byte) *proc {
	t.Helper()
	p := layOut(t, n, secrets)
	pr := &proc{node: n, pod: p, serving: make(chan struct{}), done: make(chan error, 1)}
	pr.cmd = exec.Command(bins.node, p.runArgs(n, ms)...)
	pr.cmd.Env = p.env(n.c)
	pr.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	pr.cmd.Stderr = pr
	stdout, err := pr.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := pr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go pr.scan(stdout)
	t.Cleanup(func() {
		if pr.cmd.ProcessState == nil {
			_ = pr.cmd.Process.Kill()
			<-pr.done
		}
		if t.Failed() {
			t.Logf("%s pod %s: %q\n%s", n.role, p.addr, pr.cmd.Args, pr.output())
		}
	})
	select {
	case <-pr.serving:
	case err := <-pr.done:
		t.Fatalf("%s: node run exited before serving: %v\n%s", n.where, err, pr.output())
	case <-time.After(waitFor):
		t.Fatalf("%s: node run did not serve within %s\n%s", n.where, waitFor, pr.output())
	}
	return pr
}

// scan copies the process's stdout to its log, closes serving at the
// readiness line, and reports the exit once stdout closes.
func (pr *proc) scan(stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	once := sync.Once{}
	for sc.Scan() {
		fmt.Fprintln(pr, sc.Text())
		if strings.HasPrefix(sc.Text(), "serving on ") {
			once.Do(func() { close(pr.serving) })
		}
	}
	pr.done <- pr.cmd.Wait()
}

// stop signals the process and requires it to exit 0.
func (pr *proc) stop(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := pr.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	pr.exited(t)
}

// exited requires the process to exit 0 within waitFor.
func (pr *proc) exited(t *testing.T) {
	t.Helper()
	select {
	case err := <-pr.done:
		if err != nil {
			t.Fatalf("%q exited: %v\n%s", pr.cmd.Args, err, pr.output())
		}
	case <-time.After(waitFor):
		t.Fatalf("%q did not exit within %s\n%s", pr.cmd.Args, waitFor, pr.output())
	}
}

// waitStatus polls url (with key as the API's bearer token, if any) until
// it answers want, for at most waitFor.
func waitStatus(t *testing.T, url, key string, want int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := "no answer"
	for time.Now().Before(deadline) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if resp, err := http.DefaultClient.Do(req); err != nil {
			last = err.Error()
		} else {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == want {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(body))
		}
		<-tick.C
	}
	t.Fatalf("GET %s: want %d within %s, last %s", url, want, waitFor, last)
}

// generate sends one request to the router through the nodes' own
// protocol, as a tenant of the cluster's CA, and requires the model card's
// story: the whole path (router, decode, prefill, KV transfer) serves.
func generate(t *testing.T, work string, router nodePod) {
	certs := filepath.Join(work, "certs")
	runNode(t, work, "certs", "issue", "--dir", certs, "--role", "tenant", "--name", "ci")
	out := runNode(t, work, "generate", "--certs", certs, "--endpoint", expand(router.run["listen"], sampleEnv(router.c, podAddr["router"])),
		"--tenant", "ci", "--prompt", "", "--max-tokens", "16")
	if !strings.HasPrefix(out, "Once upon a time") {
		t.Fatalf("generate: %q, want the story of the model card (../shared/models/stories260K/README.md)", out)
	}
}

// rotateKey follows README.md's rotation: a new key added to the keys
// file, the Secret's file replaced (atomically, as the kubelet swaps a
// Secret volume's files), then SIGHUP: the router takes the new key only
// after the signal.
func rotateKey(t *testing.T, work string, router *proc, url string) {
	cmds, err := readmeCommands("## Rotate API keys with SIGHUP")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(cmds[0])
	if !slices.Equal(f[:4], []string{"go", "run", "./cmd/node", "keys"}) {
		t.Fatalf("%s: the rotation starts with %q, want go run ./cmd/node keys new", readme, cmds[0])
	}
	key := strings.TrimSpace(runNode(t, work, f[3:]...))
	waitStatus(t, url+"/v1/models", key, http.StatusUnauthorized)
	b, err := os.ReadFile(filepath.Join(work, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	mounted := router.pod.local(router.node.run["api-keys"])
	st, err := os.Stat(mounted)
	if err != nil {
		t.Fatal(err)
	}
	router.pod.writeFile(t, mounted, b, st.Mode())
	if err := router.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, url+"/v1/models", key, http.StatusOK)
}

// preStop runs the preStop hook of pr's pod as the kubelet runs an exec
// hook: its command as written (no $(VAR) expansion), in the container's
// environment, /envexec and /node being the image's binaries. It must
// drain the node: the hook and the node both exit 0.
func preStop(t *testing.T, pr *proc) {
	n := pr.node
	cmd := slices.Clone(n.c.Lifecycle.PreStop.Exec.Command)
	cmd[0], cmd[1] = bins.envexec, bins.node
	hook := exec.Command(cmd[0], cmd[1:]...)
	hook.Env = pr.pod.env(n.c)
	hook.SysProcAttr = &syscall.SysProcAttr{Credential: pr.pod.cred}
	out, err := hook.CombinedOutput()
	if err != nil {
		t.Fatalf("preStop %q: %v\n%s", n.c.Lifecycle.PreStop.Exec.Command, err, out)
	}
	if !strings.Contains(string(out), "drained "+podAddr[n.role]) {
		t.Fatalf("preStop: %s, want the node drained", out)
	}
	pr.exited(t)
}
