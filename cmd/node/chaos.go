package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/chaos/live"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// Defaults of "node chaos" that are not live's.
const (
	// chaosRequestTimeout is the nodes' --request-timeout: short, so that
	// a request stranded by a fault ends in seconds.
	chaosRequestTimeout = 20 * time.Second
	// chaosNoAnswerMargin is how much longer a client waits for a node
	// than the node's request timeout before it takes the node for lost.
	chaosNoAnswerMargin = 10 * time.Second
	// chaosFrameFaults are the in-node faults of a chaos build by default.
	chaosFrameFaults = "frame-drop=0.02,frame-dup=0.02,frame-reorder=0.02,frame-corrupt=0.01,frame-misdirect=0.01,ack-drop=0.02"
	// chaosCallTimeout bounds one operator call (status, pressure).
	chaosCallTimeout = 5 * time.Second
	// rogueName names the rogue's certificates.
	rogueName = "rogue"
	// chaosQuiesceMargin is what the quiesce timeout allows beyond the
	// nodes' own reclaim timers.
	chaosQuiesceMargin = 10 * time.Second
)

// chaosNodeArgs are the flags of every node a campaign starts, before
// those after "--" (which override them): timers short enough that a
// request a fault strands fails in seconds, and its pages are reclaimed
// within the quiesce timeout.
func chaosNodeArgs(o chaosOptions) []string {
	return []string{"--prefill-timeout", "5s", "--reclaim-after", chaosReclaimAfter.String(),
		"--request-timeout", o.RequestTimeout.String(), "--owned-page-timeout", chaosOwnedPages(o).String(),
		"--drain-timeout", o.RequestTimeout.String(),
		"--context-tokens", strconv.Itoa(o.Workload.ContextTokens), "--page-tokens", strconv.Itoa(o.PageTokens)}
}

// chaosReclaimAfter is the nodes' --reclaim-after.
const chaosReclaimAfter = 2 * time.Second

// chaosOwnedPages is the nodes' --owned-page-timeout: twice the request
// timeout, which it must exceed.
func chaosOwnedPages(o chaosOptions) time.Duration { return 2 * o.RequestTimeout }

// chaosDrainExit bounds the wait for a drained node's exit
// (live.Config.DrainTimeout): the nodes' --drain-timeout, which is the
// request timeout (a request that could not move has ended by then), as
// much again for the moves before it and the leave after, and a margin.
func chaosDrainExit(o chaosOptions) time.Duration { return 2*o.RequestTimeout + chaosQuiesceMargin }

// chaosOptions are the flags of "node chaos".
type chaosOptions struct {
	live.Config
	Kinds       string
	FrameFaults string
	// Nodes of the cluster the campaign starts.
	Prefill, Decode int
	PageTokens      int
	RequestTimeout  time.Duration
	ReadyTimeout    time.Duration
	StopTimeout     time.Duration
	LogDir          string
	NodeArgs        []string
	// Endpoint, when set, is a running cluster's router: no cluster is
	// started, and creds are the operator's.
	Endpoint string
	creds    credFlags
	Report   string
	Plot     string
	// changed says whether a flag was given.
	changed func(name string) bool
}

func newChaosCmd() *cobra.Command {
	o := chaosOptions{Config: live.Config{Requests: 1000, Concurrency: 8, Workload: live.DefaultWorkloadConfig(),
		Schedule: live.DefaultScheduleConfig(), SettleTimeout: time.Minute},
		Kinds: "all", FrameFaults: chaosFrameFaults, Prefill: 2, Decode: 2, PageTokens: actors.DefaultConfig().PageTokens,
		RequestTimeout: chaosRequestTimeout, ReadyTimeout: time.Minute, StopTimeout: stopTimeout + 5*time.Second}
	cmd := &cobra.Command{
		Use:   "chaos [flags] [-- node run flags]",
		Short: "Run a chaos campaign: a multi-tenant workload under seeded faults, every answer checked",
		Long:  chaosLong,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.NodeArgs, err = nodeArgs(cmd, args); err != nil {
				return err
			}
			o.changed = cmd.Flags().Changed
			// The campaign's nodes serve the built-in model, which the
			// checker computes the references of.
			if o.Model, err = engine.BuiltinModel(actors.DefaultConfig().Model); err != nil {
				return err
			}
			if err := o.check(); err != nil {
				return usageError{err}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return chaos(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), o, replayLine(cmd.Flags(), o))
		},
	}
	o.bind(cmd.Flags())
	return cmd
}

