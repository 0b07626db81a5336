package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/internal/stories"
)

// runNode runs the command in process and returns its exit code and
// everything it wrote.
func runNode(args ...string) (int, string) {
	var out bytes.Buffer
	code := run(args, &out, &out)
	return code, out.String()
}

func TestPreflightIncidentInProcess(t *testing.T) {
	code, out := runNode("preflight", "--context-tokens", "1048576", "--kv-pool-tokens", "681280")
	if code != exitFailed {
		t.Fatalf("exit %d, want %d; output:\n%s", code, exitFailed, out)
	}
	for _, want := range []string{"1048576", "681280", "FAIL: pool < context", "--context-tokens 681280"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, out = runNode("preflight", "--context-tokens", "1048576", "--kv-pool-tokens", "2040000")
	if code != exitOK || !strings.Contains(out, "2040000") || !strings.Contains(out, "preflight ok") {
		t.Fatalf("exit %d, want 0 and the pool in the output:\n%s", code, out)
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"zero context", []string{"preflight", "--kv-pool-tokens", "2040000"}, "ContextTokens (0) must be at least 1"},
		{"unknown flag", []string{"preflight", "--context-tokens", "5", "--no-such-flag"}, "unknown flag: --no-such-flag"},
		{"bad flag value", []string{"preflight", "--context-tokens", "lots"}, "lots"},
		{"unknown command", []string{"frobnicate"}, `unknown command or argument "frobnicate"`},
		{"stray argument", []string{"preflight", "extra"}, `"extra"`},
		{"memory fraction", []string{"preflight", "--context-tokens", "5", "--memory-fraction", "1.5"}, "MemoryFraction (1.5) must be in (0, 1]"},
		{"negative weights", []string{"preflight", "--context-tokens", "5", "--weight-bytes", "-1"}, "WeightBytes (-1)"},
		{"dtype", []string{"preflight", "--context-tokens", "5", "--dtype", "int4"}, `unknown dtype "int4"`},
		{"geometry", []string{"preflight", "--context-tokens", "5", "--page-tokens", "0"}, "PageTokens (0)"},
		{"devices", []string{"preflight", "--context-tokens", "5", "--devices", "tpu"}, `device source "tpu"`},
		{"missing config file", []string{"preflight", "--context-tokens", "5", "--config", "/nonexistent/node.json"}, "/nonexistent/node.json"},
		{"model without tokenizer", []string{"run", "--model", "m.bin"}, `--model "m.bin" and --tokenizer "": give a GGUF file alone, a llama2.c checkpoint and its tokenizer, or neither`},
		{"tokenizer without model", []string{"up", "--tokenizer", "t.bin"}, `--model "" and --tokenizer "t.bin": give a GGUF file alone, a llama2.c checkpoint and its tokenizer, or neither`},
		{"geometry and a model", []string{"preflight", "--context-tokens", "5", "--model", "m.bin", "--tokenizer", "t.bin", "--layers", "8"},
			"--layers: the geometry and weights are --model's"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runNode(tc.args...)
			if code != exitUsage || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want %d with %q; output:\n%s", code, exitUsage, tc.want, out)
			}
		})
	}
}

