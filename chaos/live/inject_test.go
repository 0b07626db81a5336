package live

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/messages"
)

// fakeProcesses records what the injector does to the nodes. A drain is
// accepted unless refuse is set; its node exits with exit (nil: 0) once
// the cluster's status was read twice during the drain, or, with hang,
// once it is killed.
type fakeProcesses struct {
	cluster *fakeCluster
	refuse  error
	exit    error
	hang    bool

	mu     sync.Mutex
	calls  []string
	killed chan struct{}
}

func (p *fakeProcesses) record(call string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, call)
}

func (p *fakeProcesses) Calls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

func (p *fakeProcesses) Kill(node string) error {
	p.record("kill " + node)
	if p.killed != nil {
		close(p.killed)
	}
	return nil
}

func (p *fakeProcesses) Drain(node string) (<-chan error, error) {
	p.record("drain " + node)
	if p.refuse != nil {
		return nil, p.refuse
	}
	exited := make(chan error, 1)
	go func() {
		if p.hang {
			<-p.killed
			exited <- errors.New("signal: killed")
			return
		}
		<-p.cluster.polled
		if p.exit != nil {
			exited <- p.exit
		}
		close(exited)
	}()
	return exited, nil
}

func (p *fakeProcesses) Restart(node string) error { p.record("restart " + node); return nil }
func (p *fakeProcesses) Pause(node string) error   { p.record("pause " + node); return nil }
func (p *fakeProcesses) Resume(node string) error  { p.record("resume " + node); return nil }

// fakeCluster is one decode node whose status says it moved 1 request
// before the drain and 4 from its first read during the drain on; the
// second read during the drain closes polled.
type fakeCluster struct {
	nodes []Node // nil: decode-0 alone

	mu     sync.Mutex
	reads  int
	polled chan struct{}
}

func (c *fakeCluster) Nodes() []Node {
	if c.nodes != nil {
		return c.nodes
	}
	return []Node{{Name: "decode-0", Role: messages.RoleDecode, Addr: "127.0.0.1:1", Incarnation: 7}}
}

func (c *fakeCluster) Status(string) (*messages.StatusReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	s := &messages.StatusReply{Node: messages.NodeStatus{Name: "decode-0", Role: messages.RoleDecode, Incarnation: 7,
		MovedOut: 1, Draining: c.reads > 1, InFlight: 2}}
	if c.reads > 1 {
		s.Node.MovedOut = 4
	}
	if c.reads == 3 {
		// The first read during the drain has been kept by now.
		close(c.polled)
	}
	return s, nil
}

func (c *fakeCluster) Settle(time.Duration) error { return nil }
func (c *fakeCluster) Crashes() []Crash           { return nil }

// TestInjectDrain: a drain asks the node to drain, waits for its exit
// while reading its status, keeps the last one as the incarnation's last
// figures and what it moved since the drain began, and restarts the node
// whatever became of the drain: an exit other than 0, a node that does
// not exit within the drain timeout (killed) and a drain not accepted are
// failed faults, each saying what happened.
func TestInjectDrain(t *testing.T) {
	for _, tc := range []struct {
		name        string
		p           *fakeProcesses
		interrupted bool
		calls       []string
		want        string // in the fault's error; "" none
		moved       int    // -1: not checked (an interrupted drain's last status is read or not)
	}{
		{"exit 0", &fakeProcesses{}, false, []string{"drain decode-0", "restart decode-0"}, "", 3},
		{"exit 1", &fakeProcesses{exit: errors.New("exit status 1")}, false, []string{"drain decode-0", "restart decode-0"},
			"decode-0 exited after its drain with exit status 1, not 0", 3},
		{"hang", &fakeProcesses{hang: true}, false, []string{"drain decode-0", "kill decode-0", "restart decode-0"},
			"decode-0 had not exited 300ms after its drain (its last status: 2 requests in flight, draining true); killed", 3},
		{"refused", &fakeProcesses{refuse: errors.New("drain of 127.0.0.1:1: timeout")}, false,
			[]string{"drain decode-0", "restart decode-0"}, "drain of 127.0.0.1:1: timeout", 0},
		{"interrupted", &fakeProcesses{hang: true}, true, []string{"drain decode-0", "kill decode-0", "restart decode-0"},
			"the campaign was interrupted before decode-0 exited after its drain; killed", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := &fakeCluster{polled: make(chan struct{})}
			p := tc.p
			p.cluster, p.killed = cl, make(chan struct{})
			in := newInjector(Controls{Processes: p}, cl, time.Now(), 300*time.Millisecond, func(string) {})
			ctx, cancel := context.WithCancel(context.Background())
			if tc.interrupted {
				cancel()
			}
			defer cancel()
			in.apply(ctx, Fault{Seq: 3, Kind: Drain, Target: "decode-0", For: time.Millisecond})
			a := in.Applied()
			if len(a) != 1 {
				t.Fatalf("applied %v", a)
			}
			if got := p.Calls(); !slices.Equal(got, tc.calls) {
				t.Errorf("calls %v, want %v", got, tc.calls)
			}
			if (tc.want == "") != (a[0].Err == "") || !strings.Contains(a[0].Err, tc.want) {
				t.Errorf("error %q, want %q", a[0].Err, tc.want)
			}
			if tc.moved < 0 {
				return
			}
			if a[0].Moved != uint64(tc.moved) {
				t.Errorf("moved %d, want %d", a[0].Moved, tc.moved)
			}
			if d := in.Departed(); tc.moved > 0 && (len(d) != 1 || d[0].MovedOut != 4 || d[0].Incarnation != 7) {
				t.Errorf("departed %+v, want the drained incarnation's last figures", d)
			}
			r := buildReport(&Campaign{Config: Config{Seed: 1, Model: defaultModel(t)}}, newTally(time.Now()), a, nil,
				afterFaults{departed: in.Departed()}, time.Now(), time.Second, []Kind{Drain})
			if wantDrains := map[bool]int{true: 1, false: 0}[tc.want == ""]; r.Drains.Drains != wantDrains ||
				r.Drains.Moved != uint64(tc.moved) || r.Passed() != (tc.want == "") {
				t.Errorf("report: drains %+v, violations %v", r.Drains, r.Violations)
			}
		})
	}
}

