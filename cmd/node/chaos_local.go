package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/chaos/live"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// chaosAddrs are the addresses of one node of a campaign's cluster: the
// ports it listens on, fixed so that a restart serves at the same ones,
// and the proxies' it advertises ("" without proxies).
type chaosAddrs struct {
	listen, data             string
	advertise, dataAdvertise string
	faults                   string // --faults, "" none
}

// chaosPlan is the addresses of every node, by name.
type chaosPlan map[string]chaosAddrs

// args are a node's flags (localCluster.args): its addresses, its
// proxies', its faults, and join.
func (p chaosPlan) args(name, _, join string) []string {
	a := p[name]
	args := []string{"--listen", a.listen, "--gossip", "127.0.0.1:0"}
	for _, f := range []struct{ flag, v string }{{"--join", join}, {"--data", a.data}, {"--advertise", a.advertise},
		{"--data-advertise", a.dataAdvertise}, {"--faults", a.faults}} {
		if f.v != "" {
			args = append(args, f.flag, f.v)
		}
	}
	return args
}

// runHas says whether this binary's node run has the flag.
func runHas(flag string) bool { return newRunCmd().Flags().Lookup(flag) != nil }

// nodeNames are the names of a cluster's nodes in start order.
func nodeNames(prefill, decode int) []string {
	names := []string{"router-0"}
	for i := range prefill {
		names = append(names, fmt.Sprintf("prefill-%d", i))
	}
	for i := range decode {
		names = append(names, fmt.Sprintf("decode-%d", i))
	}
	return names
}

// plan chooses every node's addresses and, with network, starts its
// proxies; frames is the in-node fault spec, whose seed plan derives from
// the campaign's for each node (a restarted node draws the same faults
// again).
func (e *chaosEnv) plan(o chaosOptions, network *live.Network, frames string) (chaosPlan, error) {
	p := chaosPlan{}
	var ports fixedPorts
	defer ports.release()
	for i, name := range nodeNames(o.Prefill, o.Decode) {
		var a chaosAddrs
		var err error
		if a.listen, err = ports.take("127.0.0.1"); err != nil {
			return nil, err
		}
		decodes := strings.HasPrefix(name, "decode")
		if decodes {
			if a.data, err = ports.take("127.0.0.1"); err != nil {
				return nil, err
			}
		}
		if network != nil {
			if a.advertise, err = network.Proxy(name, "remote", "127.0.0.1:0", a.listen); err != nil {
				return nil, err
			}
			if decodes {
				if a.dataAdvertise, err = network.Proxy(name, "data", "127.0.0.1:0", a.data); err != nil {
					return nil, err
				}
			}
		}
		if frames != "" && i > 0 {
			sp, _ := faults.Parse(frames)
			sp.Seed = o.Seed ^ uint64(i)*0x9e3779b97f4a7c15
			a.faults = sp.String()
		}
		p[name] = a
	}
	return p, nil
}

// localEnv starts the campaign's own cluster: proxies, a throwaway CA,
// the nodes, the tenants' clients and the rogue.
func localEnv(ctx context.Context, stdout io.Writer, log *slog.Logger, o chaosOptions) (env *chaosEnv, err error) {
	e := &chaosEnv{}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	bin, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("chaos: finding this binary to start the nodes: %w", err)
	}
	if o.LogDir == "" {
		if o.LogDir, err = os.MkdirTemp("", "kvwarden-chaos-"); err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
	} else if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: --log-dir: %w", err)
	}
	network := e.network()
	frames := e.frames(o)
	plan, err := e.plan(o, network, frames)
	if err != nil {
		return nil, err
	}
	router := plan["router-0"].listen
	if network != nil {
		router = plan["router-0"].advertise
	}
	dir, err := makeLocalCerts(localCertsDir(router), o.Prefill, o.Decode)
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, func() { os.RemoveAll(dir) })
	log.Info("starting the campaign's cluster", "prefill", o.Prefill, "decode", o.Decode, "logs", o.LogDir, "proxies", network != nil)
	cl, err := e.startCluster(ctx, log, bin, dir, plan, o)
	if err != nil {
		return nil, err
	}
	cl.lc.printNodes(stdout)
	fmt.Fprintln(stdout)
	e.cluster, e.controls.Processes, e.controls.Network = cl, cl, network
	if faults.Available {
		e.controls.Pressure = pressure{cc: cl.cc, cluster: cl}
	}
	if err := e.startRogue(log, dir, o); err != nil {
		return nil, err
	}
	e.keep(o.Schedule.Kinds, func(k live.Kind) string { return localMissing(k, network != nil, frames != "", o.Decode) })
	return e, e.dialTenants(log, router, dir, false, o)
}