// TestModelFiles: preflight sizes pools from a loaded model's geometry and
// weights; a truncated checkpoint, or another tokenizer, is refused before
// any node starts, with the numbers.
func TestModelFiles(t *testing.T) {
	model, tok := stories.Files(t)
	// stories260K: 5 layers × 4 KV heads × head dim 8, K and V in f32 as
	// run serves them: 1280 bytes a token; its 512-token window unless told.
	code, out := runNode("preflight", "--kv-pool-tokens", "4096", "--model", model, "--tokenizer", tok)
	if code != exitOK || !strings.Contains(out, "layers=5 kv_heads=4 head_dim=8") || !strings.Contains(out, "dtype=f32") ||
		!strings.Contains(out, "hold the 512-token context window") {
		t.Fatalf("exit %d, want 0 with the model's geometry and window:\n%s", code, out)
	}
	code, out = runNode("preflight", "--context-tokens", "4096", "--kv-pool-tokens", "8192", "--model", model, "--tokenizer", tok)
	if code != exitUsage || !strings.Contains(out, "--context-tokens (4096) exceeds stories260K's context window of 512 tokens") {
		t.Fatalf("a window beyond the model's: exit %d, want %d:\n%s", code, exitUsage, out)
	}
	data, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(t.TempDir(), "short.bin")
	if err := os.WriteFile(short, data[:len(data)-4], 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = runNode("up", "--model", short, "--tokenizer", tok, "--prompt", "")
	if code != exitFailed || !strings.Contains(out, strconv.Itoa(len(data)-4)) || !strings.Contains(out, strconv.Itoa(len(data))) ||
		strings.Contains(out, "started") {
		t.Fatalf("a truncated checkpoint: exit %d, want %d naming both sizes before any node starts:\n%s", code, exitFailed, out)
	}
	code, out = runNode("run", "--model", model, "--tokenizer", model)
	if code != exitFailed || !strings.Contains(out, "tokenizer") {
		t.Fatalf("a checkpoint given as the tokenizer: exit %d, want %d:\n%s", code, exitFailed, out)
	}
}

func TestPreflightFailuresOtherThanPoolSize(t *testing.T) {
	// A CPU device with no memory budget cannot be sized from memory.
	code, out := runNode("preflight", "--context-tokens", "4096", "--devices", "cpu")
	if code != exitFailed || !strings.Contains(out, "FAIL: memory unknown") || !strings.Contains(out, "--cpu-memory-bytes") {
		t.Fatalf("exit %d; output:\n%s", code, out)
	}
	// A pool below one page.
	code, out = runNode("preflight", "--context-tokens", "4", "--devices", "cpu", "--kv-pool-tokens", "15")
	if code != exitFailed || !strings.Contains(out, "KVPoolTokens (15) is less than one page of 16 tokens") {
		t.Fatalf("exit %d; output:\n%s", code, out)
	}
	// The same CPU device with a budget: 0.9 × 64 GiB = 57.6 GiB of 2 MiB
	// pages is 29491 pages = 471856 tokens, 3 requests of 131072.
	code, out = runNode("preflight", "--context-tokens", "131072", "--devices", "cpu", "--cpu-memory-bytes", "68719476736")
	if code != exitOK || !strings.Contains(out, "29491") || !strings.Contains(out, "471856") {
		t.Fatalf("exit %d; output:\n%s", code, out)
	}
}

func TestConfigFileAndFlagPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "node.json")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"devices": "cpu", "context_tokens": 1048576, "kv_pool_tokens": 681280, "page_tokens": 64}`)
	code, out := runNode("preflight", "--config", path)
	if code != exitFailed || !strings.Contains(out, "681280") || !strings.Contains(out, "page_tokens=64") {
		t.Fatalf("file alone: exit %d; output:\n%s", code, out)
	}
	// A flag overrides the file; the file's other settings stay.
	code, out = runNode("preflight", "--kv-pool-tokens", "2040000", "--config", path)
	if code != exitOK || !strings.Contains(out, "2040000") || !strings.Contains(out, "page_tokens=64") {
		t.Fatalf("flag over file: exit %d; output:\n%s", code, out)
	}
	// A misspelt key is refused rather than silently defaulted.
	write(`{"context_token": 1048576}`)
	code, out = runNode("preflight", "--config", path)
	if code != exitUsage || !strings.Contains(out, `unknown field "context_token"`) {
		t.Fatalf("unknown key: exit %d; output:\n%s", code, out)
	}
	write(`{"context_tokens": 5} {}`)
	code, out = runNode("preflight", "--config", path, "--kv-pool-tokens", "16")
	if code != exitUsage || !strings.Contains(out, "trailing data") {
		t.Fatalf("trailing data: exit %d; output:\n%s", code, out)
	}
	// A field of preflight's is refused by run, which would ignore it,
	// and run's by preflight; each is named.
	write(`{"layers": 32, "head_dim": 128, "devices": "cpu", "context_tokens": 1024}`)
	code, out = runNode("run", "--config", path)
	if code != exitUsage || !strings.Contains(out, "devices, head_dim, layers: not used by this command") {
		t.Fatalf("preflight's fields given to run: exit %d; output:\n%s", code, out)
	}
	write(`{"queue_max": 8, "context_tokens": 1024, "kv_pool_tokens": 2048}`)
	code, out = runNode("preflight", "--config", path)
	if code != exitUsage || !strings.Contains(out, "queue_max: not used by this command") {
		t.Fatalf("run's field given to preflight: exit %d; output:\n%s", code, out)
	}
}

func TestPreflightMockMachines(t *testing.T) {
	if !haveNVML {
		code, out := runNode("preflight", "--context-tokens", "4096", "--devices", "mock:dgxa100")
		if code != exitFailed || !strings.Contains(out, "-tags nvml") {
			t.Fatalf("without NVML: exit %d; output:\n%s", code, out)
		}
		return
	}
	// 0.9 × 80 GiB − 16 GiB − 4 GiB = 52 GiB = 26624 pages = 425984 tokens:
	// 3 full requests of 131072 tokens on each of 8 H100s.
	code, out := runNode("preflight", "--devices", "mock:dgxh100", "--context-tokens", "131072",
		"--weight-bytes", "17179869184", "--reserve-bytes", "4294967296")
	if code != exitOK || strings.Count(out, "NVIDIA H100 80GB HBM3") != 8 || strings.Count(out, "425984") != 8 {
		t.Fatalf("dgxh100: exit %d; output:\n%s", code, out)
	}
	// 40 GiB A100s cannot hold the incident's 1 M-token window at this
	// geometry: all 8 fail.
	code, out = runNode("preflight", "--devices", "mock:dgxa100", "--context-tokens", "1048576")
	if code != exitFailed || strings.Count(out, "FAIL nvml:") != 8 || !strings.Contains(out, "Mock NVIDIA A100-SXM4-40GB") {
		t.Fatalf("dgxa100: exit %d; output:\n%s", code, out)
	}
}

// TestBinaryPreflight builds the real binary and runs the incident's
// configuration and its fix through it.
func TestBinaryPreflight(t *testing.T) {
	bin := nodeBinary(t)
	tests := []struct {
		poolTokens string
		exit       int
	}{
		{"681280", exitFailed},
		{"2040000", exitOK},
	}
	for _, tc := range tests {
		t.Run(tc.poolTokens, func(t *testing.T) {
			out, err := exec.Command(bin, "preflight", "--context-tokens", "1048576", "--kv-pool-tokens", tc.poolTokens).CombinedOutput()
			code := 0
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				code = exitErr.ExitCode()
			} else if err != nil {
				t.Fatalf("run: %v", err)
			}
			if code != tc.exit {
				t.Fatalf("exit %d, want %d; output:\n%s", code, tc.exit, out)
			}
			for _, want := range []string{"1048576", tc.poolTokens} {
				if !strings.Contains(string(out), want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestUpChecksBeforeStarting: a flag of node up's request that could never
// be sent is refused before any node starts, with the value given.
func TestUpChecksBeforeStarting(t *testing.T) {
	code, out := runNode("up", "--prompt", "x", "--max-tokens", "0")
	if code != exitUsage || !strings.Contains(out, "--max-tokens (0) must be 1 to 32768") || strings.Contains(out, "starting a local cluster") {
		t.Fatalf("up --max-tokens 0: exit %d; output:\n%s", code, out)
	}
}

// TestOperatorCommandsWithoutCredentials: with no credentials anywhere, an
// operator's command at an address where nothing runs says that nothing
// answers there, not that credentials are missing; where a node listens,
// the missing credentials are the news.
func TestOperatorCommandsWithoutCredentials(t *testing.T) {
	t.Setenv(certsEnv, "")
	t.Setenv("TMPDIR", t.TempDir()) // where node up would have left its credentials: nothing
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nothing := freeTCPAddr(t)
	for _, cmd := range []string{"status", "drain", "requests"} {
		code, out := runNode(cmd, "--endpoint", nothing)
		if code != exitFailed || !strings.Contains(out, "no node reachable at "+nothing) || strings.Contains(out, "no credentials") {
			t.Errorf("%s where nothing runs: exit %d, want %d saying nothing answers; output:\n%s", cmd, code, exitFailed, out)
		}
		code, out = runNode(cmd, "--endpoint", ln.Addr().String())
		if code != exitUsage || !strings.Contains(out, "no credentials") {
			t.Errorf("%s where something listens: exit %d, want %d naming the missing credentials; output:\n%s", cmd, code, exitUsage, out)
		}
	}
}

// TestKeysNewForATenantWithAKey: keys new for a tenant that has a key adds
// another, printed once; a --name another key has is refused, saying how
// to name it.
func TestKeysNewForATenantWithAKey(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys.json")
	var keys []string
	for range 2 {
		code, out := runNode("keys", "new", "--file", file, "--tenant", "acme")
		if code != exitOK || !strings.HasPrefix(out, "kvw-") {
			t.Fatalf("keys new: exit %d; output:\n%s", code, out)
		}
		keys = append(keys, strings.TrimSpace(out))
	}
	if keys[0] == keys[1] {
		t.Fatalf("two keys new printed the same key %s", keys[0])
	}
	code, out := runNode("keys", "new", "--file", file, "--tenant", "globex", "--name", "acme")
	if code != exitUsage || !strings.Contains(out, `is named "acme" already`) || !strings.Contains(out, "named after its tenant") {
		t.Fatalf("keys new with a taken --name: exit %d; output:\n%s", code, out)
	}
}
