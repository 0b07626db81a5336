package live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/messages"
)

// Bounds of a campaign.
const (
	// RequestsMax bounds Config.Requests: each outcome is kept for the
	// report.
	RequestsMax = 1_000_000
	// ConcurrencyMax bounds Config.Concurrency, in requests in flight.
	ConcurrencyMax = 1024
	// quiescePoll is how often pools are read while they drain.
	quiescePoll = 200 * time.Millisecond
	// probeTokens is what each probe asks for.
	probeTokens = 4
	// probeAttempts bounds the tries of each tenant's probe: a chaos
	// build's in-node faults stay on, and fail a share of requests
	// cleanly however well the cluster recovered.
	probeAttempts = 8
)

// Node is one node of the cluster as the campaign sees it now.
type Node struct {
	Name string // router-0, prefill-1, …: the campaign's name, stable across restarts
	Role string // messages.RolePrefill, …
	// Addr is where peers and clients reach its protoactor remote.
	Addr        string
	Incarnation uint64
}

// Crash is a node that exited without the campaign killing it.
type Crash struct {
	Node   string        `json:"node"`
	Status string        `json:"status"`
	At     time.Duration `json:"-"`
}

// Cluster is what a campaign reads of the cluster it runs against.
type Cluster interface {
	// Nodes are the nodes as of now.
	Nodes() []Node
	// Status asks the node serving at addr for its status, as an
	// operator.
	Status(addr string) (*messages.StatusReply, error)
	// Settle waits, within timeout, until every node serves and sees
	// every other alive.
	Settle(timeout time.Duration) error
	// Crashes are the nodes that exited on their own so far.
	Crashes() []Crash
}

// Generator sends requests of one tenant: a *client.Client.
type Generator interface {
	Generate(ctx context.Context, tenant, prompt string, opt client.GenerateOptions, onToken func(int)) (client.Result, error)
}

// Config is a campaign's settings.
type Config struct {
	// Seed seeds every random choice: the workload and the schedule.
	Seed uint64
	// Requests is how many requests to send; 0 sends until Duration (and
	// at most RequestsMax).
	Requests int
	// Duration bounds the time requests are sent for; 0 sends Requests.
	Duration time.Duration
	// Concurrency is the most requests in flight, 1 to ConcurrencyMax.
	Concurrency int
	// Rate is how many requests to start per second; 0 starts the next
	// as soon as one of Concurrency ends.
	Rate float64
	// Workload shapes the requests, Schedule the faults (none when it
	// lists no kind but Frames).
	Workload WorkloadConfig
	Schedule ScheduleConfig
	// Model is the model the nodes serve, for the references. Required.
	Model *engine.Model
	// SettleTimeout bounds the wait, once the faults end, for every node
	// to serve and see every other; QuiesceTimeout the wait after it for
	// every page to be free. A page not free by then is leaked: it must
	// exceed the nodes' reclaim and owned-page timeouts.
	SettleTimeout, QuiesceTimeout time.Duration
	// DrainTimeout bounds the wait for a drained node's process to exit,
	// with Drain among the kinds: it must exceed what the nodes' drain
	// takes (the moves, the requests that stayed, the nodes' own drain
	// timeout and the leave). A node not gone by then is killed, and its
	// drain is a failed fault.
	DrainTimeout time.Duration
	// FrameFaults is the in-node fault spec the nodes run with, "" for
	// none: it is reported.
	FrameFaults string
}

// Validate reports the first setting out of range, with its value.
func (c Config) Validate() error {
	switch {
	case c.Requests < 0 || c.Requests > RequestsMax:
		return fmt.Errorf("live: requests (%d) must be 0 to %d", c.Requests, RequestsMax)
	case c.Duration < 0:
		return fmt.Errorf("live: duration (%s) must not be negative", c.Duration)
	case c.Requests == 0 && c.Duration == 0:
		return errors.New("live: give a number of requests, a duration or both")
	case c.Concurrency < 1 || c.Concurrency > ConcurrencyMax:
		return fmt.Errorf("live: concurrency (%d) must be 1 to %d", c.Concurrency, ConcurrencyMax)
	case !(c.Rate >= 0) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("live: rate (%g requests/s) must be a finite number, 0 or more", c.Rate)
	case c.SettleTimeout <= 0 || c.QuiesceTimeout <= 0:
		return fmt.Errorf("live: settle (%s) and quiesce (%s) timeouts must be positive", c.SettleTimeout, c.QuiesceTimeout)
	case slices.Contains(c.Schedule.Kinds, Drain) && c.DrainTimeout <= 0:
		return fmt.Errorf("live: the drain timeout (%s) must be positive with drain faults", c.DrainTimeout)
	}
	if err := c.Workload.Validate(); err != nil {
		return err
	}
	if c.Model == nil {
		return errors.New("live: Model is required: the model the nodes serve")
	}
	if ctx := c.Model.Config().ContextTokens; c.Workload.ContextTokens > ctx {
		return fmt.Errorf("live: context window (%d tokens) exceeds the model's (%d)", c.Workload.ContextTokens, ctx)
	}
	if slices.ContainsFunc(c.Schedule.Kinds, Kind.scheduled) {
		return c.Schedule.Validate()
	}
	return nil
}