const chaosLong = `chaos runs a campaign: a workload of T tenants whose prompts carry each
tenant's canary ("tenant-3 canary 5f2a: …"), many after a prefix shared by
every tenant (so that prefills hit the prefix cache in their own scope and
miss across scopes), some sent with a cache salt, some oversize (more tokens than
the context window, to be refused with prompt_too_long), some cancelled while
they stream, sent while faults are injected on a schedule drawn from --seed.
Every answer and every streamed token is compared with the reference engine;
errors are classified by their stable code; once the faults are over and the
cluster has settled, every pool is read through node status and every page
must be free; then each tenant's probe must be answered.

By default chaos starts its own cluster, as node up does: a throwaway CA, a
router, --prefill prefill and --decode decode nodes, each a process of this
binary with its log in --log-dir. Faults:

  kill       kill -9 of a node, restarted on the same addresses after the
             window: a new incarnation
  pause      SIGSTOP for the window, then SIGCONT
  latency    delay on every byte to and from a node's remote and data-plane
  bandwidth  a rate limit on them (--bandwidth KiB/s)
  reset      every connection to them that carries a byte is reset
  partition  the node's inbound ports cut off: bytes dropped, and the
             connections across the cut closed when it heals
  pressure   the node holds pages of its pools (a chaos build only)
  rogue      a peer with the cluster CA's certificates forges frames for
             guessed requests and tenants, a request in another tenant's
             name, a routed request, a transfer plan, drains and status
             requests, and a message from a forged sender: each must be
             refused, counted in the node's status, and change no answer
  drain      an operator's drain of a decode node (node drain): it moves
             its running requests to the other decode nodes, KV and all,
             leaves, and must exit 0; it is restarted on the same
             addresses after the window. It needs --decode 2 or more
  frames     in-node faults of a chaos build (go build -tags chaos
             ./cmd/node), on at --frame-faults' rates for the whole
             campaign: frames dropped, duplicated, reordered, corrupted and
             misdirected, acks dropped

Network faults are toxiproxy proxies embedded in this process, in front of
each node's remote and data-plane ports, which the nodes advertise (node run
--advertise, --data-advertise): no privileges needed, unlike network
namespaces, so they run on any CI machine. Toxiproxy is TCP only and cannot
tell sources apart, so a partition is everything inbound to a node, and
gossip (UDP) is not proxied: membership still sees a cut-off node alive.

With --endpoint, chaos targets a running cluster through its router, with an
operator's credentials (--certs, --cert) and, for the tenants and the rogue,
certificates in --certs or its CA key to issue them: only the faults that
need no process control run (pressure, rogue).

Kinds the binary or cluster cannot inject are left out with a note. While it
runs, chaos prints a progress line and each fault to stderr. Then it prints
the summary to stdout, writes --report (JSON) and --plot (PNG), and the line
that replays the campaign: the same --seed gives the same schedule and
workload.

Exit codes: 0 no violation, 1 the campaign could not run, 2 usage error, 3 a
violation (a wrong answer, a cross-tenant byte, a leaked page, a node that
crashed, an attack not refused, a cluster that did not recover), 130
interrupted.`

