package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvwarden/kvwarden/internal/boundedread"
)

// Bounds of "node up --detach" and "node down".
const (
	// upTableBytesMax bounds what a detached up hands its starter: the
	// table of at most upNodesMax + upRoutersMax nodes and a few lines.
	upTableBytesMax = 64 << 10
	// pidFileBytesMax bounds the read of a pid file: two numbers.
	pidFileBytesMax = 48
	// downPollInterval is how often down looks whether up has exited.
	downPollInterval = 50 * time.Millisecond
)

// upPIDFile is where the up whose router-0 serves on listen writes its
// pid, beside the credentials directory it makes for that address, so
// that node down finds it from the same address.
func upPIDFile(listen string) string { return localCertsDir(listen) + ".pid" }

// errNoUp is the answer when no node up runs at an address.
var errNoUp = errors.New("no node up runs there")

// upRun names one run of node up: its pid and, where the system says, the
// time its process started, so that a pid the kernel has since given to
// another process (another up, of another cluster) is not taken for it.
type upRun struct {
	pid   int
	start uint64 // clock ticks after boot; 0 when unknown
}

// running says whether the run is a live node up process.
func (r upRun) running() bool {
	return processIsUp(r.pid) && (r.start == 0 || processStart(r.pid) == r.start)
}

// claimPID records this process as the up of the cluster at listen; one
// that runs there already is an error that names its pid, before
// anything of it (its credentials, its ports) is touched. The file is made
// by a hard link, which fails if another up made it first, so two ups
// started at once cannot both claim the address. release removes the
// record if it is still this process's.
func claimPID(listen string) (release func(), err error) {
	path := upPIDFile(listen)
	self := upRun{pid: os.Getpid(), start: processStart(os.Getpid())}
	f, err := os.CreateTemp(filepath.Dir(path), ".kvwarden-up-pid-")
	if err != nil {
		return nil, fmt.Errorf("up: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = fmt.Fprintln(f, self.pid, self.start)
	if err = errors.Join(err, f.Close()); err != nil {
		return nil, fmt.Errorf("up: writing its pid: %w", err)
	}
	for try := 0; ; try++ {
		err := os.Link(f.Name(), path)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) || try > 0 {
			return nil, fmt.Errorf("up: writing its pid: %w", err)
		}
		run, rerr := runningUp(path)
		switch {
		case rerr == nil:
			return nil, fmt.Errorf("up: node up (pid %d) runs the cluster at %s already; node down --listen %s stops it", run.pid,
				listen, listen)
		case !errors.Is(rerr, errNoUp):
			return nil, fmt.Errorf("up: %w", rerr)
		}
		// A run that has ended left its record: take its place.
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("up: %w", err)
		}
	}
	return func() {
		if run, err := readPID(path); err == nil && run == self {
			os.Remove(path)
		}
	}, nil
}

// runningUp is the run of node up that the pid file at path names, while
// it runs; errNoUp when there is none (no file, or its process has
// ended). A file node up did not write is an error.
func runningUp(path string) (upRun, error) {
	run, err := readPID(path)
	if err != nil {
		return upRun{}, err
	}
	if !run.running() {
		return upRun{}, errNoUp
	}
	return run, nil
}

// readPID reads the pid file at path: a regular file of this user's, not
// open to others, holding a pid and its process's start.
func readPID(path string) (upRun, error) {
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return upRun{}, errNoUp
	}
	if err != nil {
		return upRun{}, err
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 || !ok ||
		int(sys.Uid) != os.Getuid() {
		return upRun{}, fmt.Errorf("%s is not a pid file node up of this user wrote (mode %s); remove it", path, st.Mode())
	}
	data, err := boundedread.File(path, pidFileBytesMax)
	if err != nil {
		return upRun{}, err
	}
	var run upRun
	if n, err := fmt.Sscan(string(data), &run.pid, &run.start); n != 2 || err != nil || run.pid <= 0 {
		return upRun{}, fmt.Errorf("%s holds %q, not a pid and its start", path, data)
	}
	return run, nil
}