// Campaign is one run of a workload against a cluster, with faults.
type Campaign struct {
	Config
	// Clients send each tenant's requests, by tenant name.
	Clients  map[string]Generator
	Cluster  Cluster
	Controls Controls
	// Progress receives a progress line while the campaign runs, and a
	// line per fault; nil writes nothing. Live overwrites one line (a
	// terminal) instead of writing one every progressEvery.
	Progress io.Writer
	Live     bool
}

// Run runs the campaign: it sends the workload while the schedule's
// faults are injected, then, once both are over, waits for the cluster
// to settle and its pools to drain, reads every pool, sends each tenant a
// probe, and reports.
func (c *Campaign) Run(ctx context.Context) (*Report, error) {
	if err := c.Config.Validate(); err != nil {
		return nil, err
	}
	w, err := NewWorkload(c.Seed, c.Workload)
	if err != nil {
		return nil, err
	}
	for _, t := range w.Tenants() {
		if c.Clients[t] == nil {
			return nil, fmt.Errorf("live: no client for %s", t)
		}
	}
	sched, err := c.schedule()
	if err != nil {
		return nil, err
	}
	checker := NewChecker(c.Model, w, 1)
	start := time.Now()
	t := newTally(start)
	in := newInjector(c.Controls, c.Cluster, start, c.DrainTimeout, t.event)
	p := startProgress(c.Progress, c.Live, t, in, c.Requests)
	stop, injected := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(injected)
		if sched != nil {
			in.run(ctx, sched, stop)
		}
	}()
	c.send(ctx, w, checker, t, start)
	close(stop)
	<-injected
	p.stop()
	// The references end on their own, interrupted or not: the report of
	// an interrupted campaign checks what it sent.
	if err := checker.Wait(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	faultsEnd := time.Since(start)
	var after afterFaults
	// Interrupted, the campaign reads the pools once and reports at once.
	if ctx.Err() == nil {
		after.settle = c.Cluster.Settle(c.SettleTimeout)
	}
	after.nodes, after.unread = quiesce(ctx, c.Cluster, c.QuiesceTimeout)
	if ctx.Err() == nil {
		after.probes = c.probe(ctx, w, checker, start)
	}
	after.departed = in.Departed()
	return buildReport(c, t, in.Applied(), c.Cluster.Crashes(), after, start, faultsEnd, kindsOf(sched)), nil
}

// schedule is the campaign's schedule, nil when no kind is asked for.
func (c *Campaign) schedule() (*Schedule, error) {
	if !slices.ContainsFunc(c.Schedule.Kinds, Kind.scheduled) {
		return nil, nil
	}
	for _, k := range c.Schedule.Kinds {
		if k.scheduled() && !c.Controls.Can(k) {
			return nil, fmt.Errorf("live: this campaign cannot inject %s faults: they need %s", k, k.Needs())
		}
	}
	var targets []Target
	for _, n := range c.Cluster.Nodes() {
		targets = append(targets, Target{Name: n.Name, Role: n.Role})
	}
	return NewSchedule(c.Seed, c.Schedule, targets)
}

func kindsOf(s *Schedule) []Kind {
	if s == nil {
		return nil
	}
	return s.Kinds()
}

// send sends the workload's requests from Concurrency workers and
// returns when every one sent has ended.
func (c *Campaign) send(ctx context.Context, w *Workload, checker *Checker, t *tally, start time.Time) {
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range c.Concurrency {
		wg.Go(func() {
			for i := range jobs {
				o := c.one(ctx, w.Request(i), start)
				t.add(o, checker.Check(o))
			}
		})
	}
	defer wg.Wait()
	defer close(jobs)
	var end <-chan time.Time
	if c.Duration > 0 {
		timer := time.NewTimer(c.Duration)
		defer timer.Stop()
		end = timer.C
	}
	limit := c.Requests
	if limit == 0 {
		limit = RequestsMax // until Duration, and never more outcomes than the report keeps
	}
	for i := 0; i < limit; i++ {
		if c.Rate > 0 {
			pace := time.NewTimer(time.Until(start.Add(time.Duration(float64(i) / c.Rate * float64(time.Second)))))
			select {
			case <-pace.C:
			case <-end:
				pace.Stop()
				return
			case <-ctx.Done():
				pace.Stop()
				return
			}
		}
		select {
		case jobs <- i:
		case <-end:
			return
		case <-ctx.Done():
			return
		}
	}
}