// TestInjectorAdmits: a fault that takes a node out waits while it would
// leave no other node of its role in service, whatever the plan said (a
// drain may outlast its window), and starts once one is back; a fault
// that takes no node out, or one of another role, does not wait, nor does
// any once the campaign is interrupted. A drain and a rogue round wait
// for each other.
func TestInjectorAdmits(t *testing.T) {
	cl := &fakeCluster{nodes: []Node{{Name: "router-0", Role: messages.RoleRouter}, {Name: "decode-0", Role: messages.RoleDecode},
		{Name: "decode-1", Role: messages.RoleDecode}, {Name: "decode-2", Role: messages.RoleDecode}}}
	in := newInjector(Controls{}, cl, time.Now(), time.Second, func(string) {})
	ctx := context.Background()
	later := func(f Fault) <-chan struct{} {
		started := make(chan struct{})
		go func() {
			release := in.admit(ctx, f)
			close(started)
			release()
		}()
		return started
	}
	drain0, kill1 := in.admit(ctx, Fault{Kind: Drain, Target: "decode-0"}), in.admit(ctx, Fault{Kind: Kill, Target: "decode-1"})
	pause2, rogue := later(Fault{Kind: Pause, Target: "decode-2"}), later(Fault{Kind: Rogue, Target: "decode-2"})
	in.admit(ctx, Fault{Kind: Latency, Target: "decode-2"})()
	in.admit(ctx, Fault{Kind: Kill, Target: "router-0"})()
	interrupted, cancel := context.WithCancel(ctx)
	cancel()
	in.admit(interrupted, Fault{Kind: Partition, Target: "decode-2"})()
	for what, ch := range map[string]<-chan struct{}{"the pause of decode-2": pause2, "the rogue round": rogue} {
		select {
		case <-ch:
			t.Fatalf("%s started while decode-0 was drained and decode-1 killed", what)
		default:
		}
	}
	kill1()
	select {
	case <-pause2:
	case <-time.After(5 * time.Second):
		t.Fatal("the pause of decode-2 had not started 5s after the kill of decode-1 ended")
	}
	select {
	case <-rogue:
		t.Fatal("the rogue round started while decode-0 was drained")
	default:
	}
	drain0()
	select {
	case <-rogue:
	case <-time.After(5 * time.Second):
		t.Fatal("the rogue round had not started 5s after the drain of decode-0 ended")
	}
	round := in.admit(ctx, Fault{Kind: Rogue, Target: "decode-1"})
	drain := later(Fault{Kind: Drain, Target: "decode-1"})
	select {
	case <-drain:
		t.Fatal("a drain started during a rogue round")
	default:
	}
	round()
	select {
	case <-drain:
	case <-time.After(5 * time.Second):
		t.Fatal("the drain of decode-1 had not started 5s after the rogue round ended")
	}
}
