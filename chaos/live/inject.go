package live

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Processes controls the node processes of a cluster the campaign
// started. Every method acts on the process now serving as the named
// node, and returns once it has acted.
type Processes interface {
	// Kill sends the node SIGKILL and waits for it to exit.
	Kill(node string) error
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
	// last, and a kill's window ends when the node serves again.
	Start, End time.Duration
	// Err says what failed while injecting or healing, "" if nothing.
	Err string
	// Attacks are a rogue round's attacks.
	Attacks []Attack
}

// injector carries a schedule out against the controls.
type injector struct {
	c       Controls
	cluster Cluster
	start   time.Time
	events  func(string) // each fault's start and end, for the progress output

	mu       sync.Mutex
	applied  []Applied
	departed []NodeFigures // read just before each kill
	active   int
	busy     map[string]chan struct{} // closed when the target's last fault is over
}

func newInjector(c Controls, cluster Cluster, start time.Time, events func(string)) *injector {
	return &injector{c: c, cluster: cluster, start: start, events: events, busy: map[string]chan struct{}{}}
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
			in.apply(ctx, f)
		})
	}
}

// activeNow is how many faults are in their window.
func (in *injector) activeNow() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.active
}

// Departed are the figures of the incarnations killed, read just before:
// their counts die with them.
func (in *injector) Departed() []NodeFigures {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]NodeFigures(nil), in.departed...)
}

// lastWords reads the figures of the node named name before it is killed.
func (in *injector) lastWords(name string) {
	for _, n := range in.cluster.Nodes() {
		if n.Name != name {
			continue
		}
		if s, err := in.cluster.Status(n.Addr); err == nil {
			in.mu.Lock()
			in.departed = append(in.departed, FiguresOf(name, s))
			in.mu.Unlock()
		}
	}
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
	}
	return fmt.Errorf("live: %s is not scheduled", f.Kind)
}