// bind registers the flags, defaulting to o's values.
func (o *chaosOptions) bind(fs *pflag.FlagSet) {
	w, s := &o.Workload, &o.Schedule
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the workload and the fault schedule (default: drawn, and printed)")
	fs.IntVar(&o.Requests, "requests", o.Requests, "requests to send (0: as many as --duration allows)")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "bound on the time requests are sent for (0: none)")
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "most requests in flight at once")
	fs.Float64Var(&o.Rate, "rate", o.Rate, "requests started per second (0: the next as soon as one ends)")
	fs.IntVar(&w.Tenants, "tenants", w.Tenants, "tenants sending requests, each with its own certificate and canary")
	fs.IntVar(&w.PromptsPerTenant, "prompts-per-tenant", w.PromptsPerTenant, "distinct prompts of each tenant")
	fs.IntVar(&w.PromptBytesMin, "prompt-bytes-min", w.PromptBytesMin, "shortest prompt, in bytes (= tokens)")
	fs.IntVar(&w.PromptBytesMax, "prompt-bytes-max", w.PromptBytesMax, "longest prompt, in bytes (= tokens), oversize ones aside")
	fs.IntVar(&w.MaxTokensMax, "max-tokens", w.MaxTokensMax, "most tokens a request asks to generate (each asks 1 to this)")
	fs.IntVar(&w.ContextTokens, "context-tokens", w.ContextTokens, "the cluster's context window, in tokens (given to the nodes chaos starts)")
	fs.Float64Var(&w.Oversize, "oversize", w.Oversize, "share of requests with an oversize prompt, in [0, 1]")
	fs.Float64Var(&w.Cancel, "cancel", w.Cancel, "share of requests cancelled while they stream, in [0, 1]")
	fs.IntVar(&w.SharedPrefixes, "shared-prefixes", w.SharedPrefixes, "texts every tenant's prompts may start with, before the canary (0: none)")
	fs.IntVar(&w.SharedPrefixBytes, "shared-prefix-bytes", w.SharedPrefixBytes, "length of each shared prefix, in bytes (= tokens)")
	fs.Float64Var(&w.Salted, "salted", w.Salted, "share of requests that send a cache salt, in [0, 1]")
	fs.StringVar(&o.Kinds, "faults", o.Kinds, "fault kinds, comma-separated: kill, pause, latency, bandwidth, reset, partition, pressure, rogue, drain, frames; all; or none")
	fs.DurationVar(&s.Every, "fault-every", s.Every, "mean time between two fault starts")
	fs.DurationVar(&s.LengthMin, "fault-min", s.LengthMin, "shortest fault window")
	fs.DurationVar(&s.LengthMax, "fault-max", s.LengthMax, "longest fault window")
	fs.IntVar(&s.AtOnceMax, "faults-at-once", s.AtOnceMax, "most fault windows overlapping")
	fs.StringSliceVar(&s.Roles, "fault-roles", s.Roles, "roles kill, pause and partition may hit (one node of each role with more is spared)")
	fs.DurationVar(&s.LatencyMax, "latency", s.LatencyMax, "most delay a latency fault adds in each direction (drawn from a quarter of it up)")
	fs.IntVar(&s.BandwidthKiBps, "bandwidth", s.BandwidthKiBps, "rate a bandwidth fault allows in each direction, in KiB/s")
	fs.IntVar(&s.PressurePagesMax, "pressure-pages", s.PressurePagesMax, "most pages of each pool a pressure fault holds")
	fs.StringVar(&o.FrameFaults, "frame-faults", o.FrameFaults, "in-node fault rates of a chaos build (node run --faults without the seed, which chaos draws per node)")
	fs.IntVar(&o.Prefill, "prefill", o.Prefill, "prefill nodes to start")
	fs.IntVar(&o.Decode, "decode", o.Decode, "decode nodes to start")
	fs.IntVar(&o.PageTokens, "page-tokens", o.PageTokens, "tokens per KV page of the nodes (given to the nodes chaos starts)")
	fs.DurationVar(&o.RequestTimeout, "request-timeout", o.RequestTimeout, "the nodes' bound on one request (given to the nodes chaos starts); clients wait 10s more")
	fs.DurationVar(&o.ReadyTimeout, "ready-timeout", o.ReadyTimeout, "bound on the start of the cluster, and of each restart")
	fs.DurationVar(&o.StopTimeout, "stop-timeout", o.StopTimeout, "how long a node may take to stop after SIGTERM before it is killed")
	fs.DurationVar(&o.SettleTimeout, "settle-timeout", o.SettleTimeout, "bound, after the faults, on every node serving and seeing every other")
	fs.DurationVar(&o.QuiesceTimeout, "quiesce-timeout", o.QuiesceTimeout, "bound, after settling, on every page being free; a page not free by then is leaked (default: the nodes' owned-page timeout, 2 × --request-timeout, and 12s)")
	fs.StringVar(&o.LogDir, "log-dir", o.LogDir, "directory for the nodes' logs (default: a new temporary directory)")
	fs.StringVar(&o.Endpoint, "endpoint", o.Endpoint, "host:port of a running cluster's router: start no cluster")
	o.creds.bind(fs, "the only operator-*.crt in --certs")
	fs.StringVar(&o.Report, "report", o.Report, "write the report as JSON to this file")
	fs.StringVar(&o.Plot, "plot", o.Plot, "write a PNG plot of latency and outcome over time, with the fault windows, to this file")
}