// localMissing says why a cluster chaos starts, of decode decode nodes,
// cannot have faults of kind k, "" when it can.
func localMissing(k live.Kind, proxied, frames bool, decode int) string {
	switch {
	case k == live.Drain && decode < 2:
		return fmt.Sprintf("a drained decode node moves its requests to another, and the cluster has %d decode node (--decode 2 or more)", decode)
	case k.Needs() == live.NeedNetwork && !proxied:
		return "this binary's node run has no --advertise, so no proxy can stand in front of the nodes"
	case k == live.Pressure && !faults.Available:
		return "only a chaos build holds pages (go build -tags chaos ./cmd/node)"
	case k == live.Frames && !frames:
		return "frame faults need a chaos build (go build -tags chaos ./cmd/node) whose node run has --faults"
	}
	return ""
}

// network starts the proxies' server when the nodes can advertise them.
func (e *chaosEnv) network() *live.Network {
	if !runHas("advertise") || !runHas("data-advertise") {
		return nil
	}
	n := live.NewNetwork()
	e.closers = append(e.closers, n.Close)
	return n
}

// frames is the in-node fault spec the nodes run, "" when frame faults
// are not asked for or this build has none.
func (e *chaosEnv) frames(o chaosOptions) string {
	if !slices.Contains(o.Schedule.Kinds, live.Frames) || !faults.Available || !runHas("faults") {
		return ""
	}
	e.frameFaults = o.FrameFaults
	return o.FrameFaults
}

// startCluster starts the nodes of plan and waits until they see each
// other; ctx interrupts the start.
func (e *chaosEnv) startCluster(ctx context.Context, log *slog.Logger, bin, dir string, plan chaosPlan,
	o chaosOptions) (*chaosCluster, error) {
	uo := upOptions{Prefill: o.Prefill, Decode: o.Decode, Listen: plan["router-0"].listen, LogDir: o.LogDir,
		ReadyTimeout: o.ReadyTimeout, StopTimeout: o.StopTimeout, NodeArgs: append(chaosNodeArgs(o), o.NodeArgs...)}
	lc := &localCluster{bin: bin, o: uo, creds: credFlags{Dir: dir}, log: log, args: plan.args,
		exits: make(chan *child, 1+o.Prefill+o.Decode)}
	cl := &chaosCluster{lc: lc, start: time.Now(), locks: map[string]*sync.Mutex{}, expected: map[*child]bool{},
		done: make(chan struct{})}
	for _, name := range nodeNames(o.Prefill, o.Decode) {
		cl.locks[name] = &sync.Mutex{}
	}
	e.closers = append(e.closers, cl.stop)
	signals := make(chan os.Signal, 1)
	stopSignals := context.AfterFunc(ctx, func() { signals <- os.Interrupt })
	defer stopSignals()
	if _, err := lc.startAll(signals); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	go cl.watch()
	auth, err := lc.creds.authority(log, trust.RoleOperator, "")
	if err != nil {
		return nil, err
	}
	if cl.cc, err = dialControl("127.0.0.1", auth); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	return cl, nil
}

// chaosCluster is the campaign's cluster of node processes: a
// localCluster whose nodes the campaign kills, restarts, pauses and
// resumes (live.Processes), and whose exits it watches. One operation at
// a time acts on a node.
type chaosCluster struct {
	lc    *localCluster
	cc    *controlClient
	start time.Time
	locks map[string]*sync.Mutex // by node name
	done  chan struct{}          // closed once every node has stopped

	mu       sync.Mutex // lc.nodes and what follows
	expected map[*child]bool
	crashes  []live.Crash
	stopping bool
}

// current is node name's process now, and its index.
func (c *chaosCluster) current(name string) (int, *child, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, ch := range c.lc.nodes {
		if ch.name == name {
			return i, ch, nil
		}
	}
	return 0, nil, fmt.Errorf("chaos: no node %s", name)
}

func (c *chaosCluster) Nodes() []live.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]live.Node, len(c.lc.nodes))
	for i, ch := range c.lc.nodes {
		out[i] = live.Node{Name: ch.name, Role: ch.role, Addr: ch.addr, Incarnation: ch.incarnation}
	}
	return out
}

func (c *chaosCluster) Status(addr string) (*messages.StatusReply, error) {
	return c.cc.status(addr, statusPollTimeout)
}

// Settle waits until every node sees every other alive.
func (c *chaosCluster) Settle(timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lc.waitConverged(time.Now().Add(timeout), nil, nil)
}

func (c *chaosCluster) Crashes() []live.Crash {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.crashes)
}

// signal sends sig to node name's process, holding the node's lock.
func (c *chaosCluster) signal(name string, sig syscall.Signal) (*child, error) {
	_, ch, err := c.current(name)
	if err != nil {
		return nil, err
	}
	if err := ch.cmd.Process.Signal(sig); err != nil {
		return nil, fmt.Errorf("chaos: %s to %s: %w", sig, name, err)
	}
	return ch, nil
}

