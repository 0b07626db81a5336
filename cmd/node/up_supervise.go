package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// restartPolicy is how node up restarts a node that failed: an exit with
// an error, a signal (kill -9, a crash) or a restart that did not serve.
type restartPolicy struct {
	// RestartsMax is the most restarts of one node within RestartWindow;
	// the node's next failure in the window gives it up, and the others
	// serve on. 0 restarts no node.
	RestartsMax int
	// RestartWindow is how far back a node's restarts count.
	RestartWindow time.Duration
	// RestartBackoff is how long a node waits before its first restart in
	// the window; each further one waits twice as long as the one before,
	// at most RestartWindow.
	RestartBackoff time.Duration
}

// upRestartsMax bounds --restarts-max.
const upRestartsMax = 100

func (p restartPolicy) check() error {
	switch {
	case p.RestartsMax < 0 || p.RestartsMax > upRestartsMax:
		return fmt.Errorf("--restarts-max (%d) must be 0 to %d", p.RestartsMax, upRestartsMax)
	case p.RestartWindow <= 0:
		return fmt.Errorf("--restart-window (%s) must be positive", p.RestartWindow)
	case p.RestartBackoff < 0 || p.RestartBackoff > p.RestartWindow:
		return fmt.Errorf("--restart-backoff (%s) must be 0 to --restart-window (%s)", p.RestartBackoff, p.RestartWindow)
	}
	return nil
}

// backoff is the wait before a restart that follows n others in the
// window: RestartBackoff doubled n times, at most RestartWindow.
func (p restartPolicy) backoff(n int) time.Duration {
	d := p.RestartBackoff
	for range n {
		if d >= p.RestartWindow/2 {
			return p.RestartWindow
		}
		d *= 2
	}
	return d
}

// supervisor keeps a local cluster serving once it has formed: a node
// that fails is started again, as a process supervisor would, with the
// flags it first had (its name, role, credentials and HTTP address; a
// router its address), joining the members that serve, its log appended
// to; a node that exits 0 (drained, or stopped on purpose) stays down.
// One goroutine, run's, owns the cluster's nodes and the supervisor's
// state; the goroutines it starts only wait (for a backoff to pass, a
// restarted node to serve) and report back on due and started.
type supervisor struct {
	c      *localCluster
	out    io.Writer // where restarts and nodes given up are printed
	policy restartPolicy

	restarts map[string][]time.Time // by node name, within the window
	serving  map[*child]bool        // processes that served and have not exited
	waiting  map[string]bool        // nodes in their backoff
	gaveUp   map[string]bool

	due     chan string      // a node whose backoff is over
	started chan startResult // a restarted process served, or failed to
	quit    chan struct{}    // closed when up stops
	wg      sync.WaitGroup
}

// startResult is what a restarted process did: its readiness line, or
// why it did not serve.
type startResult struct {
	ch   *child
	line string
	why  string // empty when it served
}

// newSupervisor supervises c, whose nodes all serve.
func newSupervisor(c *localCluster, out io.Writer) *supervisor {
	s := &supervisor{c: c, out: out, policy: c.o.restartPolicy, restarts: map[string][]time.Time{},
		serving: map[*child]bool{}, waiting: map[string]bool{}, gaveUp: map[string]bool{},
		due: make(chan string), started: make(chan startResult), quit: make(chan struct{})}
	for _, ch := range c.nodes {
		s.serving[ch] = true
	}
	return s
}

// run supervises until a signal (nil) or until no router is left to serve
// (the failure of the last one); the goroutines it started have ended
// when it returns, and the processes it started are in c.nodes.
func (s *supervisor) run(signals <-chan os.Signal) error {
	defer s.wg.Wait()
	defer close(s.quit)
	for {
		var err error
		select {
		case sig := <-signals:
			s.c.log.Info("stopping the local cluster", "signal", sig.String())
			return nil
		case ch := <-s.c.exits:
			err = s.exited(ch)
		case name := <-s.due:
			err = s.restart(name)
		case r := <-s.started:
			err = s.onStarted(r)
		}
		if err != nil {
			return err
		}
	}
}

// exited handles the exit of a process: one that served and exited 0
// stays down; one that failed is restarted. A restarted process that
// never served is reported by its start (onStarted), not here.
func (s *supervisor) exited(ch *child) error {
	if !s.serving[ch] {
		return nil
	}
	delete(s.serving, ch)
	if ch.err != nil {
		return s.failed(ch, "exited ("+exitStatus(ch.err)+")")
	}
	if ch.role == "router" && s.routersLeft() == 0 {
		return ch.failure("exited, the last router")
	}
	s.c.log.Info("node exited 0 (drained, or stopped on purpose) and stays down; the others serve on", "node", ch.name)
	return nil
}