// check validates the flags before anything starts.
func (o *chaosOptions) check() error {
	if !o.changed("seed") {
		o.Seed = rand.Uint64()
	}
	if !o.changed("quiesce-timeout") {
		// A page held by an owner a fault took is reclaimed after the
		// nodes' owned-page timeout and reclaim delay.
		o.QuiesceTimeout = chaosOwnedPages(*o) + chaosReclaimAfter + chaosQuiesceMargin
	}
	o.DrainTimeout = chaosDrainExit(*o)
	kinds, err := parseKinds(o.Kinds)
	if err != nil {
		return err
	}
	o.Schedule.Kinds = kinds
	if o.Endpoint != "" {
		if err := checkEndpoint(o.Endpoint); err != nil {
			return err
		}
	} else {
		if err := (upOptions{Prefill: o.Prefill, Decode: o.Decode, Listen: "127.0.0.1:0", ReadyTimeout: o.ReadyTimeout,
			StopTimeout: o.StopTimeout}).check(); err != nil {
			return err
		}
		if o.creds.Dir != "" || o.creds.Insecure {
			return errors.New("--certs and --insecure are for --endpoint: a cluster chaos starts has its own throwaway CA")
		}
	}
	if o.PageTokens < 1 || o.RequestTimeout <= 0 {
		return fmt.Errorf("--page-tokens (%d) and --request-timeout (%s) must be positive", o.PageTokens, o.RequestTimeout)
	}
	if slices.Contains(kinds, live.Frames) {
		if _, err := faults.Parse(o.FrameFaults); err != nil {
			return fmt.Errorf("--frame-faults: %w", err)
		}
	}
	return o.Config.Validate()
}

