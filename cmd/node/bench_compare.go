package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kvwarden/kvwarden/bench"
	"github.com/kvwarden/kvwarden/trust"
)

// layoutReadyTimeout bounds the start of one layout --compare brings up.
const layoutReadyTimeout = 2 * time.Minute

// compareLayouts brings up, one after the other, N nodes of role all and
// every split of N into prefill and decode nodes, each behind one router,
// runs the workload against each and adds each split's goodput ratio over
// the colocated layout to rep.
func compareLayouts(ctx context.Context, stderr io.Writer, o benchOptions, w *workload, rep *benchReport) error {
	layouts := []bench.Layout{{All: o.Compare}}
	for p := 1; p < o.Compare; p++ {
		layouts = append(layouts, bench.Layout{Prefill: p, Decode: o.Compare - p})
	}
	// The nodes are this binary's children: they read GOMAXPROCS as they
	// start, and every node gets the same processors.
	old, had := os.LookupEnv("GOMAXPROCS")
	os.Setenv("GOMAXPROCS", strconv.Itoa(o.NodeProcs))
	defer func() {
		if had {
			os.Setenv("GOMAXPROCS", old)
		} else {
			os.Unsetenv("GOMAXPROCS")
		}
	}()
	for _, l := range layouts {
		if err := benchLayout(ctx, stderr, o, w, l, rep); err != nil {
			return err
		}
	}
	rep.Ratios = goodputRatios(rep, layouts)
	return nil
}

// goodputRatios are each split's goodput over the first layout's (the
// colocated one), run by run.
func goodputRatios(rep *benchReport, layouts []bench.Layout) []benchRatio {
	base := map[float64]float64{}
	over := layouts[0].String()
	for _, r := range rep.Runs {
		if r.Layout == over {
			base[r.RatePerS] = r.Summary.GoodputPerS
		}
	}
	var out []benchRatio
	for _, r := range rep.Runs {
		if b := base[r.RatePerS]; r.Layout != over && b > 0 {
			out = append(out, benchRatio{Layout: r.Layout, Over: over, RatePerS: r.RatePerS, Goodput: r.Summary.GoodputPerS / b})
		}
	}
	return out
}

// benchLayout brings layout up, runs the workload against its router and
// stops it.
func benchLayout(ctx context.Context, stderr io.Writer, o benchOptions, w *workload, l bench.Layout, rep *benchReport) error {
	fmt.Fprintf(stderr, "bringing up %s behind a router\n", l)
	c, stop, err := startLayout(o, l)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := o.dial(ctx, log, w, c.routerAddrs(), c.creds)
	if err == nil {
		err = runAll(ctx, stderr, o, w, s, l.String(), rep)
		s.close()
	}
	return stop(err)
}

// startLayout starts a router and layout's nodes as this binary's
// children, the way node up does, with their logs and throwaway
// credentials in a new temporary directory. stop stops them and removes
// the directory, or, when the layout failed (err), keeps it and says
// where.
func startLayout(o benchOptions, l bench.Layout) (c *localCluster, stop func(err error) error, err error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("bench: finding this binary to start the nodes: %w", err)
	}
	dir, err := os.MkdirTemp("", "kvwarden-bench-")
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	logFile, err := os.Create(filepath.Join(dir, "up.log"))
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	uo := upOptions{Prefill: l.Prefill, Decode: l.Decode, Routers: 1, Listen: "127.0.0.1:0", LogDir: dir,
		ReadyTimeout: layoutReadyTimeout, StopTimeout: stopTimeout + 5*time.Second, NodeArgs: o.NodeArgs, Insecure: o.creds.Insecure}
	c = &localCluster{bin: bin, o: uo, log: slog.New(slog.NewTextHandler(logFile, nil)), exits: make(chan *child, l.Nodes()+1)}
	c.args = c.upArgs
	c.creds.Insecure = o.creds.Insecure
	stop = func(err error) error {
		if stopErr := c.stop(); err == nil {
			err = stopErr
		}
		logFile.Close()
		if err != nil {
			return fmt.Errorf("%w (the nodes' logs are in %s)", err, dir)
		}
		return os.RemoveAll(dir)
	}
	if !o.creds.Insecure {
		if c.creds.Dir, err = makeLocalCerts(filepath.Join(dir, "certs"), l.Prefill, l.Decode); err == nil {
			err = issueLocalAll(c.creds.Dir, l.All)
		}
	}
	if err == nil && l.All == 0 {
		_, err = c.startAll(nil)
	} else if err == nil {
		err = c.startColocated(l.All)
	}
	if err != nil {
		return nil, nil, stop(err)
	}
	return c, stop, nil
}

// issueLocalAll adds the certificates of n nodes of role all ("all-0" …)
// to the credentials makeLocalCerts made in dir.
func issueLocalAll(dir string, n int) error {
	if n == 0 {
		return nil
	}
	ca, err := trust.LoadCA(dir)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	for i := range n {
		id := trust.Identity{Cluster: ca.Cluster, Role: trust.RoleAll, Name: strconv.Itoa(i)}
		if err := issue(io.Discard, dir, ca, id, []string{"127.0.0.1"}, localValidFor); err != nil {
			return err
		}
	}
	return nil
}

// startColocated starts router-0 and n nodes of role all joining it, as
// startAll does for prefill and decode nodes, and waits until every node
// sees every other alive.
func (c *localCluster) startColocated(n int) error {
	deadline := time.Now().Add(c.o.ReadyTimeout)
	router, err := c.start("router-0", "router", c.args("router-0", "router", ""))
	if err != nil {
		return err
	}
	if err := c.waitReady([]*child{router}, deadline, nil); err != nil {
		return err
	}
	var nodes []*child
	for i := range n {
		name := fmt.Sprintf("%s-%d", roleAll, i)
		ch, err := c.start(name, roleAll, c.args(name, roleAll, router.gossip))
		if err != nil {
			return err
		}
		nodes = append(nodes, ch)
	}
	if err := c.waitReady(nodes, deadline, nil); err != nil {
		return err
	}
	return c.waitConverged(deadline, nil, c.exits)
}