// one sends r and waits for its end, cancelling it once it has streamed
// r.CancelAfter tokens.
func (c *Campaign) one(ctx context.Context, r Request, start time.Time) Outcome {
	o := Outcome{Request: r, Start: time.Since(start)}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The client calls onToken from Generate's own goroutine.
	onToken := func(tok int) {
		o.Streamed = append(o.Streamed, tok)
		if r.CancelAfter > 0 && len(o.Streamed) == r.CancelAfter {
			o.Cancelled = true
			cancel()
		}
	}
	res, err := c.Clients[r.Tenant].Generate(rctx, r.Tenant, r.Text, client.GenerateOptions{MaxTokens: r.MaxTokens, CacheSalt: r.CacheSalt},
		onToken)
	o.End = time.Since(start)
	if err == nil {
		o.Answer, o.CachedTokens = res.Tokens, res.CachedTokens
	}
	o.Err = withoutNilWireErrors(err)
	return o
}

// withoutNilWireErrors is err without the nil *messages.WireError values
// joined into it: a request cancelled after the node had answered comes
// back as ctx's error joined with the answer's error, which is then a nil
// *messages.WireError whose Error method cannot run.
func withoutNilWireErrors(err error) error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return err
	}
	var kept []error
	for _, e := range j.Unwrap() {
		if we, ok := e.(*messages.WireError); !ok || we != nil {
			kept = append(kept, e)
		}
	}
	return errors.Join(kept...)
}

// afterFaults is what the campaign found once the faults were over.
type afterFaults struct {
	settle   error
	nodes    []NodeFigures
	departed []NodeFigures // killed incarnations, read before, and drained ones, read last
	unread   []string      // nodes whose pools could not be read
	probes   []Probe
}

// quiesce reads every node's pools until every page is free or timeout
// passes, and returns the last figures and the nodes it could not read.
func quiesce(ctx context.Context, c Cluster, timeout time.Duration) ([]NodeFigures, []string) {
	deadline := time.Now().Add(timeout)
	for {
		var figs []NodeFigures
		var unread []string
		leaked := 0
		for _, n := range c.Nodes() {
			s, err := c.Status(n.Addr)
			if err != nil {
				unread = append(unread, fmt.Sprintf("%s: %v", n.Name, err))
				continue
			}
			f := FiguresOf(n.Name, s)
			for _, p := range f.Pools {
				leaked += p.Leaked()
			}
			figs = append(figs, f)
		}
		if (leaked == 0 && len(unread) == 0) || time.Now().After(deadline) || ctx.Err() != nil {
			return figs, unread
		}
		wait(ctx, quiescePoll)
	}
}

// Probe is a tenant's request once the cluster settled: its first prompt,
// tried until it is answered with its reference, at most probeAttempts
// times. Its verdict is the last try's.
type Probe struct {
	Tenant   string  `json:"tenant"`
	Attempts int     `json:"attempts"`
	Verdict  Verdict `json:"verdict"`
	Error    string  `json:"error,omitempty"`
}

// Recovered says whether the probe was answered, with no try wrong.
func (p Probe) Recovered() bool { return p.Verdict.Class == Correct }

func (c *Campaign) probe(ctx context.Context, w *Workload, checker *Checker, start time.Time) []Probe {
	var out []Probe
	for t, name := range w.Tenants() {
		r := Request{Index: -1, Tenant: name, Prompt: 0, Text: w.Prompt(t, 0), MaxTokens: min(probeTokens, c.Workload.MaxTokensMax)}
		p := Probe{Tenant: name}
		for p.Attempts < probeAttempts && ctx.Err() == nil {
			p.Attempts++
			o := c.one(ctx, r, start)
			p.Verdict, p.Error = checker.Check(o), ""
			if o.Err != nil {
				p.Error = o.Err.Error()
			}
			if p.Verdict.Class == Correct || p.Verdict.Class == Wrong {
				break
			}
		}
		out = append(out, p)
	}
	return out
}