// parseKinds reads --faults.
func parseKinds(s string) ([]live.Kind, error) {
	switch s {
	case "all":
		return live.AllKinds(), nil
	case "none", "":
		return nil, nil
	}
	var out []live.Kind
	for name := range strings.SplitSeq(s, ",") {
		k, err := live.ParseKind(strings.TrimSpace(name))
		if err != nil {
			return nil, fmt.Errorf("--faults: %w", err)
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

// shellWord matches a word a shell takes as it is.
var shellWord = regexp.MustCompile(`^[A-Za-z0-9_.,:=/+@%-]+$`)

func shellQuote(s string) string {
	if shellWord.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// replayLine is the command line that replays the campaign: its seed and
// every flag given but the outputs.
func replayLine(fs *pflag.FlagSet, o chaosOptions) string {
	args := []string{"node", "chaos", "--seed", fmt.Sprint(o.Seed)}
	fs.Visit(func(f *pflag.Flag) {
		switch f.Name {
		case "seed", "report", "plot", "log-dir":
			return
		}
		v := f.Value.String()
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			v = strings.Join(sv.GetSlice(), ",")
		}
		args = append(args, shellQuote("--"+f.Name+"="+v))
	})
	if len(o.NodeArgs) > 0 {
		args = append(args, "--")
		for _, a := range o.NodeArgs {
			args = append(args, shellQuote(a))
		}
	}
	return strings.Join(args, " ")
}

// violationsError is a campaign that found violations: exit 3.
type violationsError struct{ n int }

func (e violationsError) Error() string {
	return fmt.Sprintf("chaos: the campaign found %d violations (see above)", e.n)
}
func (e violationsError) exitCode() int { return exitViolations }

// chaos runs the campaign o against a cluster it starts or the one at
// o.Endpoint, and writes what it found.
func chaos(ctx context.Context, stdout, stderr io.Writer, o chaosOptions, replay string) error {
	log := slog.New(slog.NewTextHandler(stderr, nil))
	fmt.Fprintf(stderr, "chaos: seed %d\n", o.Seed)
	var env *chaosEnv
	var err error
	if o.Endpoint != "" {
		env, err = remoteEnv(log, o)
	} else {
		env, err = localEnv(ctx, stdout, log, o)
	}
	if err != nil {
		return err
	}
	defer env.close()
	c := &live.Campaign{Config: o.Config, Clients: env.clients, Cluster: env.cluster, Controls: env.controls,
		Progress: stderr, Live: isTerminal(stderr)}
	c.Schedule.Kinds = env.kinds
	c.FrameFaults = env.frameFaults
	r, err := c.Run(ctx)
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	r.Replay, r.Notes = replay, env.notes
	if err := writeOutputs(stdout, r, o); err != nil {
		return err
	}
	switch {
	case ctx.Err() != nil:
		return interruptedError{}
	case !r.Passed():
		return violationsError{len(r.Violations)}
	}
	return nil
}

// writeOutputs prints the summary and writes the report and the plot.
func writeOutputs(stdout io.Writer, r *live.Report, o chaosOptions) error {
	if err := r.WriteSummary(stdout); err != nil {
		return err
	}
	for _, out := range []struct {
		path  string
		write func(io.Writer) error
	}{{o.Report, r.WriteJSON}, {o.Plot, r.WritePlot}} {
		if out.path == "" {
			continue
		}
		f, err := os.Create(out.path)
		if err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
		err = out.write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("chaos: writing %s: %w", out.path, err)
		}
		fmt.Fprintf(stdout, "wrote %s\n", out.path)
	}
	return nil
}

// isTerminal says whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// chaosEnv is what a campaign runs against and with.
type chaosEnv struct {
	cluster     live.Cluster
	controls    live.Controls
	clients     map[string]live.Generator
	kinds       []live.Kind // the kinds asked for that can be injected
	frameFaults string      // the in-node faults the nodes run, "" none
	notes       []string
	closers     []func()
}

// close undoes what the environment set up, last first.
func (e *chaosEnv) close() {
	for _, c := range slices.Backward(e.closers) {
		c()
	}
}

// keep leaves out the kinds asked for that the environment cannot inject,
// with a note for each, and the frames kind (which is not scheduled).
func (e *chaosEnv) keep(asked []live.Kind, why func(live.Kind) string) {
	for _, k := range asked {
		if reason := why(k); reason != "" {
			e.notes = append(e.notes, fmt.Sprintf("no %s faults: %s", k, reason))
			continue
		}
		e.kinds = append(e.kinds, k)
	}
}

// dialTenants makes a client of each tenant at endpoint, with the
// credentials of dir (or issued from its CA).
func (e *chaosEnv) dialTenants(log *slog.Logger, endpoint, dir string, insecure bool, o chaosOptions) error {
	e.clients = map[string]live.Generator{}
	for t := range o.Workload.Tenants {
		name := live.TenantName(t)
		auth, err := chaosAuthority(log, dir, insecure, trust.Identity{Role: trust.RoleTenant, Name: name})
		if err != nil {
			return err
		}
		c, err := client.Dial(endpoint, client.Options{NoAnswerAfter: o.RequestTimeout + chaosNoAnswerMargin, Auth: auth})
		if err != nil {
			return fmt.Errorf("chaos: client of %s: %w", name, err)
		}
		e.closers = append(e.closers, c.Close)
		e.clients[name] = c
	}
	return nil
}

// chaosAuthority is the authority of id: its certificate in dir, or one
// issued in memory from dir's CA when dir holds its key.
func chaosAuthority(log *slog.Logger, dir string, insecure bool, id trust.Identity) (*trust.Authority, error) {
	if insecure {
		return trust.Insecure(log), nil
	}
	b, err := trust.LoadFiles(dir, trust.FileName(id))
	if errors.Is(err, os.ErrNotExist) {
		var ca *trust.CA
		if ca, err = trust.LoadCA(dir); err == nil {
			id.Cluster = ca.Cluster
			b, err = ca.Bundle(id, nil, localValidFor, time.Now(), nil)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("chaos: credentials of %s%s in %s: %w", id.Role, "-"+id.Name, dir, err)
	}
	return trust.New(b, trust.DefaultConfig(), log)
}

// startRogue makes the rogue with certificates from dir's CA.
func (e *chaosEnv) startRogue(log *slog.Logger, dir string, o chaosOptions) error {
	var auths [2]*trust.Authority
	for i, role := range []trust.Role{trust.RoleTenant, trust.RolePrefill} {
		a, err := chaosAuthority(log, dir, false, trust.Identity{Role: role, Name: rogueName})
		if err != nil {
			return err
		}
		auths[i] = a
	}
	tenants := make([]string, o.Workload.Tenants)
	for t := range tenants {
		tenants[t] = live.TenantName(t)
	}
	r, err := live.NewRogue(auths[0], auths[1], o.Model.Config().Geometry(o.PageTokens), tenants)
	if err != nil {
		return err
	}
	e.closers = append(e.closers, r.Close)
	e.controls.Rogue = r
	return nil
}

// pressure is live.Holder through the operator's pressure command.
type pressure struct {
	cc      *controlClient
	cluster live.Cluster
}

func (p pressure) Hold(node string, pages int, d time.Duration) error {
	for _, n := range p.cluster.Nodes() {
		if n.Name == node {
			_, err := p.cc.pressure(n.Addr, pages, d, chaosCallTimeout)
			return err
		}
	}
	return fmt.Errorf("chaos: no node %s", node)
}

// remoteEnv is the environment of a campaign against the running cluster
// at o.Endpoint: no process control and no proxies.
func remoteEnv(log *slog.Logger, o chaosOptions) (*chaosEnv, error) {
	o.creds.Endpoint = o.Endpoint
	auth, err := o.creds.authority(log, trust.RoleOperator, "")
	if err != nil {
		return nil, err
	}
	cc, err := dialControlFor(o.Endpoint, auth)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	e := &chaosEnv{closers: []func(){cc.close}}
	rc := &remoteCluster{cc: cc, endpoint: o.Endpoint}
	e.cluster = rc
	dir := o.creds.dir()
	chaosBuild := rc.allChaos()
	if chaosBuild {
		e.controls.Pressure = pressure{cc: cc, cluster: rc}
	}
	if !o.creds.Insecure {
		if err := e.startRogue(log, dir, o); err != nil {
			e.notes = append(e.notes, "no rogue: "+err.Error())
		}
	}
	e.keep(o.Schedule.Kinds, func(k live.Kind) string {
		switch {
		case k == live.Frames:
			return "a running cluster's in-node faults are its own (node run --faults); its counts are reported"
		case k == live.Pressure && !chaosBuild:
			return "only a chaos build holds pages, and not every node of this cluster is one"
		case !e.controls.Can(k):
			return fmt.Sprintf("they need %s, which a campaign against a running cluster does not have", k.Needs())
		}
		return ""
	})
	if err := e.dialTenants(log, o.Endpoint, dir, o.creds.Insecure, o); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// remoteCluster is a running cluster, seen through its router.
type remoteCluster struct {
	cc       *controlClient
	endpoint string
}

func (r *remoteCluster) Nodes() []live.Node {
	s, err := r.cc.status(r.endpoint, statusPollTimeout)
	if err != nil {
		return nil
	}
	var out []live.Node
	for _, m := range s.Members {
		if m.State == messages.MemberAlive {
			out = append(out, live.Node{Name: m.Name, Role: m.Role, Addr: m.Address, Incarnation: m.Incarnation})
		}
	}
	return out
}

func (r *remoteCluster) Status(addr string) (*messages.StatusReply, error) {
	return r.cc.status(addr, statusPollTimeout)
}

// Settle waits until every node answers its status.
func (r *remoteCluster) Settle(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(upPollInterval)
	defer tick.Stop()
	for {
		err := errors.New("chaos: no node answers at " + r.endpoint)
		for _, n := range r.Nodes() {
			if _, err = r.Status(n.Addr); err != nil {
				break
			}
		}
		if err == nil || time.Now().After(deadline) {
			return err
		}
		<-tick.C
	}
}

// Crashes are none that a campaign could see: it controls no process.
func (r *remoteCluster) Crashes() []live.Crash { return nil }

// allChaos says whether every node that holds pools is a chaos build.
func (r *remoteCluster) allChaos() bool {
	ns := r.Nodes()
	for _, n := range ns {
		if n.Role == messages.RoleRouter {
			continue
		}
		if s, err := r.Status(n.Addr); err != nil || !s.Node.Chaos {
			return false
		}
	}
	return len(ns) > 0
}
