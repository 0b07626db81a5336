package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/internal/testwait"
)

// Bounds for the binary tests. They are generous on purpose: the tests must
// pass on a loaded two-core machine, and each bound only decides how long a
// broken binary takes to fail the test.
const (
	readyTimeout = 60 * time.Second // node run: start to readiness line
	// One node generate: past the client's own silence bound, so that a
	// request whose answer never comes fails with the client's error
	// rather than with the test's.
	commandTimeout = client.DefaultNoAnswerAfter + time.Minute
	exitTimeout    = 60 * time.Second // a signalled process to its exit
	reapTimeout    = 10 * time.Second // a killed process to its exit
)

// built is the node binary, built once for every test that runs it.
var built struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// nodeBinary builds the node binary (once per test run) and returns its
// path; it skips the test under -short.
func nodeBinary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "node-test-")
		if built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "node")
		if out, err := exec.Command("go", "build", "-o", built.path, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		built.err = makeTestCerts(built.path, filepath.Join(built.dir, "certs"))
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

// testTenants are the tenants the tests' clients have certificates for.
var testTenants = []string{"acme", "globex", "tenant-0", "tenant-1", "tenant-2", "tenant-3"}

// makeTestCerts makes, with the binary's own "node certs", the
// credentials every process of the tests uses: a CA, one certificate per
// node role (so that "node run --role R" finds its own), an operator's and
// the test tenants'. $KVWARDEN_CERTS names them for the child processes
// and for the commands run in this process.
func makeTestCerts(bin, dir string) error {
	cmds := [][]string{{"certs", "init", "--dir", dir, "--cluster", "test"},
		{"certs", "issue", "--dir", dir, "--role", "operator", "--name", "admin"}}
	for _, role := range []string{"router", "prefill", "decode", "all"} {
		cmds = append(cmds, []string{"certs", "issue", "--dir", dir, "--role", role, "--name", "0", "--host", "127.0.0.1"})
	}
	for _, tenant := range testTenants {
		cmds = append(cmds, []string{"certs", "issue", "--dir", dir, "--role", "tenant", "--name", tenant})
	}
	for _, args := range cmds {
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("node %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return os.Setenv(certsEnv, dir)
}

// process is a running node binary.
type process struct {
	cmd    *exec.Cmd
	stdout chan string // lines, closed at EOF
	stderr *testwait.Buffer
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

// startProcess starts the binary and kills it at the end of the test,
// whatever happened.
func startProcess(t testing.TB, args ...string) *process {
	t.Helper()
	return startCommand(t, nodeBinary(t), args...)
}

// startCommand is startProcess for any program.
func startCommand(t testing.TB, name string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(name, args...), stdout: make(chan string, 16),
		stderr: &testwait.Buffer{}, exited: make(chan struct{})}
	// A pipe of our own rather than StdoutPipe: Wait may then run while
	// the lines are still being read.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = w, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() {
		defer close(p.stdout)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p.stdout <- sc.Text()
		}
	}()
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		p.cmd.Process.Kill()
		select {
		case <-p.exited:
		case <-time.After(reapTimeout):
			t.Errorf("pid %d did not exit within %s of SIGKILL", p.cmd.Process.Pid, reapTimeout)
		}
	})
	return p
}

// exitCode waits for the process to exit, at most d, and returns its code
// (-1 when a signal killed it).
func (p *process) exitCode(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("pid %d still running %s after it was asked to exit; stderr:\n%s", p.cmd.Process.Pid, d, p.stderr)
	}
	var exitErr *exec.ExitError
	if errors.As(p.err, &exitErr) {
		return exitErr.ExitCode()
	}
	if p.err != nil {
		t.Fatalf("wait: %v", p.err)
	}
	return 0
}

// readyLine is the readiness line of node run; the same as readinessLine
// but written out here, so that a change to the format fails a test.
var readyLine = regexp.MustCompile(`^serving on (\S+) \(incarnation ([0-9a-f]{16}), role (\w+), gossip (\S+), ([^)]+)\)$`)

