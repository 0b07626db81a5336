package live

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvwarden/kvwarden/messages"
)

// Processes controls the node processes of a cluster the campaign
// started. Every method acts on the process now serving as the named
// node, and returns once it has acted.
type Processes interface {
	// Kill sends the node SIGKILL and waits for it to exit.
	Kill(node string) error
	// Drain asks the node, as an operator, to drain and leave (a
	// messages.DrainRequest without Stay) and returns once it accepted.
	// Its exit is the campaign's, not a crash: exited yields nil once the
	// process has exited 0, or an error that says how it exited
	// otherwise. A node whose drain was not accepted is killed before
	// Drain returns its error, so that a restart finds it gone.
	Drain(node string) (exited <-chan error, err error)
	// Restart starts the node again with the arguments it had, on the
	// same addresses, and waits until it serves: a new incarnation.
	Restart(node string) error
	// Pause sends SIGSTOP; Resume sends SIGCONT.
	Pause(node string) error
	Resume(node string) error
}

// Holder has a node hold pages of its pools: pool pressure.
type Holder interface {
	// Hold has the node hold pages pages for d, then release them.
	Hold(node string, pages int, d time.Duration) error
}

// Controls are what a campaign can do to the cluster: nil for what it
// cannot (a running cluster reached at an endpoint has no processes or
// proxies of the campaign's).
type Controls struct {
	Processes Processes
	Network   *Network
	Pressure  Holder
	Rogue     *RoguePeer
}

// Can says whether the controls can inject k.
func (c Controls) Can(k Kind) bool {
	switch k.Needs() {
	case NeedProcesses:
		return c.Processes != nil
	case NeedNetwork:
		return c.Network != nil
	case NeedPressure:
		return c.Pressure != nil
	case NeedRogue:
		return c.Rogue != nil
	}
	return false
}

// Applied is a fault as it was injected.
type Applied struct {
	Fault
	// Start and End are the window as it was, since the campaign's start:
	// a fault starts late when its target is still recovering from the
	// last, or when it would take the last node of its role in service
	// out (windows outlast their plan: a restart takes what the node's
	// start takes, a drain what its moves take); a kill's or a drain's
	// window ends when the node serves again.
	Start, End time.Duration
	// Err says what failed while injecting or healing, "" if nothing.
	Err string
	// Attacks are a rogue round's attacks.
	Attacks []Attack
	// Moved is how many running requests a drained node moved to other
	// decode nodes, by the last status it answered before it left.
	Moved uint64
}

// DrainExitError is a drained node whose process exited otherwise than
// with 0.
type DrainExitError struct {
	Node string
	// Exit says how it exited.
	Exit error
}

func (e *DrainExitError) Error() string {
	return fmt.Sprintf("live: %s exited after its drain with %v, not 0", e.Node, e.Exit)
}

func (e *DrainExitError) Unwrap() error { return e.Exit }

// DrainHungError is a drained node whose process had not exited within
// the campaign's DrainTimeout; it was killed.
type DrainHungError struct {
	Node    string
	Timeout time.Duration
	// Status says whether a status was read during the drain; InFlight
	// and Draining are the last one's.
	Status   bool
	InFlight uint32
	Draining bool
}

func (e *DrainHungError) Error() string {
	last := "no status answered during the drain"
	if e.Status {
		last = fmt.Sprintf("its last status: %d requests in flight, draining %t", e.InFlight, e.Draining)
	}
	return fmt.Sprintf("live: %s had not exited %s after its drain (%s); killed", e.Node, e.Timeout, last)
}

// injector carries a schedule out against the controls.
type injector struct {
	c       Controls
	cluster Cluster
	start   time.Time
	events  func(string) // each fault's start and end, for the progress output
	// drainTimeout bounds the wait for a drained node's exit.
	drainTimeout time.Duration

	mu       sync.Mutex
	applied  []Applied
	departed []NodeFigures // read just before each kill, and last during each drain
	active   int
	busy     map[string]chan struct{} // closed when the target's last fault is over
	down     map[string]int           // disruptive faults admitted and not over, by their target's role
	underWay map[Kind]int             // faults admitted and not over, by kind
	changed  chan struct{}            // closed, and replaced, when a fault admitted is over
}

func newInjector(c Controls, cluster Cluster, start time.Time, drainTimeout time.Duration, events func(string)) *injector {
	return &injector{c: c, cluster: cluster, start: start, events: events, drainTimeout: drainTimeout,
		busy: map[string]chan struct{}{}, down: map[string]int{}, underWay: map[Kind]int{},
		changed: make(chan struct{})}
}