// failed restarts node ch.name after its backoff, or gives it up when it
// has had RestartsMax restarts within the window; with no router left,
// the cluster cannot serve and up stops it.
func (s *supervisor) failed(ch *child, why string) error {
	now := time.Now()
	recent := slices.DeleteFunc(s.restarts[ch.name], func(t time.Time) bool { return now.Sub(t) > s.policy.RestartWindow })
	if len(recent) >= s.policy.RestartsMax {
		s.restarts[ch.name], s.gaveUp[ch.name] = recent, true
		s.c.log.Error("node failed too often: given up; the others serve on", "node", ch.name, "why", why,
			"restarts", len(recent), "within", s.policy.RestartWindow, "log", ch.logPath)
		fmt.Fprintf(s.out, "gave up on %s: it %s after %d restarts within %s; its log is %s\n", ch.name, why, len(recent),
			s.policy.RestartWindow, ch.logPath)
		if s.routersLeft() == 0 {
			return ch.failure(why + ", and no router is left")
		}
		return nil
	}
	delay := s.policy.backoff(len(recent))
	s.restarts[ch.name], s.waiting[ch.name] = append(recent, now), true
	s.c.log.Warn("node failed; restarting it", "node", ch.name, "why", why, "in", delay,
		"restart", fmt.Sprintf("%d of at most %d within %s", len(recent)+1, s.policy.RestartsMax, s.policy.RestartWindow),
		"log", ch.logPath)
	s.wg.Go(func() {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.quit:
			return
		}
		select {
		case s.due <- ch.name:
		case <-s.quit:
		}
	})
	return nil
}

// restart starts node name again, its log appended to, and waits for it
// to serve in another goroutine.
func (s *supervisor) restart(name string) error {
	delete(s.waiting, name)
	i := slices.IndexFunc(s.c.nodes, func(ch *child) bool { return ch.name == name })
	old := s.c.nodes[i]
	argv := slices.Clone(old.argv)
	if join := s.joinAddrs(name); len(join) > 0 {
		// The last --join given is the one node run takes.
		argv = append(argv, "--join", strings.Join(join, ","))
	}
	ch, err := s.c.spawn(&child{name: name, role: old.role, argv: argv, logPath: old.logPath}, os.O_APPEND)
	if err != nil {
		return s.failed(old, err.Error())
	}
	ch.argv = old.argv
	s.c.nodes[i] = ch
	s.wg.Go(func() { s.awaitServing(ch) })
	return nil
}

// joinAddrs are the gossip addresses of the nodes that serve, but name:
// a restarted node joins through them, since the one it first joined
// (router-0's) may be the one that failed.
func (s *supervisor) joinAddrs(name string) []string {
	var out []string
	for _, ch := range s.c.nodes {
		if ch.name != name && s.serving[ch] {
			out = append(out, ch.gossip)
		}
	}
	return out
}

// awaitServing reports on started whether ch printed its readiness line
// within --ready-timeout; one that did not is killed.
func (s *supervisor) awaitServing(ch *child) {
	r := startResult{ch: ch}
	t := time.NewTimer(s.c.o.ReadyTimeout)
	defer t.Stop()
	ready := ch.ready
	for r.line == "" && r.why == "" {
		select {
		case line, ok := <-ready:
			r.line = line
			if !ok {
				ready = nil // stdout closed: its exit follows
			}
		case <-ch.exited:
			r.why = "exited before it served (" + exitStatus(ch.err) + ")"
		case <-t.C:
			r.why = fmt.Sprintf("did not serve within --ready-timeout %s", s.c.o.ReadyTimeout)
			_ = ch.cmd.Process.Kill()
		case <-s.quit:
			return // stop stops it, with every node
		}
	}
	select {
	case s.started <- r:
	case <-s.quit:
	}
}

// onStarted takes a restarted process that served into the cluster, and
// counts one that did not as the node's failure.
func (s *supervisor) onStarted(r startResult) error {
	ch := r.ch
	if r.why == "" {
		if err := ch.parseReady(r.line); err != nil {
			_ = ch.cmd.Process.Signal(syscall.SIGKILL)
			r.why = err.Error()
		}
	}
	if r.why != "" {
		return s.failed(ch, r.why)
	}
	s.serving[ch] = true
	select {
	case <-ch.exited:
		// It exited right after its readiness line, and run may have
		// taken that exit before this start, when it was not serving yet:
		// the exit is handled here, once (exited ignores it after).
		return s.exited(ch)
	default:
	}
	n := len(s.restarts[ch.name])
	s.c.log.Info("restarted", "node", ch.name, "pid", ch.cmd.Process.Pid, "address", ch.addr, "gossip", ch.gossip,
		"http", ch.http, "incarnation", fmt.Sprintf("%016x", ch.incarnation), "restart", n)
	fmt.Fprintf(s.out, "restarted %s (%d of at most %d restarts within %s): pid %d, address %s, gossip %s, http %s, incarnation %016x\n",
		ch.name, n, s.policy.RestartsMax, s.policy.RestartWindow, ch.cmd.Process.Pid, ch.addr, ch.gossip, ch.http, ch.incarnation)
	return nil
}

// routersLeft is how many routers serve, start or wait for their restart.
func (s *supervisor) routersLeft() int {
	n := 0
	for _, ch := range s.c.nodes {
		if ch.role != "router" || s.gaveUp[ch.name] {
			continue
		}
		select {
		case <-ch.exited:
			if s.waiting[ch.name] {
				n++
			}
		default:
			n++
		}
	}
	return n
}