// startNode runs "node run" on a free port and returns the process and the
// address from its readiness line.
func startNode(t *testing.T, args ...string) (*process, string) {
	t.Helper()
	p := startProcess(t, append([]string{"run", "--listen", "127.0.0.1:0"}, args...)...)
	select {
	case line, ok := <-p.stdout:
		m := readyLine.FindStringSubmatch(line)
		if !ok || m == nil {
			t.Fatalf("first line of stdout is %q (open %v), want the readiness line; stderr:\n%s", line, ok, p.stderr)
		}
		return p, m[1]
	case <-time.After(readyTimeout):
		t.Fatalf("no readiness line within %s; stderr:\n%s", readyTimeout, p.stderr)
	}
	return nil, ""
}

// runBinary runs the binary to completion and returns its exit code,
// stdout and stderr.
func runBinary(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBinary(t), args...)
	cmd.WaitDelay = reapTimeout
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("node %s: no exit within %s; stderr:\n%s", strings.Join(args, " "), commandTimeout, stderr.String())
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return exitErr.ExitCode(), stdout.String(), stderr.String()
	}
	if err != nil {
		t.Fatalf("node %s: %v", strings.Join(args, " "), err)
	}
	return 0, stdout.String(), stderr.String()
}

// referenceText is what the node must generate: the single-engine greedy
// tokens, cut after EOS as the node cuts them, as text.
func referenceText(t *testing.T, cfg actors.Config, prompt string, maxTokens int) (string, int) {
	t.Helper()
	m := modeltest.Builtin(t, cfg.Model)
	want, err := m.Answer(prompt, maxTokens)
	if err != nil {
		t.Fatal(err)
	}
	return m.Text(prompt, want), len(want)
}

// TestBinaryRunGenerateStop is the whole path through the real binaries: a
// node on a free port, generations equal to the reference, a refusal with
// its numbers, and a clean stop on SIGTERM.
func TestBinaryRunGenerateStop(t *testing.T) {
	cfg := actors.DefaultConfig()
	cfg.ContextTokens, cfg.PrefillPages, cfg.DecodePages, cfg.MaxTokensMax = 256, 32, 48, 64
	node, addr := startNode(t, "--context-tokens", "256", "--prefill-pages", "32", "--decode-pages", "48",
		"--max-tokens-max", "64", "--request-timeout", "1m", "--reclaim-after", "5s")

	t.Run("generate", func(t *testing.T) {
		for _, tc := range []struct {
			prompt, stdin string
			maxTokens     int
		}{
			{"The quick brown fox jumps over the lazy dog.", "", 24},
			{"-", "tenant acme asks: what is in my KV cache?\n", 40},
			{"a", "", 1},
		} {
			prompt := tc.prompt
			if prompt == "-" {
				prompt = tc.stdin
			}
			want, tokens := referenceText(t, cfg, prompt, tc.maxTokens)
			code, stdout, stderr := runBinary(t, tc.stdin, "generate", "--endpoint", addr, "--tenant", "acme",
				"--prompt", tc.prompt, "--max-tokens", fmt.Sprint(tc.maxTokens))
			if code != exitOK {
				t.Fatalf("prompt %q: exit %d; stderr:\n%s", prompt, code, stderr)
			}
			if stdout != want+"\n" {
				t.Errorf("prompt %q: printed %q, reference %q", prompt, stdout, want+"\n")
			}
			if summary := fmt.Sprintf("%d tokens, finish ", tokens); !strings.Contains(stderr, summary) ||
				!strings.Contains(stderr, "time to first token") {
				t.Errorf("prompt %q: stderr lacks the summary %q…:\n%s", prompt, summary, stderr)
			}
		}
	})

	t.Run("oversize prompt", func(t *testing.T) {
		code, stdout, stderr := runBinary(t, "", "generate", "--endpoint", addr, "--tenant", "acme",
			"--prompt", strings.Repeat("x", 299), "--max-tokens", "8")
		if code != exitFailed || stdout != "" {
			t.Fatalf("exit %d, want %d, and stdout %q, want nothing; stderr:\n%s", code, exitFailed, stdout, stderr)
		}
		for _, want := range []string{"node: prompt_too_long (1): ", "300 tokens", "256"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, stderr)
			}
		}
	})

	// The node still serves after the refusal.
	want, _ := referenceText(t, cfg, "after", 8)
	if code, stdout, stderr := runBinary(t, "", "generate", "--endpoint", addr, "--tenant", "globex",
		"--prompt", "after", "--max-tokens", "8"); code != exitOK || stdout != want+"\n" {
		t.Fatalf("after the refusal: exit %d, printed %q, want %q; stderr:\n%s", code, stdout, want+"\n", stderr)
	}

	if err := node.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := node.exitCode(t, exitTimeout); code != exitOK {
		t.Fatalf("exit %d after SIGTERM, want 0; stderr:\n%s", code, node.stderr)
	}
	if !strings.Contains(node.stderr.String(), "node stopped") {
		t.Errorf("stderr lacks the stop:\n%s", node.stderr)
	}
	var more []string
	for line := range node.stdout {
		more = append(more, line)
	}
	if len(more) > 0 {
		t.Errorf("stdout after the readiness line: %q", more)
	}
}