// detach starts this up again in the background, in a session of its own
// (no terminal's signal reaches it) with its output in up.log in its log
// directory, and returns once the cluster serves, having printed the
// table the background up handed over on a pipe; or, if the background up
// ends first, its exit and the end of up.log. A signal meanwhile stops it.
func detach(cmd *cobra.Command, o upOptions, stdout io.Writer, signals <-chan os.Signal) error {
	if o.LogDir == "" {
		var err error
		if o.LogDir, err = os.MkdirTemp("", "kvwarden-up-"); err != nil {
			return fmt.Errorf("up: %w", err)
		}
	} else if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
		return fmt.Errorf("up: --log-dir: %w", err)
	}
	logPath := filepath.Join(o.LogDir, "up.log")
	child, table, err := startDetached(cmd, o, logPath)
	if err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	// The background up bounds its own start; this bound is for one that
	// hangs past it.
	deadline := time.NewTimer(o.ReadyTimeout + 2*o.StopTimeout)
	defer deadline.Stop()
	select {
	case t := <-table:
		if strings.Contains(t, "\nstop:") {
			fmt.Fprint(stdout, t)
			return nil
		}
		select {
		case err = <-exited:
		case <-deadline.C:
		}
		return fmt.Errorf("up: the background up ended before the cluster served (%s); the end of its log %s:\n%s",
			exitStatus(err), logPath, tail(logPath))
	case <-signals:
	case <-deadline.C:
		err = fmt.Errorf("up: the background up did not serve within %s; stopped; its log is %s", o.ReadyTimeout+2*o.StopTimeout, logPath)
	}
	_ = child.Process.Signal(syscall.SIGTERM)
	<-exited
	return err
}

// startDetached starts the background up of detach; table receives what
// it writes on the pipe up to its close.
func startDetached(cmd *cobra.Command, o upOptions, logPath string) (*exec.Cmd, <-chan string, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("up: %w", err)
	}
	defer logFile.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("up: %w", err)
	}
	defer w.Close()
	path, name, err := selfExecutable()
	if err != nil {
		return nil, nil, fmt.Errorf("up: finding this binary: %w", err)
	}
	args := []string{"up"}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if f.Name != "detach" && f.Name != "log-dir" {
			args = append(args, "--"+f.Name+"="+f.Value.String())
		}
	})
	// The pipe is the child's first extra file: descriptor 3.
	args = append(append(args, "--log-dir="+o.LogDir, "--ready-fd=3", "--"), o.NodeArgs...)
	child := exec.Command(path, args...)
	child.Args[0] = name
	child.Stdout, child.Stderr, child.ExtraFiles = logFile, logFile, []*os.File{w}
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		r.Close()
		return nil, nil, fmt.Errorf("up: starting it in the background: %w", err)
	}
	table := make(chan string, 1)
	go func() {
		defer r.Close()
		b, _ := io.ReadAll(io.LimitReader(r, upTableBytesMax))
		table <- string(b)
	}()
	return child, table, nil
}

func newDownCmd() *cobra.Command {
	listen, timeout := defaultEndpoint, 2*(stopTimeout+10*time.Second)
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop the local cluster node up runs",
		Long: `down stops the local cluster that "node up" runs with its router on --listen,
in the foreground or started with --detach: it finds up's pid where up wrote
it (a file beside up's credentials for that address), sends it SIGTERM,
which stops the nodes, the routers first, and waits until up has exited.

Exit codes: 0 stopped, 1 no node up runs at --listen or it did not exit
within --timeout, 2 usage error.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkListen("--listen", listen); err != nil {
				return usageError{err}
			}
			if timeout <= 0 {
				return usageError{fmt.Errorf("--timeout (%s) must be positive", timeout)}
			}
			return down(cmd.OutOrStdout(), listen, timeout)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", listen, "the address node up's router-0 serves on (up's --listen)")
	cmd.Flags().DurationVar(&timeout, "timeout", timeout, "how long to wait for up to stop its nodes and exit")
	return cmd
}

// down stops the up at listen and waits for it to exit, at most timeout.
func down(stdout io.Writer, listen string, timeout time.Duration) error {
	path := upPIDFile(listen)
	run, err := runningUp(path)
	if errors.Is(err, errNoUp) {
		return fmt.Errorf("down: no node up runs a cluster at %s (none has its pid in %s)", listen, path)
	}
	if err != nil {
		return fmt.Errorf("down: %w", err)
	}
	pid := run.pid
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("down: SIGTERM to node up, pid %d: %w", pid, err)
	}
	tick := time.NewTicker(downPollInterval)
	defer tick.Stop()
	deadline := time.Now().Add(timeout)
	for run.running() {
		if time.Now().After(deadline) {
			return fmt.Errorf("down: node up, pid %d, still runs %s after SIGTERM; its nodes' logs are in its --log-dir", pid, timeout)
		}
		<-tick.C
	}
	fmt.Fprintf(stdout, "stopped node up (pid %d) and its cluster at %s\n", pid, listen)
	return nil
}