// run draws faults from s and injects each at its time until stop is
// closed, then waits for the faults under way to end. ctx cancels the
// windows under way (each is healed at once).
func (in *injector) run(ctx context.Context, s *Schedule, stop <-chan struct{}) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		f := s.Next()
		t := time.NewTimer(time.Until(in.start.Add(f.At)))
		select {
		case <-stop:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		in.mu.Lock()
		prev := in.busy[f.Target]
		done := make(chan struct{})
		in.busy[f.Target] = done
		in.mu.Unlock()
		wg.Go(func() {
			defer close(done)
			if prev != nil {
				<-prev
			}
			release := in.admit(ctx, f)
			defer release()
			in.apply(ctx, f)
		})
	}
}

// admit waits until f may start, and counts it under way until the
// returned func is called:
//   - a fault that takes its target out of service waits while that would
//     leave no node of the target's role in service (of a role with more
//     than one node). The schedule spares a node by the planned windows;
//     the windows as they are may outlast them (a restart takes what the
//     node's start takes, a drain what its moves take).
//   - a drain and a rogue round wait for each other: the rogue sends every
//     node a forged drain, and takes a node that drains for one that
//     carried it out.
//
// An interrupted campaign waits no more: its windows heal at once.
func (in *injector) admit(ctx context.Context, f Fault) (release func()) {
	n, _ := in.node(f.Target)
	role, count := n.Role, 0
	for _, n := range in.cluster.Nodes() {
		if n.Role == role {
			count++
		}
	}
	for {
		in.mu.Lock()
		if in.mayStart(f, role, count) {
			in.underWay[f.Kind]++
			if f.Kind.disrupts() {
				in.down[role]++
			}
			in.mu.Unlock()
			return func() {
				in.mu.Lock()
				defer in.mu.Unlock()
				in.underWay[f.Kind]--
				if f.Kind.disrupts() {
					in.down[role]--
				}
				close(in.changed)
				in.changed = make(chan struct{})
			}
		}
		changed := in.changed
		in.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return func() {}
		}
	}
}

// mayStart says whether f, on a node of role of which the cluster has
// count, may start now (see admit). in.mu is held.
func (in *injector) mayStart(f Fault, role string, count int) bool {
	if f.Kind.disrupts() && in.down[role] >= max(count-1, 1) {
		return false
	}
	switch f.Kind {
	case Drain:
		return in.underWay[Rogue] == 0
	case Rogue:
		return in.underWay[Drain] == 0
	}
	return true
}

// activeNow is how many faults are in their window.
func (in *injector) activeNow() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.active
}

// Departed are the figures of the incarnations killed, read just before,
// and drained, read last before they left: their counts die with them.
func (in *injector) Departed() []NodeFigures {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]NodeFigures(nil), in.departed...)
}

// lastWords reads the figures of the node named name before it is killed.
func (in *injector) lastWords(name string) {
	if n, ok := in.node(name); ok {
		if s, err := in.cluster.Status(n.Addr); err == nil {
			in.depart(name, s)
		}
	}
}

// depart keeps s as the last figures of node name's incarnation.
func (in *injector) depart(name string, s *messages.StatusReply) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.departed = append(in.departed, FiguresOf(name, s))
}

// node is the node named name as of now.
func (in *injector) node(name string) (Node, bool) {
	for _, n := range in.cluster.Nodes() {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

// Applied are the faults injected so far, in the order they ended.
func (in *injector) Applied() []Applied {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]Applied(nil), in.applied...)
}

func (in *injector) since() time.Duration { return time.Since(in.start) }

// apply injects f, waits out its window and heals it.
func (in *injector) apply(ctx context.Context, f Fault) {
	a := Applied{Fault: f, Start: in.since()}
	in.mu.Lock()
	in.active++
	in.mu.Unlock()
	in.events(fmt.Sprintf("fault %s: start", f))
	err := in.inject(ctx, f, &a)
	a.End = in.since()
	if err != nil {
		a.Err = err.Error()
		in.events(fmt.Sprintf("fault #%d %s %s: %v", f.Seq, f.Kind, f.Target, err))
	} else {
		in.events(fmt.Sprintf("fault #%d %s %s: healed after %s", f.Seq, f.Kind, f.Target, (a.End - a.Start).Round(time.Millisecond)))
	}
	in.mu.Lock()
	in.active--
	in.applied = append(in.applied, a)
	in.mu.Unlock()
}