// TestBinaryGenerateInterrupted sends Ctrl-C to a generate whose node never
// answers: something that accepts connections and says nothing.
func TestBinaryGenerateInterrupted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Connections are held open, unanswered, until the test ends.
	var held []net.Conn
	accepted := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	p := startProcess(t, "generate", "--endpoint", ln.Addr().String(), "--tenant", "acme", "--prompt", "hello")
	// generate handles SIGINT before it connects, so once a connection
	// arrives the signal is the request's cancellation.
	select {
	case <-accepted:
	case <-time.After(readyTimeout):
		t.Fatalf("generate did not connect within %s; stderr:\n%s", readyTimeout, p.stderr)
	}
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := p.exitCode(t, cancelGrace+exitTimeout); code != exitInterrupted {
		t.Fatalf("exit %d after SIGINT, want %d; stderr:\n%s", code, exitInterrupted, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "interrupted") {
		t.Errorf("stderr lacks the interruption:\n%s", p.stderr)
	}
}

func TestRunRefusals(t *testing.T) {
	tests := []struct {
		name string
		args []string
		exit int
		want []string
	}{
		{"unknown role", []string{"--role", "leader"}, exitUsage, []string{`--role "leader" is not a role`}},
		{"gossip name", []string{"--gossip", "localhost:0"}, exitUsage, []string{`--gossip "localhost:0": "localhost" is not an IP address`}},
		{"gossip port", []string{"--gossip", "127.0.0.1"}, exitUsage, []string{`--gossip "127.0.0.1"`}},
		{"data", []string{"--data", "127.0.0.1:99999"}, exitUsage, []string{`--data "127.0.0.1:99999": port "99999" must be 0 to 65535`}},
		{"join", []string{"--join", "127.0.0.1:7946,nowhere"}, exitUsage, []string{`--join "nowhere"`}},
		{"drain timeout", []string{"--drain-timeout", "0s"}, exitUsage, []string{"DrainTimeout (0s) must be positive"}},
		{"prefill timeout", []string{"--prefill-timeout", "0s"}, exitUsage, []string{"PrefillTimeout (0s) must be positive"}},
		// Only the pools the role holds are checked: a decode node with a
		// small prefill pool is fine, a prefill node with one is not.
		{"prefill node pool", []string{"--role", "prefill", "--prefill-pages", "64", "--decode-pages", "1"}, exitFailed,
			[]string{"prefill worker's pool holds 1024 tokens"}},
		{"decode node pool", []string{"--role", "decode", "--decode-pages", "64", "--prefill-pages", "1"}, exitFailed,
			[]string{"decode worker's pool holds 1024 tokens"}},
		{"model context", []string{"--context-tokens", "4096"}, exitUsage, []string{"--context-tokens (4096) exceeds builtin's context window of 2048 tokens"}},
		{"no workers", []string{"--decode-workers", "0"}, exitUsage, []string{"DecodeWorkers (0) must be at least 1"}},
		{"max tokens past the window", []string{"--max-tokens-max", "5000"}, exitUsage,
			[]string{"MaxTokensMax (5000) leaves no room for a prompt in the ContextTokens (2048) window; want at most 2047"}},
		{"window below a page", []string{"--context-tokens", "8", "--page-tokens", "16"}, exitUsage,
			[]string{"ContextTokens (8) is below one page of PageTokens (16)"}},
		{"pools past the memory budget", []string{"--memory-budget-bytes", "1048576"}, exitUsage,
			[]string{"the node needs 83886080 bytes (1 prefill workers × 512 pages of 32768 bytes and 1 decode workers × 1024 pages of 32768 bytes " +
				"and 256 requests in flight (--queue-max) × 2048 tokens of 64 bytes)", "more than --memory-budget-bytes, 1048576 bytes"}},
		{"requests past the memory budget", []string{"--role", "router", "--queue-max", "99999999999"}, exitUsage,
			[]string{"99999999999 requests in flight (--queue-max) × 2048 tokens of 64 bytes", "more than the host's memory"}},
		{"batch no worker reaches", []string{"--decode-pages", "128", "--batch-max", "200"}, exitUsage,
			[]string{"--batch-max (200) exceeds the 128 sequences a decode worker can hold"}},
		{"window out of range", []string{"--context-tokens", "99999999999"}, exitUsage,
			[]string{"--context-tokens (99999999999) exceeds builtin's context window of 2048 tokens"}},
		{"timeout", []string{"--request-timeout", "0s"}, exitUsage, []string{"RequestTimeout (0s) must be positive"}},
		{"http connections of one address", []string{"--http", "127.0.0.1:0", "--http-conns-per-addr-max", "5000"}, exitUsage,
			[]string{"--http's bounds", "ConnsPerAddrMax (5000) must be 1 to ConnsMax (2048)"}},
		// The most open files Linux allows a process (fs.nr_open) is 2^20
		// unless raised: so many connections and the reserve never fit.
		{"http connections past the open files", []string{"--http", "127.0.0.1:0", "--http-conns-max", "1048576"}, exitUsage,
			[]string{"ConnsMax (1048576) HTTP connections", "DescriptorsReserved (1024)", "need 1049602 file descriptors, over the process's limit of"}},
		{"http auth window", []string{"--http", "127.0.0.1:0", "--http-auth-failure-window", "0s"}, exitUsage,
			[]string{"AuthFailureWindow (0s) must be 1s to 1h"}},
		{"listen", []string{"--listen", "7070"}, exitUsage, []string{`--listen "7070"`}},
		{"listen port", []string{"--listen", "127.0.0.1:70000"}, exitUsage, []string{"port \"70000\" must be 0 to 65535"}},
		{"listen wildcard", []string{"--listen", "0.0.0.0:7070"}, exitUsage, []string{`--listen "0.0.0.0:7070": peers reach the node`}},
		{"data wildcard", []string{"--data", ":0"}, exitUsage, []string{`--data ":0": peers reach the node`}},
		{"log level", []string{"--log-level", "loud"}, exitUsage, []string{"loud"}},
		{"stray argument", []string{"now"}, exitUsage, []string{`"now"`}},
		// 64 pages of 16 tokens cannot hold the default 2048-token window.
		{"prefill pool", []string{"--prefill-pages", "64"}, exitFailed,
			[]string{"prefill worker's pool holds 1024 tokens (64 pages of 16 tokens)", "context window is 2048 tokens",
				"--context-tokens 1024, or --prefill-pages 128"}},
		{"decode pool", []string{"--context-tokens", "1000", "--decode-pages", "62"}, exitFailed,
			[]string{"decode worker's pool holds 992 tokens", "context window is 1000 tokens", "--decode-pages 63"}},
		{"page size", []string{"--page-tokens", "32", "--prefill-pages", "63"}, exitFailed,
			[]string{"2016 tokens (63 pages of 32 tokens)", "--prefill-pages 64"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.name, "open files") && openFilesLimit() == 0 {
				t.Skip("this system tells no limit of open files to check against")
			}
			code, out := runNode(append([]string{"run", "--listen", "127.0.0.1:0"}, tc.args...)...)
			if code != tc.exit {
				t.Fatalf("exit %d, want %d; output:\n%s", code, tc.exit, out)
			}
			if strings.Contains(out, "serving on") {
				t.Errorf("served despite the refusal:\n%s", out)
			}
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestRunConfigFile: run reads a config file of its own settings (the
// format preflight reads), and flags override it. Every case is refused,
// so nothing starts serving.
func TestRunConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.json")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"context_tokens": 2048, "prefill_pages": 64, "request_timeout": "30s", "reclaim_after": "2s", "listen": "127.0.0.1:0"}`)
	code, out := runNode("run", "--config", path)
	if code != exitFailed || !strings.Contains(out, "64 pages of 16 tokens") {
		t.Fatalf("file alone: exit %d; output:\n%s", code, out)
	}
	code, out = runNode("run", "--config", path, "--prefill-pages", "100")
	if code != exitFailed || !strings.Contains(out, "100 pages of 16 tokens") {
		t.Fatalf("flag over file: exit %d; output:\n%s", code, out)
	}
	write(`{"request_timeout": 30000000000}`)
	code, out = runNode("run", "--config", path)
	if code != exitUsage || !strings.Contains(out, `want a string such as "30s"`) {
		t.Fatalf("numeric duration: exit %d; output:\n%s", code, out)
	}
	write(`{"role": "leader", "join": ["127.0.0.1:7946"]}`)
	code, out = runNode("run", "--config", path)
	if code != exitUsage || !strings.Contains(out, `--role "leader" is not a role`) {
		t.Fatalf("role from the file: exit %d; output:\n%s", code, out)
	}
	// A list flag replaces the file's list rather than adding to it.
	write(`{"join": ["127.0.0.1:7946", "nowhere"]}`)
	code, out = runNode("run", "--config", path, "--join", "127.0.0.1:1,elsewhere")
	if code != exitUsage || !strings.Contains(out, `--join "elsewhere"`) {
		t.Fatalf("join from the flag: exit %d; output:\n%s", code, out)
	}
}

func TestGenerateRefusals(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no tenant", []string{"--prompt", "hi"}, "--tenant is required"},
		{"no prompt", []string{"--tenant", "acme"}, "--prompt is required"},
		{"zero tokens", []string{"--tenant", "acme", "--prompt", "hi", "--max-tokens", "0"}, "--max-tokens (0) must be 1 to"},
		{"endpoint", []string{"--tenant", "acme", "--prompt", "hi", "--endpoint", "localhost"}, `--endpoint "localhost"`},
		{"patience", []string{"--tenant", "acme", "--prompt", "hi", "--no-answer-after", "0s"}, "--no-answer-after (0s) must be positive"},
		{"invalid utf-8", []string{"--tenant", "acme", "--prompt", "\xff"}, "prompt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runNode(append([]string{"generate"}, tc.args...)...)
			if code != exitUsage || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want %d with %q; output:\n%s", code, exitUsage, tc.want, out)
			}
		})
	}
}

