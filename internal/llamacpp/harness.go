package llamacpp

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvwarden/kvwarden/internal/boundedread"
)

// EnvDir names the environment variable that, when set, is the
// tools/llamacpp folder to use, instead of the one found upward from the
// working directory.
const EnvDir = "KVWARDEN_LLAMACPP"

// InstallCommand installs what Find looks for, from the repository root.
const InstallCommand = "bash tools/llamacpp/install.sh"

// Limits a Harness applies when its own fields are zero.
const (
	// DefaultTimeout bounds a call whose context has no deadline; a call
	// on stories260K takes about a second, on a 7B model minutes.
	DefaultTimeout = 2 * time.Minute
	// DefaultOutputMax bounds a reply on stdout, in bytes: a forced reply
	// of 4096 positions with the top 8 tokens is about 1.4 MiB.
	DefaultOutputMax = 64 << 20
	// stderrMax is how much of the end of node's stderr an error keeps.
	stderrMax = 16 << 10
	// waitDelay is how long, after node is killed or exits, a call waits
	// for its pipes to close before it stops reading them.
	waitDelay = 2 * time.Second
	// packageJSONMax bounds the package.json files Find reads.
	packageJSONMax = 1 << 20
)

// The tools/llamacpp folder's layout.
const (
	toolsDir  = "tools/llamacpp"
	script    = "run.mjs"
	moduleDir = "node_modules/node-llama-cpp"
)

// Harness runs llama.cpp through tools/llamacpp/run.mjs. Find makes one.
type Harness struct {
	// Node is the node executable.
	Node string
	// Dir is the tools/llamacpp folder: run.mjs and its node_modules.
	Dir string
	// Timeout bounds a call whose context has no deadline; zero means
	// DefaultTimeout.
	Timeout time.Duration
	// OutputMax bounds the bytes of one reply; zero means
	// DefaultOutputMax.
	OutputMax int64
}

// NotInstalledError is a missing or unusable installation of node or of
// tools/llamacpp; its message says how to install it.
type NotInstalledError struct {
	// Missing says what was not there, and where it was looked for.
	Missing string
}

func (e *NotInstalledError) Error() string {
	return fmt.Sprintf("llama.cpp is not installed for kvwarden: %s; install it with `%s` "+
		"from the repository root, or set %s to a tools/llamacpp folder where it ran",
		e.Missing, InstallCommand, EnvDir)
}

// Find locates the installation: the folder named by $KVWARDEN_LLAMACPP,
// else the first tools/llamacpp with node_modules/node-llama-cpp in the
// working directory or a folder above it; node-llama-cpp there at the
// version its package.json pins; and node on PATH.
func Find() (*Harness, error) {
	dir, err := findDir()
	if err != nil {
		return nil, err
	}
	if err := checkInstalled(dir); err != nil {
		return nil, err
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, &NotInstalledError{Missing: "node (Node.js >= 20) is not on PATH"}
	}
	return &Harness{Node: node, Dir: dir}, nil
}

func findDir() (string, error) {
	if dir := os.Getenv(EnvDir); dir != "" {
		return filepath.Abs(dir)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, toolsDir, moduleDir)); err == nil {
			return filepath.Join(d, toolsDir), nil
		}
		if filepath.Dir(d) == d {
			return "", &NotInstalledError{Missing: fmt.Sprintf(
				"%s is in no folder from %s up, and %s is not set", filepath.Join(toolsDir, moduleDir), wd, EnvDir)}
		}
	}
}

// checkInstalled checks that dir has run.mjs and node-llama-cpp at the
// version dir/package.json pins: a stale node_modules would answer for
// another llama.cpp.
func checkInstalled(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, script)); err != nil {
		return &NotInstalledError{Missing: fmt.Sprintf("%s has no %s (%v)", dir, script, err)}
	}
	var pins struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	var installed struct {
		Version string `json:"version"`
	}
	if err := readJSON(filepath.Join(dir, "package.json"), &pins); err != nil {
		return &NotInstalledError{Missing: err.Error()}
	}
	if err := readJSON(filepath.Join(dir, moduleDir, "package.json"), &installed); err != nil {
		return &NotInstalledError{Missing: err.Error()}
	}
	if want := pins.Dependencies["node-llama-cpp"]; installed.Version != want {
		return &NotInstalledError{Missing: fmt.Sprintf("%s has node-llama-cpp %q where package.json pins %q",
			filepath.Join(dir, "node_modules"), installed.Version, want)}
	}
	return nil
}