// wait waits out a window of d, or until ctx is done.
func wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (in *injector) inject(ctx context.Context, f Fault, a *Applied) error {
	if !in.c.Can(f.Kind) {
		return fmt.Errorf("live: this campaign cannot inject %s faults: they need %s", f.Kind, f.Kind.Needs())
	}
	p := in.c.Processes
	switch f.Kind {
	case Kill:
		in.lastWords(f.Target)
		if err := p.Kill(f.Target); err != nil {
			return err
		}
		wait(ctx, f.For)
		return p.Restart(f.Target)
	case Pause:
		if err := p.Pause(f.Target); err != nil {
			return err
		}
		wait(ctx, f.For)
		return p.Resume(f.Target)
	case Latency, Bandwidth, Reset, Partition:
		heal, err := in.c.Network.Apply(f)
		if err != nil {
			return err
		}
		wait(ctx, f.For)
		return heal()
	case Pressure:
		if err := in.c.Pressure.Hold(f.Target, f.Pages, f.For); err != nil {
			return err
		}
		wait(ctx, f.For)
		return nil
	case Rogue:
		var err error
		a.Attacks, err = in.c.Rogue.Round(ctx, in.cluster, f)
		return err
	case Drain:
		return in.drain(ctx, f, a)
	}
	return fmt.Errorf("live: %s is not scheduled", f.Kind)
}

// drainPoll is how often a draining node's status is read, to keep the
// last one before it leaves.
const drainPoll = 100 * time.Millisecond

// drain drains f's target and waits for its process to exit, reading its
// status meanwhile: the last one read is its incarnation's last figures,
// and says how many requests it moved. The node stays away until the
// window's end (or its exit, when the drain outlasts the window) and is
// then restarted, whatever became of the drain. A node that does not exit
// within the campaign's DrainTimeout is killed, and is a failed fault, as
// is one that exits otherwise than with 0.
func (in *injector) drain(ctx context.Context, f Fault, a *Applied) error {
	p := in.c.Processes
	start := time.Now()
	n, ok := in.node(f.Target)
	if !ok {
		return fmt.Errorf("live: no node %s to drain", f.Target)
	}
	var movedBefore uint64
	if s, err := in.cluster.Status(n.Addr); err == nil {
		movedBefore = s.Node.MovedOut
	}
	exited, err := p.Drain(f.Target)
	if err == nil {
		var last *messages.StatusReply
		last, err = in.awaitExit(ctx, f.Target, n.Addr, exited)
		if last != nil {
			in.depart(f.Target, last)
			a.Moved = last.Node.MovedOut - min(movedBefore, last.Node.MovedOut)
		}
		if err == nil {
			in.events(fmt.Sprintf("fault #%d drain %s: exited 0 after %s; %d requests moved by its last status", f.Seq, f.Target,
				time.Since(start).Round(time.Millisecond), a.Moved))
		}
	}
	wait(ctx, f.For-time.Since(start))
	return errors.Join(err, p.Restart(f.Target))
}

// awaitExit waits for the exit of the drained node name serving at addr,
// at most the campaign's DrainTimeout, while reading its status every
// drainPoll, and returns the last status answered. A node that has not
// exited by then, or by the campaign's end, is killed. A status request
// still under way when the node exits is not waited for: its node is gone.
func (in *injector) awaitExit(ctx context.Context, name, addr string, exited <-chan error) (*messages.StatusReply, error) {
	var mu sync.Mutex
	var last *messages.StatusReply
	stop := make(chan struct{})
	go func() {
		tick := time.NewTicker(drainPoll)
		defer tick.Stop()
		for {
			if s, err := in.cluster.Status(addr); err == nil {
				mu.Lock()
				last = s
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	lastRead := func() *messages.StatusReply {
		close(stop)
		mu.Lock()
		defer mu.Unlock()
		return last
	}
	deadline := time.NewTimer(in.drainTimeout)
	defer deadline.Stop()
	select {
	case err := <-exited:
		s := lastRead()
		if err != nil {
			return s, &DrainExitError{Node: name, Exit: err}
		}
		return s, nil
	case <-deadline.C:
		s := lastRead()
		hung := &DrainHungError{Node: name, Timeout: in.drainTimeout, Status: s != nil}
		if s != nil {
			hung.InFlight, hung.Draining = s.Node.InFlight, s.Node.Draining
		}
		return s, errors.Join(hung, in.c.Processes.Kill(name))
	case <-ctx.Done():
		// The campaign was interrupted: its windows heal at once.
		return lastRead(), errors.Join(fmt.Errorf("live: the campaign was interrupted before %s exited after its drain; killed: %w",
			name, ctx.Err()), in.c.Processes.Kill(name))
	}
}