func TestGenerateNoNode(t *testing.T) {
	// A port that was just free: nothing listens there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	code, out := runNode("generate", "--endpoint", addr, "--tenant", "acme", "--prompt", "hi")
	if code != exitFailed || !strings.Contains(out, "no node reachable at "+addr) {
		t.Fatalf("exit %d, want %d; output:\n%s", code, exitFailed, out)
	}
}

// TestInvariantFailureExitsSeventy delivers an invariant failure to a
// serving node: it is logged, the node is stopped and the command's error
// exits 70.
func TestInvariantFailureExitsSeventy(t *testing.T) {
	cfg := actors.DefaultLocalConfig()
	m := modeltest.Builtin(t, cfg.Model)
	n, err := actors.Start(cfg, actors.Options{Model: m})
	if err != nil {
		t.Fatal(err)
	}
	var log testwait.Buffer
	fatal := make(chan *actors.InvariantError, 1)
	fatal <- &actors.InvariantError{Actor: "nonhost/decode-0/pool", Reason: "page 7 has two owners", Message: "*actors.Grant"}
	err = wait(slog.New(slog.NewTextHandler(&log, nil)), actorsOnly{n}, make(chan os.Signal), fatal, nil)
	var coded exitCoder
	if !errors.As(err, &coded) || coded.exitCode() != exitInvariant || !strings.Contains(err.Error(), "page 7 has two owners") {
		t.Fatalf("error %v, want one that exits %d", err, exitInvariant)
	}
	if !strings.Contains(log.String(), "level=ERROR") || !strings.Contains(log.String(), "page 7 has two owners") {
		t.Errorf("the failure was not logged:\n%s", log.String())
	}
}

