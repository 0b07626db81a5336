package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/cluster"
	"github.com/kvwarden/kvwarden/cluster/dataplane"
	"github.com/kvwarden/kvwarden/cluster/membership"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/gpu"
	"github.com/kvwarden/kvwarden/httpapi"
	"github.com/kvwarden/kvwarden/tenancy"
	"github.com/kvwarden/kvwarden/trust"
)

// defaultEndpoint is where "node run" listens and "node generate" dials
// unless told otherwise, so that the two work together with no flags.
const defaultEndpoint = "127.0.0.1:7070"

// roleAll is a node that runs its own prefill and decode workers and admits
// requests itself: with no --join it serves alone.
const roleAll = "all"

// stopTimeout bounds how long the node may take to stop; past it the
// process exits anyway, since an exit also stops it. A graceful stop is a
// gossip leave (cluster.NodeConfig.LeaveTimeout) and protoactor's graceful
// remote shutdown, which alone waits up to 10 s for endpoint writers still
// retrying connections to peers that have gone.
const stopTimeout = 30 * time.Second

func newRunCmd() *cobra.Command {
	cmd, _ := newRunCommand()
	return cmd
}

// newRunCommand is "node run" and the settings its flags fill in, for a
// caller that checks a run's flags without running it (checkRunArgs).
func newRunCommand() (*cobra.Command, *runSettings) {
	cfg := defaultNodeConfig()
	cfg.ContextTokens = int64(actors.DefaultConfig().ContextTokens)
	cfg.DType = actors.DefaultConfig().Model.KVDType.String()
	var configPath *string
	var creds credFlags
	logLevel := slog.LevelInfo
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Serve one node: alone (--role all) or as a member of a cluster",
		Long: `run starts one node of the role --role and serves it on --listen:

  all      its own prefill and decode workers, each with its own KV pool, and
           the admission actor; with no --join it serves alone.
  prefill  prefill workers: computes prompts' KV and sends it to decode nodes.
  decode   decode workers and admission: takes requests (from a router or a
           client), has a prefill node compute the prompt's KV, receives it
           on its data plane (--data) and generates.
  router   no workers and no pages: admits client requests and routes each
           to decode and prefill nodes by their gossiped free pages less
           what it has outstanding there, and sends a busy answer on to
           another decode node before the client hears it.

Every node gossips membership on --gossip and joins the cluster through any
member's gossip address given to --join. Before it serves it checks that the
context window it advertises fits every pool its role holds (the check
preflight makes for devices) and refuses to start otherwise. When it serves
it prints one line to stdout,
"serving on <address> (incarnation <hex>, role <role>, gossip <address>,
as <identity>)" (or "INSECURE: nobody authenticated" in place of the identity,
", FAULTS <spec>" after it when it injects faults, and ", http <address>" when
--http serves the probes /healthz and /readyz, the Prometheus metrics
/metrics and, with --api-keys on a router or a node of role all, the
OpenAI-compatible API under /v1; ", https <address>" with --http-tls-cert and
--http-tls-key), then logs to stderr.
<address> is the one peers reach it at: --advertise, or --listen's.

--advertise and --data-advertise put a proxy in front of the node: peers
reach it there, and the proxy forwards to --listen and --data. --faults
injects faults into what the node sends (a chaos tester's run, never a
production one): frames dropped, duplicated, reordered, corrupted and sent to
the wrong request, and acknowledgements dropped, each with its probability,
all drawn from one seed, e.g. seed=7,frame-drop=0.02,ack-drop=0.01. Only a
binary built with "go build -tags chaos ./cmd/node" has fault points; any
other refuses --faults. On SIGINT or SIGTERM it leaves the cluster gracefully,
stops and exits 0; when it is drained ("node drain") it finishes its
requests, leaves and exits 0. Started by "go run" on Linux, it stops as on
SIGTERM when the go command ends, which forwards no SIGTERM: "kill $!" after
"go run ./cmd/node run … &" stops the node, not only the go command.

Exit codes: 0 stopped by a signal or drained, 1 refused or failed to start, 2
usage error, 70 an actor broke an invariant (the node must not serve on).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: logLevel}))
			nc, inj, err := cfg.settle(cmd.Flags(), *configPath, log)
			if err != nil {
				return err
			}
			installFaults(log, inj)
			runtime.GOMAXPROCS(procsFor(cfg.Procs, nc.Actors.Role, os.Getenv("GOMAXPROCS") != ""))
			if nc.Auth, err = creds.authority(log, trust.Role(nc.Actors.Role), ""); err != nil {
				return err
			}
			// Registered before the node starts, so that a signal that
			// arrives while it starts still stops it cleanly.
			signals := make(chan os.Signal, 1)
			signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(signals)
			if err := stopWithGoRun(); err != nil {
				return fmt.Errorf("run: %w", err)
			}
			web := webOptions{Addr: cfg.HTTP, Limits: cfg.httpLimits()}
			if cfg.HTTPTLSCert != "" {
				cert, err := tls.LoadX509KeyPair(cfg.HTTPTLSCert, cfg.HTTPTLSKey)
				if err != nil {
					return fmt.Errorf("run: --http-tls-cert %s and --http-tls-key %s: %w", cfg.HTTPTLSCert, cfg.HTTPTLSKey, err)
				}
				web.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
			}
			if cfg.APIKeys != "" {
				if web.Keys, err = httpapi.LoadKeys(cfg.APIKeys); err != nil {
					return err
				}
			}
			if cfg.APIKeys != "" || cfg.Tenants != "" {
				reload := make(chan os.Signal, 1)
				signal.Notify(reload, syscall.SIGHUP)
				defer signal.Stop(reload)
				web.Reload = reload
			}
			return serve(cmd.OutOrStdout(), log, nc, web, signals)
		},
	}
	configPath = configFlag(cmd)
	cfg.bindServeFlags(cmd.Flags())
	cfg.bindModelFlags(cmd.Flags())
	cmd.Flags().StringVar(&cfg.DType, "dtype", cfg.DType, "KV element type of the model served: f32, f16 or bf16")
	creds.bind(cmd.Flags(), "the only <role>-*.crt in --certs")
	cmd.Flags().TextVar(&logLevel, "log-level", logLevel, "least level logged to stderr: debug, info, warn or error")
	return cmd, &runSettings{cfg: &cfg, configPath: configPath}
}

// runSettings are what "node run"'s flags and --config file set.
type runSettings struct {
	cfg        *nodeConfig
	configPath *string
}

// settle is every check run makes before it starts anything, in order:
// the --config file, the model, the context window against it, the
// node's settings, the faults, the pools against the context window
// (logged at info on log) and against the memory budget. Errors of the
// settings themselves are usage errors.
func (c *nodeConfig) settle(fs *pflag.FlagSet, configPath string, log *slog.Logger) (cluster.NodeConfig, *faults.Injector, error) {
	if err := c.load(fs, configPath); err != nil {
		return cluster.NodeConfig{}, nil, usageError{err}
	}
	model, err := c.model()
	if err != nil {
		return cluster.NodeConfig{}, nil, err
	}
	if err := fitContext(fs, c, model); err != nil {
		return cluster.NodeConfig{}, nil, usageError{err}
	}
	nc, err := c.clusterNode(model)
	if err != nil {
		return cluster.NodeConfig{}, nil, usageError{err}
	}
	inj, err := c.injector()
	if err != nil {
		return cluster.NodeConfig{}, nil, usageError{err}
	}
	if err := preflightPools(log, nc.Actors); err != nil {
		return cluster.NodeConfig{}, nil, err
	}
	if err := poolsWithin(nc.Actors, c.MemoryBudgetBytes); err != nil {
		return cluster.NodeConfig{}, nil, usageError{err}
	}
	if err := batchWithin(fs, nc.Actors); err != nil {
		return cluster.NodeConfig{}, nil, usageError{err}
	}
	if c.Procs < 0 || c.Procs > procsMax {
		return cluster.NodeConfig{}, nil, usageError{fmt.Errorf("--procs (%d) must be 0 (the role's default) to %d processors", c.Procs, procsMax)}
	}
	if c.Tenants != "" {
		if nc.Actors.Tenants, err = tenancy.LoadShares(c.Tenants); err != nil {
			return cluster.NodeConfig{}, nil, err
		}
	}
	return nc, inj, nil
}

// procsMax bounds --procs.
const procsMax = 1024

// procsFor is the processors a node of role runs on: procs when given;
// else, unless the GOMAXPROCS environment variable is set (env), one for
// a router, whose work is light. On one processor a message changes
// goroutines without waking another thread: a router relaying one stream
// spent 48 µs of CPU a token on one processor and 59 µs on two, on a
// 2-core virtual machine (docs/benchmarking.md). Otherwise every
// processor (Go's own default, or GOMAXPROCS's), which the engine's
// matrix products split across.
func procsFor(procs int, role actors.Role, env bool) int {
	switch {
	case procs > 0:
		return procs
	case role == actors.RoleRouter && !env:
		return 1
	}
	return runtime.GOMAXPROCS(0)
}

// checkRunArgs makes settle's checks of "node run" with args, without
// starting anything, and returns the node configuration they give.
func checkRunArgs(args []string) (cluster.NodeConfig, error) {
	cmd, r := newRunCommand()
	if err := cmd.ParseFlags(args); err != nil {
		return cluster.NodeConfig{}, usageError{err}
	}
	nc, _, err := r.cfg.settle(cmd.Flags(), *r.configPath, slog.New(slog.DiscardHandler))
	return nc, err
}

// bindServeFlags registers the flags of "node run", defaulting to c's
// values.
func (c *nodeConfig) bindServeFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Role, "role", c.Role, "what the node serves: all (its own prefill and decode workers), prefill, decode or router")
	fs.StringVar(&c.Listen, "listen", c.Listen, "host:port to serve on (port 0 picks a free port; default "+defaultEndpoint+
		", where node generate sends, for roles router and all, and a free port of 127.0.0.1 for prefill and decode, which peers learn by gossip)")
	fs.StringVar(&c.Gossip, "gossip", c.Gossip, "IP:port to gossip membership on, UDP and TCP (port 0 picks a free port; loopback uses fast local timers)")
	fs.StringVar(&c.Data, "data", c.Data, "host:port of the KV data plane of a node that decodes (port 0 picks a free port)")
	fs.Var(&c.Join, "join", "gossip addresses of cluster members to join, comma-separated (none: start a new cluster)")
	fs.StringVar(&c.Advertise, "advertise", c.Advertise, "host:port peers reach the node at, when a proxy forwards it to --listen (empty: --listen's)")
	fs.StringVar(&c.DataAdvertise, "data-advertise", c.DataAdvertise, "host:port peers reach the data plane at, when a proxy forwards it to --data (empty: --data's)")
	fs.StringVar(&c.HTTP, "http", c.HTTP, "host:port to serve /healthz, /readyz, /metrics and, with --api-keys, the OpenAI-compatible /v1 API on, in plain HTTP (empty: none)")
	fs.StringVar(&c.APIKeys, "api-keys", c.APIKeys, "API keys file of the OpenAI-compatible API (router and all roles, with --http; read again on SIGHUP)")
	fs.StringVar(&c.Tenants, "tenants", c.Tenants, "tenants' shares file: weight, concurrent_max and pages_max per tenant and a default for the rest (read again on SIGHUP; empty: every tenant weight 1, at most 64 requests in flight)")
	fs.StringVar(&c.HTTPTLSCert, "http-tls-cert", c.HTTPTLSCert, "PEM certificate (chain) to serve --http as HTTPS with (with --http-tls-key)")
	fs.StringVar(&c.HTTPTLSKey, "http-tls-key", c.HTTPTLSKey, "PEM private key of --http-tls-cert")
	c.bindHTTPBoundFlags(fs)
	fs.StringVar(&c.Faults, "faults", c.Faults, "faults to inject, e.g. seed=7,frame-drop=0.02,ack-drop=0.01 (chaos builds only: go build -tags chaos ./cmd/node)")
	fs.Int64Var(&c.ContextTokens, "context-tokens", c.ContextTokens, "context window the node advertises, in tokens: prompt plus generated tokens")
	fs.IntVar(&c.PageTokens, "page-tokens", c.PageTokens, "tokens per KV page")
	fs.IntVar(&c.PrefillWorkers, "prefill-workers", c.PrefillWorkers, "prefill workers, each with its own pool")
	fs.IntVar(&c.DecodeWorkers, "decode-workers", c.DecodeWorkers, "decode workers, each with its own pool")
	fs.IntVar(&c.PrefillPages, "prefill-pages", c.PrefillPages, "KV pages of each prefill worker's pool")
	fs.IntVar(&c.DecodePages, "decode-pages", c.DecodePages, "KV pages of each decode worker's pool")
	fs.IntVar(&c.PrefixCachePercent, "prefix-cache-percent", c.PrefixCachePercent,
		"most of each prefill worker's pool, in percent, its prefix cache keeps of prompts' full pages, scoped by tenant (0: no prefix cache)")
	fs.IntVar(&c.DecodeCachePercent, "decode-cache-percent", c.DecodeCachePercent,
		"most of each decode worker's pool, in percent, its prefix cache keeps of answered prompts' full pages, scoped by tenant: prefill then sends only the pages after those (0: none)")
	fs.BoolVar(&c.PrefixRouting, "prefix-routing", c.PrefixRouting,
		"send a prompt to the prefill and decode nodes (and prefill worker) its prefix went to before, load allowing; false: by load alone")
	fs.DurationVar((*time.Duration)(&c.CacheSummaryEvery), "cache-summary-every", time.Duration(c.CacheSummaryEvery),
		"how often a router asks each prefill and decode node what its prefix caches hold")
	fs.IntVar(&c.MaxTokensMax, "max-tokens-max", c.MaxTokensMax, "most tokens one request may ask to generate")
	fs.Int64Var(&c.MemoryBudgetBytes, "memory-budget-bytes", c.MemoryBudgetBytes, "bound on the bytes of all the node's KV pools together, checked before any is allocated (0: the host's memory)")
	fs.IntVar(&c.QueueMax, "queue-max", c.QueueMax, "most requests in flight at once; one more is answered busy")
	fs.IntVar(&c.Procs, "procs", c.Procs, "processors the node runs on (GOMAXPROCS; 0: 1 for a router unless GOMAXPROCS is set, else every processor)")
	fs.IntVar(&c.BatchMax, "batch-max", c.BatchMax, "most decode sequences a worker steps at once")
	fs.DurationVar((*time.Duration)(&c.RequestTimeout), "request-timeout", time.Duration(c.RequestTimeout), "bound on one request from admission to its last token")
	fs.DurationVar((*time.Duration)(&c.ReclaimAfter), "reclaim-after", time.Duration(c.ReclaimAfter), "how long a released page waits for its lease holders before it is reclaimed anyway")
	fs.DurationVar((*time.Duration)(&c.PrefillTimeout), "prefill-timeout", time.Duration(c.PrefillTimeout), "bound on one KV transfer from a prefill worker; past it the transfer is retried elsewhere")
	fs.DurationVar((*time.Duration)(&c.OwnedPageTimeout), "owned-page-timeout", time.Duration(c.OwnedPageTimeout), "bound on how long a page stays owned before it is reclaimed (must exceed --request-timeout and --prefill-timeout)")
	fs.DurationVar((*time.Duration)(&c.DrainTimeout), "drain-timeout", time.Duration(c.DrainTimeout), "bound on a drain; past it the node leaves with requests still in flight")
	fs.IntVar(&c.MovesMax, "moves-max", c.MovesMax, fmt.Sprintf("most of a decode node's requests it moves to other decode nodes at once (node drain, node migrate), 1 to %d", cluster.MovesMaxLimit))
	fs.DurationVar((*time.Duration)(&c.LostAfter), "lost-after", time.Duration(c.LostAfter), "how long a member declared dead whose address does not refuse connections (stopped, paused, unreachable) keeps its requests before they fail as node_lost; below --request-timeout (0: 20s, or half of --request-timeout if less)")
}

// bindHTTPBoundFlags registers the flags of the HTTP server's bounds on
// strangers (httpapi.Limits).
func (c *nodeConfig) bindHTTPBoundFlags(fs *pflag.FlagSet) {
	fs.IntVar(&c.HTTPConnsMax, "http-conns-max", c.HTTPConnsMax, "most HTTP connections held at once; one more is closed unread")
	fs.IntVar(&c.HTTPConnsPerAddrMax, "http-conns-per-addr-max", c.HTTPConnsPerAddrMax, "most HTTP connections held at once from one client address (IPv4 address, IPv6 /64); behind a proxy, --http-conns-max's value")
	fs.IntVar(&c.HTTPDescriptorsReserved, "http-descriptors-reserved", c.HTTPDescriptorsReserved, "file descriptors left to the node's own traffic (remote, data plane, gossip, operators) when HTTP holds --http-conns-max; both must fit the limit of open files (ulimit -n)")
	fs.DurationVar((*time.Duration)(&c.HTTPReadTimeout), "http-read-timeout", time.Duration(c.HTTPReadTimeout), "bound on reading one HTTP request, header and body")
	fs.DurationVar((*time.Duration)(&c.HTTPIdleTimeout), "http-idle-timeout", time.Duration(c.HTTPIdleTimeout), "how long a kept-alive HTTP connection may wait for its next request")
	fs.IntVar(&c.HTTPAuthFailuresMax, "http-auth-failures-max", c.HTTPAuthFailuresMax, "requests without an accepted API key one client address may send in --http-auth-failure-window; past them they are answered 429 for --http-auth-penalty")
	fs.DurationVar((*time.Duration)(&c.HTTPAuthFailureWindow), "http-auth-failure-window", time.Duration(c.HTTPAuthFailureWindow), "window of --http-auth-failures-max")
	fs.DurationVar((*time.Duration)(&c.HTTPAuthPenalty), "http-auth-penalty", time.Duration(c.HTTPAuthPenalty), "how long a client address past --http-auth-failures-max is answered 429")
	fs.IntVar(&c.HTTPAuthAddrsMax, "http-auth-addrs-max", c.HTTPAuthAddrsMax, "most client addresses whose failed API keys are remembered")
}

// httpLimits are the HTTP server's limits c sets: its bounds on strangers
// and timeouts, the rest httpapi.DefaultLimits'.
func (c nodeConfig) httpLimits() httpapi.Limits {
	l := httpapi.DefaultLimits()
	l.ConnsMax, l.ConnsPerAddrMax, l.DescriptorsReserved = c.HTTPConnsMax, c.HTTPConnsPerAddrMax, c.HTTPDescriptorsReserved
	l.ReadTimeout, l.IdleTimeout = time.Duration(c.HTTPReadTimeout), time.Duration(c.HTTPIdleTimeout)
	l.AuthFailuresMax, l.AuthAddrsMax = c.HTTPAuthFailuresMax, c.HTTPAuthAddrsMax
	l.AuthFailureWindow, l.AuthPenalty = time.Duration(c.HTTPAuthFailureWindow), time.Duration(c.HTTPAuthPenalty)
	return l
}

// checkHTTP checks the HTTP server's limits, and that at its bound on
// connections it leaves the node the descriptors it reserves.
func (c nodeConfig) checkHTTP() error {
	l := c.httpLimits()
	if err := l.Validate(); err != nil {
		return fmt.Errorf("--http's bounds (the --http-* flags): %w", err)
	}
	if err := l.FitOpenFiles(openFilesLimit()); err != nil {
		return fmt.Errorf("--http-conns-max and --http-descriptors-reserved: %w", err)
	}
	return nil
}

// fitContext gives c the context window of model m when none was set (a
// default of 0, or run's default larger than m's), and refuses one larger
// than m's: no node can advertise a window its model cannot compute.
// Run's default MaxTokensMax follows the window down.
func fitContext(fs *pflag.FlagSet, c *nodeConfig, m *engine.Model) error {
	ctx := int64(m.Config().ContextTokens)
	if !fs.Changed("context-tokens") && (c.ContextTokens == 0 || c.ContextTokens == int64(actors.DefaultConfig().ContextTokens)) {
		c.ContextTokens = ctx
	}
	if c.ContextTokens > ctx {
		return fmt.Errorf("--context-tokens (%d) exceeds %s's context window of %d tokens", c.ContextTokens, m.Name(), ctx)
	}
	// run's default for the most tokens per request shrinks to what a
	// smaller window leaves after the shortest prompt (its BOS); one given
	// that large is refused by actors.Config.Validate, with both numbers.
	if def := actors.DefaultConfig().MaxTokensMax; !fs.Changed("max-tokens-max") && c.MaxTokensMax == def && int64(def) >= c.ContextTokens {
		c.MaxTokensMax = int(max(c.ContextTokens-1, 1))
	}
	return nil
}

// serving validates c's serving settings for model m and turns them into
// the actors package's configuration; settings without a flag keep
// actors.DefaultConfig's values.
func (c nodeConfig) serving(m *engine.Model) (actors.Config, error) {
	a := actors.DefaultConfig()
	a.Model = m.Config()
	role, err := actors.ParseRole(c.Role)
	if err != nil {
		return a, fmt.Errorf("--role %q is not a role: want all, prefill, decode or router", c.Role)
	}
	if err := checkAdvertised("--listen", c.listenFor(role)); err != nil {
		return a, err
	}
	a.Role = role
	a.PageTokens = c.PageTokens
	// Capped so that the conversion cannot wrap where int is 32 bits; a
	// window that large exceeds every model's and is refused by Validate.
	a.ContextTokens = int(min(c.ContextTokens, math.MaxInt32))
	a.PrefillWorkers, a.DecodeWorkers = c.PrefillWorkers, c.DecodeWorkers
	a.PrefillPages, a.DecodePages = c.PrefillPages, c.DecodePages
	a.PrefixCachePercent, a.DecodeCachePercent, a.PrefixRouting = c.PrefixCachePercent, c.DecodeCachePercent, c.PrefixRouting
	a.CacheSummaryEvery = time.Duration(c.CacheSummaryEvery)
	a.MaxTokensMax, a.QueueMax, a.BatchMax = c.MaxTokensMax, c.QueueMax, c.BatchMax
	a.RequestTimeout, a.ReclaimAfter = time.Duration(c.RequestTimeout), time.Duration(c.ReclaimAfter)
	a.PrefillTimeout = time.Duration(c.PrefillTimeout)
	a.OwnedPageTimeout = time.Duration(c.OwnedPageTimeout)
	return a, a.Validate()
}

// listenFor is --listen, or when it is not given the default of role:
// defaultEndpoint for a router and a node of role all, which clients send
// to, and a free port of loopback for prefill and decode nodes, which
// peers find through gossip; so a router, a prefill and a decode node
// started on one machine with no --listen do not ask for one port.
func (c nodeConfig) listenFor(role actors.Role) string {
	switch {
	case c.Listen != "":
		return c.Listen
	case role == actors.RoleRouter || role == actors.RoleAll:
		return defaultEndpoint
	}
	return "127.0.0.1:0"
}

// clusterNode validates c and turns it into the cluster package's node
// configuration. A node gossiping on loopback is one of a local cluster
// and gets cluster.DefaultLocalNodeConfig's fast timers, so that a lost
// member is noticed in seconds; any other address gets the LAN timers of
// membership.DefaultConfig and dataplane.DefaultConfig.
func (c nodeConfig) clusterNode(m *engine.Model) (cluster.NodeConfig, error) {
	a, err := c.serving(m)
	if err != nil {
		return cluster.NodeConfig{}, err
	}
	host, port, err := splitIPPort("--gossip", c.Gossip)
	if err != nil {
		return cluster.NodeConfig{}, err
	}
	if err := checkAdvertised("--data", c.Data); err != nil {
		return cluster.NodeConfig{}, err
	}
	if c.HTTP != "" {
		if err := checkListen("--http", c.HTTP); err != nil {
			return cluster.NodeConfig{}, err
		}
		if err := c.checkHTTP(); err != nil {
			return cluster.NodeConfig{}, err
		}
	}
	if (c.HTTPTLSCert == "") != (c.HTTPTLSKey == "") || (c.HTTPTLSCert != "" && c.HTTP == "") {
		return cluster.NodeConfig{}, fmt.Errorf("--http-tls-cert %q and --http-tls-key %q: give both, with --http (%q), or neither",
			c.HTTPTLSCert, c.HTTPTLSKey, c.HTTP)
	}
	if c.APIKeys != "" && (c.HTTP == "" || (a.Role != actors.RoleRouter && a.Role != actors.RoleAll)) {
		return cluster.NodeConfig{}, fmt.Errorf("--api-keys %q: the API is served by a router or a node of role all, on --http (role %s, --http %q)",
			c.APIKeys, a.Role, c.HTTP)
	}
	if err := c.checkProxied(a.Role); err != nil {
		return cluster.NodeConfig{}, err
	}
	for _, j := range c.Join {
		if err := checkListen("--join", j); err != nil {
			return cluster.NodeConfig{}, err
		}
	}
	nc := cluster.DefaultLocalNodeConfig(a.Role)
	if !host.IsLoopback() {
		nc.Gossip = membership.DefaultConfig()
		nc.DataPlane = dataplane.DefaultConfig(a.Geometry(), 1)
	}
	nc.Actors, nc.Model = a, m
	nc.Listen, nc.DataListen = c.listenFor(a.Role), c.Data
	nc.Advertise, nc.DataAdvertise = c.Advertise, c.DataAdvertise
	nc.Gossip.BindAddr, nc.Gossip.BindPort = host.String(), port
	nc.Gossip.JoinAddrs = c.Join
	nc.DrainTimeout = time.Duration(c.DrainTimeout)
	nc.MovesMax = c.MovesMax
	nc.LostAfter = time.Duration(c.LostAfter)
	return nc, nc.Validate()
}

// splitIPPort reads an IP:port flag: gossip binds an IP address, not a
// name.
func splitIPPort(flag, addr string) (net.IP, int, error) {
	if err := checkListen(flag, addr); err != nil {
		return nil, 0, err
	}
	h, p, _ := net.SplitHostPort(addr)
	ip := net.ParseIP(h)
	if ip == nil {
		return nil, 0, fmt.Errorf("%s %q: %q is not an IP address", flag, addr, h)
	}
	port, _ := strconv.Atoi(p)
	return ip, port, nil
}

// checkAdvertised is checkListen for an address the node also gives its
// peers (in its membership metadata and in transfer plans): a wildcard
// host (0.0.0.0, ::, empty) names no host a peer could reach.
func checkAdvertised(flag, addr string) error {
	if err := checkListen(flag, addr); err != nil {
		return err
	}
	h, _, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
		return fmt.Errorf("%s %q: peers reach the node at this address, so it needs a host they can reach, not %q",
			flag, addr, h)
	}
	return nil
}

// checkProxied checks --advertise and --data-advertise: addresses peers
// dial, so with a host they can reach and a port; --data-advertise only
// for a role with a data plane.
func (c nodeConfig) checkProxied(role actors.Role) error {
	for _, f := range []struct{ flag, addr string }{{"--advertise", c.Advertise}, {"--data-advertise", c.DataAdvertise}} {
		if f.addr == "" {
			continue
		}
		if err := checkAdvertised(f.flag, f.addr); err != nil {
			return err
		}
		if _, port, _ := net.SplitHostPort(f.addr); port == "0" {
			return fmt.Errorf("%s %q: peers dial this address, so it needs the port they dial, not 0", f.flag, f.addr)
		}
	}
	if c.DataAdvertise != "" && !role.Decodes() {
		return fmt.Errorf("--data-advertise %q: a %s node has no data plane (only roles all and decode do)", c.DataAdvertise, role)
	}
	return nil
}

// injector is the fault injector --faults asks for: nil without it; a
// production build refuses any.
func (c nodeConfig) injector() (*faults.Injector, error) {
	if c.Faults == "" {
		return nil, nil
	}
	sp, err := faults.Parse(c.Faults)
	if err != nil {
		return nil, fmt.Errorf("--faults: %w", err)
	}
	inj, err := faults.New(sp)
	if err != nil {
		return nil, fmt.Errorf("--faults: %w", err)
	}
	return inj, nil
}

// installFaults makes inj the process's injector, loudly: a node that
// injects faults must never be taken for one that serves.
func installFaults(log *slog.Logger, inj *faults.Injector) {
	if inj == nil {
		return
	}
	log.Warn("FAULTS: this node injects faults on purpose into the KV frames and acknowledgements it sends; "+
		"it is for chaos testing and must never serve real traffic", "faults", inj.Spec().String())
	faults.Install(inj)
}

// checkListen refuses a malformed address before anything starts; whether
// it can be listened on is found out by starting.
func checkListen(flag, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: %w", flag, addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%s %q: port %q must be 0 to 65535", flag, addr, port)
	}
	return nil
}

// preflightPools is preflight for the node's own pools: every worker's pool
// must hold one request of the advertised context window. Each pool is a
// configured pool (gpu.SizingConfig.KVPoolTokens) of pages × page tokens,
// so gpu.Preflight makes the same check it makes for a device.
func preflightPools(log *slog.Logger, cfg actors.Config) error {
	for _, p := range heldPools(cfg) {
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

// heldPool is one kind of KV pool a node's role holds, one per worker.
type heldPool struct {
	role           string
	workers, pages int
	pagesFlag      string
	what           string
}

// heldPools are the pools cfg's role holds (a role without prefill or
// decode workers has no such pool).
func heldPools(cfg actors.Config) []heldPool {
	var out []heldPool
	if cfg.Role.Prefills() {
		out = append(out, heldPool{"prefill", cfg.PrefillWorkers, cfg.PrefillPages, "--prefill-pages", "each prefill worker's pool"})
	}
	if cfg.Role.Decodes() {
		out = append(out, heldPool{"decode", cfg.DecodeWorkers, cfg.DecodePages, "--decode-pages", "each decode worker's pool"})
	}
	return out
}

// poolsWithin refuses a node whose pools and requests in flight together
// exceed budget bytes (0: the host's memory; unknown, no bound), before any
// pool is allocated: a count flag's true bound is what the machine can
// hold.
func poolsWithin(cfg actors.Config, budget int64) error {
	if budget < 0 {
		return fmt.Errorf("--memory-budget-bytes (%d) must not be negative", budget)
	}
	what := "--memory-budget-bytes"
	if budget == 0 {
		budget, what = hostMemoryBytes(), "the host's memory"
	}
	if budget == 0 {
		return nil
	}
	if need, parts := nodeBytes(cfg); need > float64(budget) {
		return fmt.Errorf("the node needs %.0f bytes (%s), more than %s, %d bytes; "+
			"fewer workers, pages or requests, or --memory-budget-bytes", need, strings.Join(parts, " and "), what, budget)
	}
	return nil
}

// nodeBytes is the memory a node of cfg can hold: its KV pools, and its
// requests in flight outside them (in float64, so that no product of
// counts can wrap), with what each part counts.
func nodeBytes(cfg actors.Config) (float64, []string) {
	page := int64(cfg.Geometry().PageBytes())
	var need float64
	var parts []string
	for _, p := range heldPools(cfg) {
		need += float64(p.workers) * float64(p.pages) * float64(page)
		parts = append(parts, fmt.Sprintf("%d %s workers × %d pages of %d bytes", p.workers, p.role, p.pages, page))
	}
	need += float64(cfg.QueueMax) * float64(cfg.ContextTokens) * requestBytesPerToken
	parts = append(parts, fmt.Sprintf("%d requests in flight (--queue-max) × %d tokens of %d bytes", cfg.QueueMax,
		cfg.ContextTokens, requestBytesPerToken))
	return need, parts
}

// requestBytesPerToken bounds what one request in flight holds outside the
// KV pools, per token of the context window: its prompt's and generated
// token ids (8 bytes each), their text and the chunks on their way to the
// client.
const requestBytesPerToken = 64

// batchWithin refuses a --batch-max given that no decode worker can ever
// reach: a batch is of the sequences a worker holds, each at least one
// page of its pool and one request in flight.
func batchWithin(fs *pflag.FlagSet, cfg actors.Config) error {
	if !fs.Changed("batch-max") || !cfg.Role.Decodes() {
		return nil
	}
	if most := min(cfg.DecodePages, cfg.QueueMax); cfg.BatchMax > most {
		return fmt.Errorf("--batch-max (%d) exceeds the %d sequences a decode worker can hold (one page each of --decode-pages %d, "+
			"one request each of --queue-max %d)", cfg.BatchMax, most, cfg.DecodePages, cfg.QueueMax)
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

// webOptions are what a node serves on HTTP: nothing without Addr; the
// probes and metrics; and, with Keys, the OpenAI-compatible API. Its keys,
// and the tenants' shares, are read again at each signal on Reload.
type webOptions struct {
	Addr   string
	Limits httpapi.Limits
	Keys   *httpapi.Keys
	Reload <-chan os.Signal
	// TLS, if not nil, serves HTTPS.
	TLS *tls.Config
}

// serve starts the node, prints the readiness line and waits.
// With web.Addr, the node's probes and metrics (package httpapi) are
// served there too, in plain HTTP: they are read-only and hold no tenant's
// data; with web.Keys, the API as well.
func serve(stdout io.Writer, log *slog.Logger, cfg cluster.NodeConfig, web webOptions, signals <-chan os.Signal) error {
	var httpLn net.Listener
	if web.Addr != "" {
		var err error
		if httpLn, err = net.Listen("tcp", web.Addr); err != nil {
			return fmt.Errorf("run: --http: %w", err)
		}
		defer httpLn.Close()
	}
	n, err := startUnlessSignalled(log, cfg, signals)
	if n == nil {
		return err
	}
	security := "as " + cfg.Auth.Self().URI()
	if cfg.Auth.Insecure() {
		security = "INSECURE: nobody authenticated"
	}
	if inj := faults.Current(); inj != nil {
		security += ", FAULTS " + inj.Spec().String()
	}
	if httpLn != nil {
		w, err := webServer(log, n, cfg.Auth, web)
		if err != nil {
			n.Stop()
			return err
		}
		srv, ln := w.Server(), w.Listener(httpLn)
		scheme := "http"
		if web.TLS != nil {
			scheme, srv.TLSConfig = "https", web.TLS
			go srv.ServeTLS(ln, "", "")
		} else {
			go srv.Serve(ln)
		}
		defer srv.Close()
		security += ", " + scheme + " " + httpLn.Addr().String()
	}
	fmt.Fprintf(stdout, "serving on %s (incarnation %016x, role %s, gossip %s, %s)\n", n.Address(), n.Incarnation(),
		cfg.Actors.Role, n.GossipAddr(), security)
	a := cfg.Actors
	log.Info("serving", "address", n.Address(), "listen", cfg.Listen, "data_plane", n.DataAddr(), "data_listen", cfg.DataListen,
		"role", a.Role, "gossip", n.GossipAddr(), "join", cfg.Gossip.JoinAddrs,
		"context_tokens", a.ContextTokens, "page_tokens", a.PageTokens, "prefill_workers", a.PrefillWorkers,
		"decode_workers", a.DecodeWorkers, "queue_max", a.QueueMax, "identity", cfg.Auth.Self().URI(),
		"insecure", cfg.Auth.Insecure(), "model", cfg.Model.Name(), "model_fingerprint", cfg.Model.Fingerprint().String(),
		"weights", cfg.Model.WeightTypes(), "weight_bytes", cfg.Model.WeightBytes(), "kv_dtype", a.Model.KVDType.String(), "procs", runtime.GOMAXPROCS(0))
	if web.Keys != nil {
		log.Info("serving the OpenAI-compatible API", "http", httpLn.Addr().String(), "tls", web.TLS != nil, "keys", web.Keys.Len(),
			"keys_file", web.Keys.Path())
		if ip := httpLn.Addr().(*net.TCPAddr).IP; web.TLS == nil && !ip.IsLoopback() {
			log.Warn("the API's keys and prompts travel in plain text: give --http-tls-cert and --http-tls-key, or serve it behind a TLS proxy",
				"http", httpLn.Addr().String())
		}
	}
	if web.Reload != nil {
		go reload(log, web.Keys, a.Tenants, web.Reload, n.Stopped())
	}
	return wait(log, n, signals, n.Actors().Fatal(), n.Stopped())
}

// startAbandonGrace bounds what a signal during start-up waits for: the
// start to finish, then the started node to leave. Past it the process
// exits with the start unfinished; nothing was served yet, and members it
// reached notice it gone by gossip.
const startAbandonGrace = 400 * time.Millisecond

// startUnlessSignalled starts the node while it watches signals: joining the cluster
// can wait on unreachable members for the gossip TCP timeout per address,
// and a signal in the meantime stops the node within a second rather than
// after the join gives up. It returns a nil node, and a nil error, when a
// signal stopped the start.
func startUnlessSignalled(log *slog.Logger, cfg cluster.NodeConfig, signals <-chan os.Signal) (*cluster.Node, error) {
	type started struct {
		n   *cluster.Node
		err error
	}
	done := make(chan started, 1)
	begun := time.Now()
	log.Info("starting the node", "role", cfg.Actors.Role, "listen", cfg.Listen, "join", cfg.Gossip.JoinAddrs)
	go func() {
		n, err := cluster.StartNode(cfg, log)
		done <- started{n, err}
	}()
	select {
	case s := <-done:
		if s.err != nil {
			return nil, fmt.Errorf("run: starting the %s node on %s (gossip %s): %w", cfg.Actors.Role, cfg.Listen,
				net.JoinHostPort(cfg.Gossip.BindAddr, strconv.Itoa(cfg.Gossip.BindPort)), s.err)
		}
		return s.n, nil
	case sig := <-signals:
		log.Info("signal during start-up: stopping", "signal", sig.String(), "after", time.Since(begun).Round(time.Millisecond))
		deadline := time.After(startAbandonGrace)
		select {
		case s := <-done:
			if s.err == nil {
				if err := stopWithin(log, s.n, startAbandonGrace); err != nil {
					log.Warn("the node started as the signal came and did not stop in time; exiting", "err", err)
				}
			}
		case <-deadline:
			log.Warn("start-up did not finish; exiting without it", "waited", startAbandonGrace)
		}
		return nil, nil
	}
}

// webServer is the HTTP server of node n: probes and metrics, and the API
// when web has keys, its requests sent to n's own admission actor (the
// router's, on a router) as local requests of the key's tenant. What its
// bounds on strangers refuse is counted and logged by auth, with the
// node's other refusals.
func webServer(log *slog.Logger, n *cluster.Node, auth *trust.Authority, web webOptions) (*httpapi.Web, error) {
	var api *httpapi.APIConfig
	if web.Keys != nil {
		a := n.Actors()
		gen := client.New(a.Root().ActorSystem(), actor.NewPID(n.Address(), actors.AdmissionName), client.Options{})
		cfg := a.Config()
		chat, why := a.Model().ChatTemplate()
		if why != "" {
			log.Warn(why, "model", a.Model().Name())
		} else if chat != nil {
			log.Info("chats use the model's chat template", "model", a.Model().Name(), "template", chat.Name())
		}
		api = &httpapi.APIConfig{Model: a.Model(), Generator: gen, Keys: web.Keys, Node: cfg.Limits(), Log: log, ChatTemplate: chat}
	}
	w, err := httpapi.NewWeb(n, api, web.Limits, auth)
	if err != nil {
		return nil, fmt.Errorf("run: --http: %w", err)
	}
	return w, nil
}

// reload reads the keys file and the tenants' shares file (either may be
// nil) again at each signal on signals, until stopped; a file that cannot
// be used is logged and what is in force stays.
func reload(log *slog.Logger, keys *httpapi.Keys, shares *tenancy.Shares, signals <-chan os.Signal, stopped <-chan struct{}) {
	for {
		select {
		case <-signals:
			if keys != nil {
				if err := keys.Reload(); err != nil {
					log.Error("API keys not reloaded; the keys in use stay", "err", err)
				} else {
					log.Info("API keys reloaded", "keys", keys.Len(), "keys_file", keys.Path())
				}
			}
			if shares.Path() != "" {
				if err := shares.Reload(); err != nil {
					log.Error("tenants' shares not reloaded; the shares in force stay", "err", err)
				} else {
					log.Info("tenants' shares reloaded", "tenants", len(shares.Policy().Tenants), "tenants_file", shares.Path())
				}
			}
		case <-stopped:
			return
		}
	}
}

// stopper is what wait stops: a *cluster.Node, or a stand-in in tests.
type stopper interface{ Stop() error }

// wait serves until a signal (leave the cluster and stop, nil), the end of
// a drain (the node has left and stopped, nil) or a broken invariant (stop,
// invariantError) arrives. fatal and drained are n.Actors().Fatal() and
// n.Stopped(), parameters so that a test can deliver them.
func wait(log *slog.Logger, n stopper, signals <-chan os.Signal, fatal <-chan *actors.InvariantError,
	drained <-chan struct{}) error {
	select {
	case sig := <-signals:
		log.Info("stopping the node", "signal", sig.String())
		if err := stopWithin(log, n, stopTimeout); err != nil {
			return err
		}
		log.Info("node stopped")
		return nil
	case <-drained:
		log.Info("node drained, left the cluster and stopped")
		return nil
	case e := <-fatal:
		log.Error("an actor broke an invariant; the node must not serve on", "actor", e.Actor,
			"reason", fmt.Sprint(e.Reason), "message", e.Message)
		if err := stopWithin(log, n, stopTimeout); err != nil {
			log.Error("stopping after the invariant failure", "err", err)
		}
		return invariantError{e}
	}
}

// stopWithin stops n, or gives up after d: exiting the process stops the
// node as well, so a stuck shutdown must not keep it alive. A graceful
// leave that fails is logged, not returned: the node has stopped all the
// same, and the others notice it gone by gossip.
func stopWithin(log *slog.Logger, n stopper, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- n.Stop() }()
	select {
	case err := <-done:
		if err != nil {
			log.Warn("leaving the cluster", "err", err)
		}
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