func (c *chaosCluster) Kill(name string) error {
	c.locks[name].Lock()
	defer c.locks[name].Unlock()
	_, ch, err := c.current(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.expected[ch] = true
	c.mu.Unlock()
	if _, err := c.signal(name, syscall.SIGKILL); err != nil {
		return err
	}
	<-ch.exited
	return nil
}

// Drain asks node name, as an operator, to drain and leave, moving its
// running requests to the other decode nodes (a DrainRequest without
// Stay), and returns once it accepted. Its exit is expected: watch takes
// it for no crash and does not restart it. A node whose drain was not
// accepted (it may drain or not) is killed.
func (c *chaosCluster) Drain(name string) (<-chan error, error) {
	c.locks[name].Lock()
	defer c.locks[name].Unlock()
	_, ch, err := c.current(name)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.expected[ch] = true
	c.mu.Unlock()
	f, err := c.cc.drainFuture(ch.addr, &messages.DrainRequest{}, chaosCallTimeout)
	if err == nil {
		_, err = drainReply(ch.addr, f)
	}
	if err != nil {
		_ = ch.cmd.Process.Kill()
		<-ch.exited
		return nil, fmt.Errorf("chaos: %w (%s was killed)", err, name)
	}
	exited := make(chan error, 1)
	go func() {
		<-ch.exited
		if ch.err != nil {
			exited <- fmt.Errorf("%s (log %s)", exitStatus(ch.err), ch.logPath)
		}
		close(exited)
	}()
	return exited, nil
}

func (c *chaosCluster) Pause(name string) error {
	c.locks[name].Lock()
	defer c.locks[name].Unlock()
	_, err := c.signal(name, syscall.SIGSTOP)
	return err
}

func (c *chaosCluster) Resume(name string) error {
	c.locks[name].Lock()
	defer c.locks[name].Unlock()
	_, err := c.signal(name, syscall.SIGCONT)
	return err
}

// Restart starts node name again with the flags it first had, joining
// every other node's gossip address (the router's may be gone), its log
// appended to, and waits for its readiness line.
func (c *chaosCluster) Restart(name string) error {
	c.locks[name].Lock()
	defer c.locks[name].Unlock()
	i, old, err := c.current(name)
	if err != nil {
		return err
	}
	var join []string
	c.mu.Lock()
	for _, ch := range c.lc.nodes {
		if ch.name != name {
			join = append(join, ch.gossip)
		}
	}
	c.mu.Unlock()
	argv := append(slices.Clone(old.argv), "--join", strings.Join(join, ","))
	ch, err := c.lc.spawn(&child{name: old.name, role: old.role, argv: argv, logPath: old.logPath}, os.O_APPEND)
	if err != nil {
		return err
	}
	ch.argv = old.argv
	if err := c.lc.waitReady([]*child{ch}, time.Now().Add(c.lc.o.ReadyTimeout), nil); err != nil {
		c.mu.Lock()
		c.expected[ch] = true
		c.mu.Unlock()
		_ = ch.cmd.Process.Kill()
		return err
	}
	c.mu.Lock()
	c.lc.nodes[i] = ch
	c.mu.Unlock()
	return nil
}

// watch sees every node's exit: one the campaign did not cause is a
// crash, recorded, and the node is restarted so that the campaign goes on.
func (c *chaosCluster) watch() {
	for {
		select {
		case ch := <-c.lc.exits:
			c.mu.Lock()
			crashed := !c.expected[ch] && !c.stopping
			delete(c.expected, ch)
			if crashed {
				c.crashes = append(c.crashes, live.Crash{Node: ch.name, Status: exitStatus(ch.err) + "; log " + ch.logPath,
					At: time.Since(c.start)})
			}
			c.mu.Unlock()
			if crashed {
				go func() {
					if err := c.Restart(ch.name); err != nil {
						c.lc.log.Error("restarting a node that crashed", "node", ch.name, "err", err)
					}
				}()
			}
		case <-c.done:
			return
		}
	}
}

// stop resumes every node (a stopped process would ignore SIGTERM), stops
// them, router first, and the control client.
func (c *chaosCluster) stop() {
	c.mu.Lock()
	c.stopping = true
	nodes := slices.Clone(c.lc.nodes)
	c.mu.Unlock()
	for _, ch := range nodes {
		_ = ch.cmd.Process.Signal(syscall.SIGCONT)
	}
	if err := c.lc.stop(); err != nil {
		c.lc.log.Warn("stopping the campaign's cluster", "err", err)
	}
	close(c.done)
	if c.cc != nil {
		c.cc.close()
	}
}