// actorsOnly is a node of actors without a cluster, stopped as wait stops a
// cluster node.
type actorsOnly struct{ *actors.Node }

func (a actorsOnly) Stop() error {
	a.Node.Stop()
	return nil
}

// TestDrainedExitsZero: a node whose drain has ended (it left the cluster
// and stopped) makes wait return nil, so run exits 0.
func TestDrainedExitsZero(t *testing.T) {
	var log testwait.Buffer
	drained := make(chan struct{})
	close(drained)
	err := wait(slog.New(slog.NewTextHandler(&log, nil)), stopFunc(func() error {
		t.Error("a drained node was stopped again")
		return nil
	}), make(chan os.Signal), nil, drained)
	if err != nil || !strings.Contains(log.String(), "drained") {
		t.Fatalf("error %v, want nil and the drain logged:\n%s", err, log.String())
	}
}

type stopFunc func() error

func (f stopFunc) Stop() error { return f() }

// TestBinaryHTTPProbes: node run --http serves the probes and metrics in
// plain HTTP at the address its readiness line names.
func TestBinaryHTTPProbes(t *testing.T) {
	p := startProcess(t, "run", "--listen", "127.0.0.1:0", "--gossip", "127.0.0.1:0", "--http", "127.0.0.1:0")
	var httpAddr string
	select {
	case line := <-p.stdout:
		m := regexp.MustCompile(`, http (\S+)\)$`).FindStringSubmatch(line)
		if readyLine.FindStringSubmatch(line) == nil || m == nil {
			t.Fatalf("readiness line %q names no http address; stderr:\n%s", line, p.stderr)
		}
		httpAddr = m[1]
	case <-time.After(readyTimeout):
		t.Fatalf("no readiness line within %s; stderr:\n%s", readyTimeout, p.stderr)
	}
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n"} {
		res, err := http.Get("http://" + httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || string(body) != want {
			t.Fatalf("%s: %d %q", path, res.StatusCode, body)
		}
	}
	res, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(body), `kvwarden_node_info{model="builtin"`) || !strings.Contains(string(body), "kvwarden_kv_usage_ratio{pool=") {
		t.Fatalf("/metrics:\n%s", body)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.exitCode(t, stopTimeout); code != exitOK {
		t.Fatalf("exit %d after SIGTERM; stderr:\n%s", code, p.stderr)
	}
}
