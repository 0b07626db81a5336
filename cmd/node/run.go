package main

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/gpu"
)

// defaultEndpoint is where "node run" listens and "node generate" dials
// unless told otherwise, so that the two work together with no flags.
const defaultEndpoint = "127.0.0.1:7070"

// roleAll is a node that runs its own prefill and decode workers and admits
// requests itself: the only role until cluster mode.
const roleAll = "all"

// clusterRoles are the roles of a cluster node, refused until cluster mode
// exists rather than silently served as "all".
var clusterRoles = []string{"prefill", "decode", "router"}

// stopTimeout bounds how long the node may take to stop; past it the
// process exits anyway, since an exit also stops it.
const stopTimeout = 10 * time.Second

func newRunCmd() *cobra.Command {
	cfg := defaultNodeConfig()
	cfg.ContextTokens = int64(actors.DefaultConfig().ContextTokens)
	var configPath *string
	logLevel := slog.LevelInfo
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Serve generation on this node's own prefill and decode workers",
		Long: `run starts one node: its prefill and decode workers, each with its own KV pool,
and the admission actor, reachable at --listen. Before it serves it checks that
the context window it advertises fits every pool (the check preflight makes for
devices) and refuses to start otherwise. When it serves it prints one line to
stdout, "serving on <address> (incarnation <hex>)", then logs to stderr until
SIGINT or SIGTERM, upon which it stops the node and exits 0.

Exit codes: 0 stopped by a signal, 1 refused or failed to start, 2 usage
error, 70 an actor broke an invariant (the node must not serve on).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.load(cmd.Flags(), *configPath); err != nil {
				return usageError{err}
			}
			ac, err := cfg.serving()
			if err != nil {
				return usageError{err}
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: logLevel}))
			if err := preflightPools(log, ac); err != nil {
				return err
			}
			// Registered before the node starts, so that a signal that
			// arrives while it starts still stops it cleanly.
			signals := make(chan os.Signal, 1)
			signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(signals)
			return serve(cmd.OutOrStdout(), log, ac, cfg.Listen, signals)
		},
	}
	configPath = configFlag(cmd)
	cfg.bindServeFlags(cmd.Flags())
	cmd.Flags().TextVar(&logLevel, "log-level", logLevel, "least level logged to stderr: debug, info, warn or error")
	return cmd
}

// bindServeFlags registers the flags of "node run", defaulting to c's
// values.
func (c *nodeConfig) bindServeFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Role, "role", c.Role, "what the node serves: all (its own prefill and decode workers); prefill, decode and router come with cluster mode")
	fs.StringVar(&c.Listen, "listen", c.Listen, "host:port to serve on (port 0 picks a free port)")
	fs.Int64Var(&c.ContextTokens, "context-tokens", c.ContextTokens, "context window the node advertises, in tokens: prompt plus generated tokens")
	fs.IntVar(&c.PageTokens, "page-tokens", c.PageTokens, "tokens per KV page")
	fs.IntVar(&c.PrefillWorkers, "prefill-workers", c.PrefillWorkers, "prefill workers, each with its own pool")
	fs.IntVar(&c.DecodeWorkers, "decode-workers", c.DecodeWorkers, "decode workers, each with its own pool")
	fs.IntVar(&c.PrefillPages, "prefill-pages", c.PrefillPages, "KV pages of each prefill worker's pool")
	fs.IntVar(&c.DecodePages, "decode-pages", c.DecodePages, "KV pages of each decode worker's pool")
	fs.IntVar(&c.MaxTokensMax, "max-tokens-max", c.MaxTokensMax, "most tokens one request may ask to generate")
	fs.IntVar(&c.QueueMax, "queue-max", c.QueueMax, "most requests in flight at once; one more is answered busy")
	fs.IntVar(&c.BatchMax, "batch-max", c.BatchMax, "most decode sequences a worker steps at once")
	fs.DurationVar((*time.Duration)(&c.RequestTimeout), "request-timeout", time.Duration(c.RequestTimeout), "bound on one request from admission to its last token")
	fs.DurationVar((*time.Duration)(&c.ReclaimAfter), "reclaim-after", time.Duration(c.ReclaimAfter), "how long a released page waits for its lease holders before it is reclaimed anyway")
}

// serving validates c's serving settings and turns them into the actors
// package's configuration; settings without a flag keep
// actors.DefaultConfig's values.
func (c nodeConfig) serving() (actors.Config, error) {
	a := actors.DefaultConfig()
	if err := checkRole(c.Role); err != nil {
		return a, err
	}
	if err := checkListen(c.Listen); err != nil {
		return a, err
	}
	a.PageTokens = c.PageTokens
	// Capped so that the conversion cannot wrap where int is 32 bits; a
	// window that large exceeds every model's and is refused by Validate.
	a.ContextTokens = int(min(c.ContextTokens, math.MaxInt32))
	a.PrefillWorkers, a.DecodeWorkers = c.PrefillWorkers, c.DecodeWorkers
	a.PrefillPages, a.DecodePages = c.PrefillPages, c.DecodePages
	a.MaxTokensMax, a.QueueMax, a.BatchMax = c.MaxTokensMax, c.QueueMax, c.BatchMax
	a.RequestTimeout, a.ReclaimAfter = time.Duration(c.RequestTimeout), time.Duration(c.ReclaimAfter)
	return a, a.Validate()
}

func checkRole(role string) error {
	if role == roleAll {
		return nil
	}
	if slices.Contains(clusterRoles, role) {
		return fmt.Errorf("--role %s is a cluster role and cluster mode is not available yet; "+
			"use --role all (this node's own prefill and decode workers)", role)
	}
	return fmt.Errorf("--role %q is not a role: want all (prefill, decode and router come with cluster mode)", role)
}

// checkListen refuses a malformed address before anything starts; whether
// it can be listened on is found out by starting.
func checkListen(listen string) error {
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", listen, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("--listen %q: port %q must be 0 to 65535", listen, port)
	}
	return nil
}

// preflightPools is preflight for the node's own pools: every worker's pool
// must hold one request of the advertised context window. Each pool is a
// configured pool (gpu.SizingConfig.KVPoolTokens) of pages × page tokens,
// so gpu.Preflight makes the same check it makes for a device.
func preflightPools(log *slog.Logger, cfg actors.Config) error {
	for _, p := range []struct {
		role      string
		workers   int
		pages     int
		pagesFlag string
		what      string
	}{
		{"prefill", cfg.PrefillWorkers, cfg.PrefillPages, "--prefill-pages", "each prefill worker's pool"},
		{"decode", cfg.DecodeWorkers, cfg.DecodePages, "--decode-pages", "each decode worker's pool"},
	} {
		pc := gpu.PreflightConfig{ContextTokens: int64(cfg.ContextTokens), Sizing: gpu.SizingConfig{
			Geometry: cfg.Geometry(), MemoryFraction: 1, KVPoolTokens: int64(p.pages) * int64(cfg.PageTokens)}}
		r := gpu.Preflight(gpu.CPUDevice(0), pc)
		if r.Err != nil {
			return &poolTooSmallError{Pool: p.what, Pages: p.pages, PageTokens: cfg.PageTokens,
				ContextTokens: cfg.ContextTokens, NeedPages: r.ContextPages, PagesFlag: p.pagesFlag, Err: r.Err}
		}
		log.Info("preflight ok", "pool", p.role, "workers", p.workers, "pool_pages", r.Pool.Pages,
			"pool_tokens", r.Pool.Tokens, "context_tokens", r.ContextTokens, "full_context_requests", r.FullContextRequests)
	}
	return nil
}

// poolTooSmallError is a node pool that cannot hold one request of the
// context window the node would advertise; Err is gpu.Preflight's verdict.
type poolTooSmallError struct {
	Pool              string
	Pages, PageTokens int
	ContextTokens     int
	NeedPages         int64
	PagesFlag         string
	Err               error
}

func (e *poolTooSmallError) Error() string {
	return fmt.Sprintf("run: %s holds %d tokens (%d pages of %d tokens) but the advertised context window is %d tokens, "+
		"so a full-context prompt cannot fit and the node must not start; fix with flags: --context-tokens %d, or %s %d",
		e.Pool, e.Pages*e.PageTokens, e.Pages, e.PageTokens, e.ContextTokens, e.Pages*e.PageTokens, e.PagesFlag, e.NeedPages)
}

func (e *poolTooSmallError) Unwrap() error { return e.Err }

// serve starts the node, prints the readiness line and waits.
func serve(stdout io.Writer, log *slog.Logger, cfg actors.Config, listen string, signals <-chan os.Signal) error {
	n, err := actors.Start(cfg, actors.Options{Listen: listen, Log: log})
	if err != nil {
		return fmt.Errorf("run: starting the node on %s: %w", listen, err)
	}
	fmt.Fprintf(stdout, "serving on %s (incarnation %016x)\n", n.Address(), n.Config().Incarnation)
	log.Info("serving", "address", n.Address(), "context_tokens", cfg.ContextTokens, "page_tokens", cfg.PageTokens,
		"prefill_workers", cfg.PrefillWorkers, "decode_workers", cfg.DecodeWorkers, "queue_max", cfg.QueueMax)
	return wait(log, n, signals, n.Fatal())
}

// wait serves until a signal (stop the node, nil) or a broken invariant
// (stop the node, invariantError) arrives. fatal is n.Fatal(), a parameter
// so that a test can deliver an invariant failure.
func wait(log *slog.Logger, n *actors.Node, signals <-chan os.Signal, fatal <-chan *actors.InvariantError) error {
	select {
	case sig := <-signals:
		log.Info("stopping the node", "signal", sig.String())
		if err := stopWithin(n, stopTimeout); err != nil {
			return err
		}
		log.Info("node stopped")
		return nil
	case e := <-fatal:
		log.Error("an actor broke an invariant; the node must not serve on", "actor", e.Actor,
			"reason", fmt.Sprint(e.Reason), "message", e.Message)
		if err := stopWithin(n, stopTimeout); err != nil {
			log.Error("stopping after the invariant failure", "err", err)
		}
		return invariantError{e}
	}
}

// stopWithin stops n, or gives up after d: exiting the process stops the
// node as well, so a stuck shutdown must not keep it alive.
func stopWithin(n *actors.Node, d time.Duration) error {
	done := make(chan struct{})
	go func() {
		n.Stop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("run: the node did not stop within %s", d)
	}
}

// invariantError is an actor's broken invariant: the process exits 70
// (EX_SOFTWARE) so that a supervisor sees a bug, not a refusal.
type invariantError struct{ err *actors.InvariantError }

func (e invariantError) Error() string { return e.err.Error() }
func (e invariantError) Unwrap() error { return e.err }
func (e invariantError) exitCode() int { return exitInvariant }