func readJSON(path string, v any) error {
	data, err := boundedread.File(path, packageJSONMax)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// RunError is run.mjs failing: exit status 2 for a request it refused
// (its message says which field and why), 1 for llama.cpp failing.
type RunError struct {
	Command  string // tokenize, greedy, ...
	What     string // what the call asked, for the message
	ExitCode int    // -1 when a signal ended it
	Status   string // "exit status 2", "signal: killed"
	Stderr   string // the end of run.mjs's stderr
}

func (e *RunError) Error() string {
	return fmt.Sprintf("llama.cpp %s (%s): run.mjs failed (%s): %s", e.Command, e.What, e.Status, e.Stderr)
}

// TimeoutError is a call that outlived its deadline: node was killed.
type TimeoutError struct {
	Command string
	What    string
	Waited  time.Duration
	Stderr  string // the end of run.mjs's stderr up to then
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("llama.cpp %s (%s): waited %s for run.mjs to reply, then killed it; its stderr: %q",
		e.Command, e.What, e.Waited.Round(time.Millisecond), e.Stderr)
}

// Unwrap makes errors.Is(err, context.DeadlineExceeded) hold.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// OutputTooLargeError is a reply over Harness.OutputMax: node was killed
// once it had written more.
type OutputTooLargeError struct {
	Command string
	What    string
	Limit   int64
}

func (e *OutputTooLargeError) Error() string {
	return fmt.Sprintf("llama.cpp %s (%s): the reply is larger than %d bytes; node was stopped", e.Command, e.What, e.Limit)
}

// ReplyError is a reply that is not what the command returns: run.mjs and
// this package disagree.
type ReplyError struct {
	Command string
	What    string
	Err     error
}

func (e *ReplyError) Error() string {
	return fmt.Sprintf("llama.cpp %s (%s): unexpected reply from run.mjs: %v", e.Command, e.What, e.Err)
}

func (e *ReplyError) Unwrap() error { return e.Err }

// call runs `node run.mjs command` with req as JSON on stdin and decodes
// its stdout into reply, strictly: a field this package does not know is
// an error, so that run.mjs and the types here cannot drift apart
// unseen. what describes the request for error messages.
func (h *Harness) call(ctx context.Context, command, what string, req, reply any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cmp.Or(h.Timeout, DefaultTimeout))
		defer cancel()
	}
	// run is ctx, also cancelled when the reply outgrows its bound, so that
	// node is killed rather than left blocked on a full pipe.
	run, stop := context.WithCancel(ctx)
	defer stop()
	stdout := &capped{max: cmp.Or(h.OutputMax, DefaultOutputMax), stop: stop}
	stderr := &tail{max: stderrMax}
	cmd := exec.CommandContext(run, h.Node, filepath.Join(h.Dir, script), command)
	cmd.Dir = h.Dir
	cmd.Stdin = bytes.NewReader(body)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = waitDelay
	started := time.Now()
	err = cmd.Run()
	if stdout.over {
		return &OutputTooLargeError{Command: command, What: what, Limit: stdout.max}
	}
	if err != nil {
		var exit *exec.ExitError
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			return &TimeoutError{Command: command, What: what, Waited: time.Since(started), Stderr: stderr.String()}
		case ctx.Err() != nil:
			return fmt.Errorf("llama.cpp %s (%s): %w", command, what, ctx.Err())
		case errors.As(err, &exit):
			return &RunError{Command: command, What: what, ExitCode: exit.ExitCode(), Status: exit.String(), Stderr: stderr.String()}
		default:
			return fmt.Errorf("llama.cpp %s (%s): %w", command, what, err)
		}
	}
	dec := json.NewDecoder(&stdout.buf)
	dec.DisallowUnknownFields()
	if err := dec.Decode(reply); err != nil {
		return &ReplyError{Command: command, What: what, Err: err}
	}
	return nil
}

// capped keeps what is written up to max bytes; past that it drops the
// rest and calls stop, once.
type capped struct {
	buf  bytes.Buffer
	max  int64
	over bool
	stop func()
}

func (c *capped) Write(p []byte) (int, error) {
	if !c.over && int64(c.buf.Len()+len(p)) > c.max {
		c.over = true
		c.stop()
	}
	if !c.over {
		c.buf.Write(p)
	}
	return len(p), nil
}

// tail keeps the last max bytes written: an error's cause is at the end.
type tail struct {
	buf []byte
	max int
	cut bool
}

func (t *tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.cut = true
	}
	return len(p), nil
}

func (t *tail) String() string {
	s := strings.TrimSpace(string(t.buf))
	if t.cut {
		s = "…" + s
	}
	return s
}
