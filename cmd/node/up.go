package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/httpapi"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// Bounds of "node up".
const (
	// upNodesMax bounds the prefill and decode nodes of one local cluster
	// together: each is a process with its own pools.
	upNodesMax = 64
	// upRoutersMax bounds the routers of one local cluster.
	upRoutersMax = 16
	// upPollInterval is how often up looks at the members while they
	// converge.
	upPollInterval = 100 * time.Millisecond
	// stderrTailBytes is how much of a failed node's log up prints.
	stderrTailBytes = 4 << 10
)

// readinessLine is the line "node run" prints when it serves.
var readinessLine = regexp.MustCompile(`^serving on (\S+) \(incarnation ([0-9a-f]{16}), role (\w+), gossip (\S+), ([^)]+)\)$`)

// upOptions are the flags of "node up"; NodeArgs are the arguments after
// "--", given to every node run.
type upOptions struct {
	Prefill, Decode int
	// Routers is how many routers to start, the first on Listen; zero
	// means one.
	Routers        int
	Listen         string
	GossipBasePort int
	LogDir         string
	ReadyTimeout   time.Duration
	StopTimeout    time.Duration
	NodeArgs       []string
	// Prompt, when PromptGiven, is sent once the cluster is up (as
	// Tenant, with at most MaxTokens), its answer printed, and the cluster
	// stopped; "" is a prompt (the model's BOS alone).
	Prompt      string
	PromptGiven bool
	Tenant      string
	MaxTokens   int
	// Model and Tokenizer are the llama2.c checkpoint and tokenizer every
	// node serves (both, or neither for the built-in model); up loads them
	// once to check them before it starts any node.
	Model, Tokenizer string
	// Insecure runs every node --insecure; otherwise up makes a throwaway
	// CA and certificates for its nodes in localCertsDir(Listen).
	Insecure bool
	// HTTP is where the first router serves its probes, metrics and the
	// OpenAI-compatible API (empty: nowhere), each further router on the
	// next port (a port 0 picks a free one for each); APIKey is the one key
	// the API accepts, for Tenant.
	HTTP, APIKey string
	// modelName is the name of the model the nodes serve, for the API's
	// example request.
	modelName string
	restartPolicy
	// Detach starts up in the background (detach) and returns once the
	// cluster serves. ReadyFD, given to that background up, is the
	// descriptor it writes its table on, as ready, and then closes.
	Detach  bool
	ReadyFD int
	ready   io.WriteCloser
}

// exampleAPIKey is the key of node up's API unless --api-key says
// otherwise: a cluster on loopback, for one machine's user.
const exampleAPIKey = "kvw-local-example-key"

func newUpCmd() *cobra.Command {
	o := &upOptions{Prefill: 1, Decode: 1, Routers: 1, Listen: defaultEndpoint, GossipBasePort: 7946,
		ReadyTimeout: time.Minute, StopTimeout: stopTimeout + 5*time.Second, Tenant: "demo", MaxTokens: defaultMaxTokens,
		HTTP: "127.0.0.1:8000", APIKey: exampleAPIKey,
		restartPolicy: restartPolicy{RestartsMax: 5, RestartWindow: 10 * time.Minute, RestartBackoff: 500 * time.Millisecond}}
	cmd := &cobra.Command{
		Use:   "up [flags] [-- node run flags]",
		Short: "Start a local cluster: routers and prefill and decode nodes on loopback",
		Long: `up starts a local cluster on loopback, each node a child process of this binary
("node run"): a router serving on --listen and gossiping on 127.0.0.1 at
--gossip-base-port, then --prefill prefill nodes and --decode decode nodes on
free ports, which join through the router. Arguments after "--" are given to
every node run (for example -- --reclaim-after 2s --decode-pages 512).

--routers N starts N routers: router-0 on --listen, the others on free ports
of its host, every node joining router-0's gossip. Each serves requests for the
whole cluster; node generate --endpoint takes them all, comma-separated, and a
request whose router dies goes on through another. The table lists every
router's address, and node status, generate and drain find up's credentials
at each.

Every node serves its probes (/healthz, /readyz) and Prometheus metrics
(/metrics) on HTTP, at the address the table gives: router-i on --http's
port plus i (a free port each when it is 0), with the OpenAI-compatible API
(/v1/completions, /v1/chat/completions, /v1/models) and one API key,
--api-key, whose requests run as --tenant (its keys file is in the log
directory); every other node on a free port of 127.0.0.1. The example key is
accepted only on a loopback --http. With --prompt, the routers serve no API
unless --http is given.

Each node's stderr (its log) goes to a file named after it (router-0.log,
prefill-0.log, decode-0.log, …) in --log-dir, by default a new temporary
directory; up prints where. Once every node serves and every node sees all
the others alive, up prints a table of the nodes (address, gossip, HTTP,
incarnation, pid, log) and how to send a request, then supervises them:

  - A node that exits with an error or is killed (kill -9, a crash) is
    started again after --restart-backoff, doubled for each further restart
    within --restart-window: a new process and incarnation with the same
    name, role, credentials and HTTP address, a router on the same address,
    joining through the nodes that serve, its log appended to. Up logs the
    failure and prints "restarted NAME …" with the new pid and addresses.
    Requests the node held end as the cluster's failover decides: retried
    elsewhere before their first token, continued through another router,
    or failed with node_lost, never a wrong answer.
  - A node that fails again after --restarts-max restarts within
    --restart-window is given up ("gave up on NAME …"); the others serve on.
  - A node that exits 0 (drained with "node drain", or stopped on purpose)
    stays down; the others serve on.
  - When no router is left (the last one exited 0 or was given up), up
    stops the others, prints the end of that router's log and exits 1.

A node that fails while the cluster starts fails the start: up stops the
others, prints the end of its log and exits 1. On SIGINT or SIGTERM up stops
the nodes (SIGTERM, and SIGKILL to any still running after --stop-timeout),
the routers first, and exits 0. Up writes its pid beside the credentials it
makes for --listen's address (in the temporary directory), where "node down
--listen" finds it to stop up and wait until it has exited; a second up for
an address whose up runs is refused, naming its pid. Started by "go run" on
Linux, up stops as on SIGTERM when the go command ends, which forwards no
SIGTERM: "kill $!" after "go run ./cmd/node up &" stops the cluster, not
only the go command.

--detach (-d) starts up in the background, in a session of its own, and
returns once the cluster serves, having printed the table, or exits 1 with
the end of up's own log (up.log in --log-dir, where its output goes) if it
did not serve; "node down" stops it.

With --prompt, up instead sends that prompt to the router once the cluster
is up, prints the streamed answer, stops the cluster and exits with
generate's status: one command from nothing to an answer.

Exit codes: 0 stopped by a signal or node down (with --detach: the cluster
serves), 1 a node failed to start, no router is left, or an up runs at
--listen already, 2 usage error.`,
		RunE: func(cmd *cobra.Command, args []string) error { return runUp(cmd, args, o) },
	}
	fs := cmd.Flags()
	fs.IntVar(&o.Prefill, "prefill", o.Prefill, "prefill nodes to start")
	fs.IntVar(&o.Decode, "decode", o.Decode, "decode nodes to start")
	fs.IntVar(&o.Routers, "routers", o.Routers, "routers to start: the first on --listen, the others on free ports")
	fs.StringVar(&o.Listen, "listen", o.Listen, "host:port the router serves on: where node generate sends requests")
	fs.IntVar(&o.GossipBasePort, "gossip-base-port", o.GossipBasePort, "gossip port of the router on 127.0.0.1, which the other nodes join (0 picks a free port)")
	fs.StringVar(&o.LogDir, "log-dir", o.LogDir, "directory for the nodes' logs (default: a new temporary directory)")
	fs.DurationVar(&o.ReadyTimeout, "ready-timeout", o.ReadyTimeout, "bound on the start of the whole cluster, until every node sees every other alive")
	fs.DurationVar(&o.StopTimeout, "stop-timeout", o.StopTimeout, "how long a node may take to stop after SIGTERM before it is killed")
	fs.StringVar(&o.Prompt, "prompt", o.Prompt, "send this prompt once the cluster is up, print the answer, then stop the cluster")
	fs.StringVar(&o.Tenant, "tenant", o.Tenant, "tenant of the --prompt request")
	fs.IntVar(&o.MaxTokens, "max-tokens", o.MaxTokens, "most tokens to generate for --prompt")
	fs.StringVar(&o.Model, "model", o.Model, "every node's "+modelFlagHelp)
	fs.StringVar(&o.Tokenizer, "tokenizer", o.Tokenizer, tokenizerFlagHelp)
	fs.BoolVar(&o.Insecure, "insecure", o.Insecure, "run every node --insecure (no certificates, nobody authenticated)")
	fs.StringVar(&o.HTTP, "http", o.HTTP, "host:port router-0 serves the OpenAI-compatible API, probes and metrics on, router-i on its port plus i (empty: no API, and the probes and metrics on a free port; with --prompt, no API unless given)")
	fs.StringVar(&o.APIKey, "api-key", o.APIKey, "the API key of --tenant that the router's API accepts")
	fs.IntVar(&o.RestartsMax, "restarts-max", o.RestartsMax, "most restarts of one node within --restart-window; its next failure gives it up (0: restart none)")
	fs.DurationVar(&o.RestartWindow, "restart-window", o.RestartWindow, "how far back a node's restarts count against --restarts-max")
	fs.DurationVar(&o.RestartBackoff, "restart-backoff", o.RestartBackoff, "wait before a node's first restart within --restart-window, doubled for each further one")
	fs.BoolVarP(&o.Detach, "detach", "d", o.Detach, "run in the background: return once the cluster serves, with up's own output in --log-dir's up.log (node down stops it)")
	fs.IntVar(&o.ReadyFD, "ready-fd", o.ReadyFD, "descriptor to write the table on, then close, once the cluster serves (what --detach's starter reads)")
	_ = fs.MarkHidden("ready-fd")
	return cmd
}

// runUp is up's RunE: flags → checks → up, or its detached start.
func runUp(cmd *cobra.Command, args []string, o *upOptions) error {
	var err error
	if o.NodeArgs, err = nodeArgs(cmd, args); err != nil {
		return err
	}
	o.PromptGiven = cmd.Flags().Changed("prompt")
	switch {
	case o.Routers == 0:
		// Zero means one to callers of up; given on the command line, it
		// is a mistake.
		return usageError{fmt.Errorf("--routers (0) must be 1 to %d", upRoutersMax)}
	case o.Detach && o.PromptGiven:
		return usageError{errors.New("--detach leaves the cluster serving, --prompt stops it after one answer: give one of them")}
	case o.ReadyFD < 0 || o.ReadyFD > 0 && o.ReadyFD < 3:
		return usageError{fmt.Errorf("--ready-fd (%d) must be a descriptor past stderr (3 and up)", o.ReadyFD)}
	}
	if o.PromptGiven && !cmd.Flags().Changed("http") {
		// One answer, then the cluster stops: an API would be gone before
		// anyone could use it.
		o.HTTP = ""
	}
	if err := errors.Join(o.check(), o.restartPolicy.check()); err != nil {
		return usageError{err}
	}
	if err := checkNodes(*o); err != nil {
		return err
	}
	if err := o.checkModel(); err != nil {
		return err
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(signals)
	if err := stopWithGoRun(); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	if o.Detach {
		return detach(cmd, *o, cmd.OutOrStdout(), signals)
	}
	if o.ReadyFD > 0 {
		// Inherited without close-on-exec: the nodes must not hold it
		// open, or the starter would never read its end.
		syscall.CloseOnExec(o.ReadyFD)
		o.ready = os.NewFile(uintptr(o.ReadyFD), "ready")
	}
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
	return up(cmd.OutOrStdout(), log, *o, signals)
}

// nodeArgs are the arguments after "--", given to every node run; one
// before it is a usage error.
func nodeArgs(cmd *cobra.Command, args []string) ([]string, error) {
	at := cmd.ArgsLenAtDash()
	if at < 0 {
		at = len(args)
	}
	if err := noArgs(cmd, args[:at]); err != nil {
		return nil, err
	}
	return args[at:], nil
}

func (o upOptions) check() error {
	switch {
	case o.Prefill < 1 || o.Decode < 1:
		return fmt.Errorf("--prefill (%d) and --decode (%d) must be at least 1 each", o.Prefill, o.Decode)
	case o.Prefill+o.Decode > upNodesMax:
		return fmt.Errorf("--prefill (%d) and --decode (%d) add up to more than %d nodes", o.Prefill, o.Decode, upNodesMax)
	case o.Routers < 0 || o.Routers > upRoutersMax:
		return fmt.Errorf("--routers (%d) must be 1 to %d", o.Routers, upRoutersMax)
	case o.GossipBasePort < 0 || o.GossipBasePort > 65535:
		return fmt.Errorf("--gossip-base-port (%d) must be 0 to 65535", o.GossipBasePort)
	case o.ReadyTimeout <= 0 || o.StopTimeout <= 0:
		return fmt.Errorf("--ready-timeout (%s) and --stop-timeout (%s) must be positive", o.ReadyTimeout, o.StopTimeout)
	case o.PromptGiven && (o.MaxTokens < 1 || o.MaxTokens > messages.GenerateTokensMax):
		return fmt.Errorf("--max-tokens (%d) must be 1 to %d", o.MaxTokens, messages.GenerateTokensMax)
	case o.HTTP != "" && (o.APIKey == "" || len(o.APIKey) > httpapi.KeyBytesMax || strings.ContainsAny(o.APIKey, " \t\r\n")):
		return fmt.Errorf("--api-key is %d bytes; want 1 to %d without spaces", len(o.APIKey), httpapi.KeyBytesMax)
	}
	if o.HTTP != "" {
		if err := checkListen("--http", o.HTTP); err != nil {
			return err
		}
		if _, err := o.routerHTTP(o.routers() - 1); err != nil {
			return err
		}
		if o.APIKey == exampleAPIKey && !loopbackHost(o.HTTP) {
			return fmt.Errorf("--http %s is reachable from other machines and --api-key is the example key the README prints; "+
				"give one of your own with --api-key", o.HTTP)
		}
	}
	return checkListen("--listen", o.Listen)
}

// routers is how many routers up starts.
func (o upOptions) routers() int { return max(o.Routers, 1) }

// routerHTTP is where router i serves HTTP: --http's port plus i, or a free
// port for each when --http's is 0.
func (o upOptions) routerHTTP(i int) (string, error) {
	host, port, err := net.SplitHostPort(o.HTTP)
	if err != nil {
		return "", fmt.Errorf("--http %q: %w", o.HTTP, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("--http %q: port %q is not a number", o.HTTP, port)
	}
	if p != 0 {
		p += i
	}
	if p > 65535 {
		return "", fmt.Errorf("--http %s with --routers %d: router-%d would serve on port %d, beyond 65535", o.HTTP, o.routers(), i, p)
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// loopbackHost says whether host:port addr is on loopback only: an IP of
// it or localhost, not every interface (an empty or unspecified host).
func loopbackHost(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	return host == "localhost"
}

// checkModel loads --model and --tokenizer once, so that a wrong path or
// file fails before any node starts, and makes both paths absolute for the
// nodes.
func (o *upOptions) checkModel() error {
	if o.Model == "" && o.Tokenizer == "" {
		o.modelName = engine.BuiltinName
		return nil
	}
	m, err := nodeConfig{Model: o.Model, Tokenizer: o.Tokenizer, DType: kv.F32.String()}.model()
	if err != nil {
		return err
	}
	o.modelName = m.Name()
	for _, p := range []*string{&o.Model, &o.Tokenizer} {
		if *p == "" {
			continue
		}
		if *p, err = filepath.Abs(*p); err != nil {
			return fmt.Errorf("up: %w", err)
		}
	}
	if ctx := m.Config().ContextTokens; o.PromptGiven && o.MaxTokens >= ctx {
		return usageError{fmt.Errorf("--max-tokens (%d) leaves no room for a prompt in %s's %d-token context", o.MaxTokens, m.Name(), ctx)}
	}
	return nil
}

// up starts the cluster, prints it and waits; every node it started has
// exited when it returns.
func up(stdout io.Writer, log *slog.Logger, o upOptions, signals <-chan os.Signal) (err error) {
	bin, argv0, err := selfExecutable()
	if err != nil {
		return fmt.Errorf("up: finding this binary to start the nodes: %w", err)
	}
	release, err := claimPID(o.Listen)
	if err != nil {
		return err
	}
	defer release()
	if o.LogDir == "" {
		if o.LogDir, err = os.MkdirTemp("", "kvwarden-up-"); err != nil {
			return fmt.Errorf("up: %w", err)
		}
	} else if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
		return fmt.Errorf("up: --log-dir: %w", err)
	}
	log.Info("starting a local cluster", "routers", o.routers(), "prefill", o.Prefill, "decode", o.Decode, "logs", o.LogDir)
	c := &localCluster{bin: bin, argv0: argv0, o: o, log: log, exits: make(chan *child, o.routers()+o.Prefill+o.Decode)}
	c.args = c.upArgs
	if o.HTTP != "" {
		// Made anew each time: a --log-dir used before may hold another.
		c.keysPath = filepath.Join(o.LogDir, "api-keys.json")
		if err := os.Remove(c.keysPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("up: %w", err)
		}
		e := httpapi.KeyEntry{Name: "up", Tenant: o.Tenant, SHA256: httpapi.HashKey(o.APIKey)}
		if err := httpapi.AddKey(c.keysPath, e); err != nil {
			return fmt.Errorf("up: %w", err)
		}
	}
	c.creds.Insecure = o.Insecure
	if !o.Insecure {
		if c.creds.Dir, err = makeLocalCerts(localCertsDir(o.Listen), o.Prefill, o.Decode); err != nil {
			return err
		}
		defer os.RemoveAll(c.creds.Dir)
		if err := issueLocalRouters(c.creds.Dir, o.routers()); err != nil {
			return err
		}
		// Made once the routers serve, at the addresses they took.
		defer func() {
			for _, d := range c.credCopies {
				os.RemoveAll(d)
			}
		}()
		log.Info("credentials of the local cluster", "dir", c.creds.Dir)
	}
	if err := c.planPorts(upNodeNames(o)); err != nil {
		return err
	}
	defer func() {
		if stopErr := c.stop(); err == nil {
			err = stopErr
		}
	}()
	_, err = c.startAll(signals)
	if errors.Is(err, errSignalled) {
		log.Info("stopping the local cluster while it started")
		return nil
	}
	if err != nil {
		return err
	}
	if err := c.copyCredentials(); err != nil {
		return err
	}
	c.print(stdout)
	if o.ready != nil {
		c.print(o.ready)
		if err := o.ready.Close(); err != nil {
			return fmt.Errorf("up: handing the table to its starter: %w", err)
		}
	}
	if o.PromptGiven {
		return c.demo(stdout, signals)
	}
	return newSupervisor(c, stdout).run(signals)
}

// demo sends the --prompt request to the router and prints its answer as
// "node generate" would; a signal cancels it.
func (c *localCluster) demo(stdout io.Writer, signals <-chan os.Signal) error {
	g := generateOptions{Endpoint: strings.Join(c.routerAddrs(), ","), Tenant: c.o.Tenant, Prompt: c.o.Prompt, PromptGiven: true, MaxTokens: c.o.MaxTokens,
		NoAnswerAfter: client.DefaultNoAnswerAfter, creds: c.creds}
	prompt, err := g.check(nil)
	if err != nil {
		return usageError{err}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-signals:
			cancel()
		case <-ctx.Done():
		}
	}()
	endpoint := ""
	if c.o.routers() > 1 {
		endpoint = " --endpoint " + g.Endpoint
	}
	fmt.Fprintf(stdout, "\n$ node generate%s --tenant %s --max-tokens %d --prompt %q\n", endpoint, g.Tenant, g.MaxTokens, prompt)
	return generate(ctx, stdout, stdout, g, prompt)
}

// errSignalled is SIGINT or SIGTERM while the cluster starts: up stops
// what it started and exits 0, as it would once the cluster is up.
var errSignalled = errors.New("up: stopped by a signal")

// upArgs are the addresses up gives a node: router-0 serves on --listen
// and gossips at --gossip-base-port; the other routers serve on the ports
// planPorts drew for them, the other nodes on free ports of loopback, and
// all join router-0's gossip address, join. Each node serves HTTP (probes
// and metrics) where planPorts says, and a router the API too when up has
// keys.
func (c *localCluster) upArgs(name, role, join string) []string {
	var args []string
	if c.o.Model != "" {
		args = []string{"--model", c.o.Model}
	}
	if c.o.Tokenizer != "" {
		args = append(args, "--tokenizer", c.o.Tokenizer)
	}
	if addr := c.http[name]; addr != "" {
		args = append(args, "--http", addr)
		if role == "router" && c.keysPath != "" {
			args = append(args, "--api-keys", c.keysPath)
		}
	}
	switch {
	case role != "router":
		return append(args, "--listen", "127.0.0.1:0", "--gossip", "127.0.0.1:0", "--data", "127.0.0.1:0", "--join", join)
	case join == "":
		return append(args, "--listen", c.o.Listen, "--gossip", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.o.GossipBasePort)))
	}
	listen := c.listen[name]
	if listen == "" {
		host, _, _ := net.SplitHostPort(c.o.Listen) // checked with the options
		listen = net.JoinHostPort(host, "0")
	}
	return append(args, "--listen", listen, "--gossip", "127.0.0.1:0", "--join", join)
}

// planPorts chooses the ports up's nodes keep across restarts: each
// node's HTTP port (router-i's is --http's port plus i, unless that is 0
// or --http is empty; every other one a free port of loopback, drawn
// where the kernel does not hand out ports, so that a restarted node finds
// it free) and the address of each router beyond the first (a free port
// of --listen's host), which its clients and credentials are tied to.
func (c *localCluster) planPorts(names []string) error {
	ports := fixedPorts{avoid: c.o.givenPorts()}
	defer ports.release()
	c.http, c.listen = map[string]string{}, map[string]string{}
	listenHost, _, _ := net.SplitHostPort(c.o.Listen) // checked with the options
	for _, name := range names {
		role, index, _ := strings.Cut(name, "-")
		i, _ := strconv.Atoi(index)
		var err error
		if role == "router" && i > 0 {
			if c.listen[name], err = ports.take(listenHost); err != nil {
				return fmt.Errorf("up: %s: %w", name, err)
			}
		}
		host, port := "127.0.0.1", "0"
		if role == "router" && c.o.HTTP != "" {
			addr, _ := c.o.routerHTTP(i) // checked with the options
			host, port, _ = net.SplitHostPort(addr)
		}
		if c.http[name] = net.JoinHostPort(host, port); port == "0" {
			if c.http[name], err = ports.take(host); err != nil {
				return fmt.Errorf("up: %s: %w", name, err)
			}
		}
	}
	return nil
}

// givenPorts are the ports of up's flags that nodes will listen on:
// --listen's, --gossip-base-port and the routers' HTTP ports.
func (o upOptions) givenPorts() map[int]bool {
	given := map[int]bool{o.GossipBasePort: true}
	addrs := []string{o.Listen}
	for i := range o.routers() {
		if addr, err := o.routerHTTP(i); err == nil {
			addrs = append(addrs, addr)
		}
	}
	for _, a := range addrs {
		if _, port, err := net.SplitHostPort(a); err == nil {
			n, _ := strconv.Atoi(port)
			given[n] = true
		}
	}
	delete(given, 0)
	return given
}

// upNodeNames are the names of up's nodes: its routers, then nodeNames.
func upNodeNames(o upOptions) []string {
	names := nodeNames(o.Prefill, o.Decode)
	for i := 1; i < o.routers(); i++ {
		names = append(names, fmt.Sprintf("router-%d", i))
	}
	return names
}

// startAll starts router-0, then the other routers and the prefill and
// decode nodes joining it, and waits until every node sees every other
// alive. It returns router-0.
func (c *localCluster) startAll(signals <-chan os.Signal) (*child, error) {
	deadline := time.Now().Add(c.o.ReadyTimeout)
	router, err := c.start("router-0", "router", c.args("router-0", "router", ""))
	if err != nil {
		return nil, err
	}
	if err := c.waitReady([]*child{router}, deadline, signals); err != nil {
		return nil, err
	}
	var workers []*child
	for _, w := range []struct {
		role         string
		first, count int
	}{{"router", 1, c.o.routers()}, {"prefill", 0, c.o.Prefill}, {"decode", 0, c.o.Decode}} {
		for i := w.first; i < w.count; i++ {
			name := fmt.Sprintf("%s-%d", w.role, i)
			ch, err := c.start(name, w.role, c.args(name, w.role, router.gossip))
			if err != nil {
				return nil, err
			}
			workers = append(workers, ch)
		}
	}
	if err := c.waitReady(workers, deadline, signals); err != nil {
		return nil, err
	}
	return router, c.waitConverged(deadline, signals, c.exits)
}

// localCluster is the nodes up started, in start order.
type localCluster struct {
	// bin is the binary the nodes run, argv0 their argv[0] when not bin.
	bin, argv0 string
	o          upOptions
	creds      credFlags // the nodes' credentials directory, or insecure
	log        *slog.Logger
	// args are the address flags of the node name of role, given the
	// router's gossip address join (empty for the router itself).
	args  func(name, role, join string) []string
	nodes []*child
	exits chan *child // each node once, when it exits
	// keysPath is the routers' API keys file; empty without --http.
	keysPath string
	// credCopies are the copies of the credentials directory made for the
	// routers beyond the first, at their addresses.
	credCopies []string
	// http and listen are where planPorts put each node's HTTP and each
	// router's address beyond the first, by node name (empty: a free port
	// each time it starts, or no HTTP).
	http, listen map[string]string
}

// routerAddrs are the addresses the routers serve on, router-0 first.
func (c *localCluster) routerAddrs() []string {
	var out []string
	for _, ch := range c.nodes {
		if ch.role == "router" {
			out = append(out, ch.addr)
		}
	}
	return out
}

// child is one node process.
type child struct {
	name, role string
	argv       []string // of this binary: run --role …
	cmd        *exec.Cmd
	logPath    string
	ready      chan string // the first line of stdout; closed at EOF
	exited     chan struct{}
	err        error // cmd.Wait's, once exited is closed

	// From the readiness line; http is empty when the node serves none.
	addr, gossip, http string
	incarnation        uint64
}

// readinessHTTP is where the readiness line's last part says the node
// serves HTTP.
var readinessHTTP = regexp.MustCompile(`, http (\S+)$`)

// start starts one node run with its log in the log directory.
func (c *localCluster) start(name, role string, args []string) (*child, error) {
	argv := append(append([]string{"run", "--role", role}, args...), c.o.NodeArgs...)
	if c.creds.Insecure {
		argv = append(argv, "--insecure")
	} else {
		argv = append(argv, "--certs", c.creds.Dir, "--cert", name)
	}
	ch, err := c.spawn(&child{name: name, role: role, argv: argv, logPath: filepath.Join(c.o.LogDir, name+".log")}, os.O_TRUNC)
	if err != nil {
		return nil, err
	}
	c.nodes = append(c.nodes, ch)
	return ch, nil
}

// spawn runs ch.argv, stderr to ch.logPath (opened with mode: os.O_TRUNC
// or os.O_APPEND), and starts reading its stdout and waiting for it.
func (c *localCluster) spawn(ch *child, mode int) (*child, error) {
	ch.ready, ch.exited = make(chan string, 1), make(chan struct{})
	logFile, err := os.OpenFile(ch.logPath, os.O_WRONLY|os.O_CREATE|mode, 0o666)
	if err != nil {
		return nil, fmt.Errorf("up: %w", err)
	}
	defer logFile.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("up: %w", err)
	}
	ch.cmd = exec.Command(c.bin, ch.argv...)
	if c.argv0 != "" {
		ch.cmd.Args[0] = c.argv0
	}
	ch.cmd.Stdout, ch.cmd.Stderr = w, logFile
	ch.cmd.SysProcAttr = childProcAttr()
	err = ch.cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("up: starting %s: %w", ch.name, err)
	}
	c.log.Info("started", "node", ch.name, "pid", ch.cmd.Process.Pid, "log", ch.logPath)
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		if sc.Scan() {
			ch.ready <- sc.Text()
		}
		close(ch.ready)
		for sc.Scan() { // node run prints nothing more; read it anyway so it never blocks
		}
	}()
	go func() {
		ch.err = ch.cmd.Wait()
		close(ch.exited)
		c.exits <- ch
	}()
	return ch, nil
}

// waitReady reads each node's readiness line.
func (c *localCluster) waitReady(nodes []*child, deadline time.Time, signals <-chan os.Signal) error {
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for _, ch := range nodes {
		select {
		case line, ok := <-ch.ready:
			if !ok {
				<-ch.exited
				return ch.failure("exited before it served")
			}
			if err := ch.parseReady(line); err != nil {
				return err
			}
			c.log.Info("serving", "node", ch.name, "address", ch.addr,
				"progress", fmt.Sprintf("%d of %d nodes serving", c.serving(), c.o.routers()+c.o.Prefill+c.o.Decode))
		case <-ch.exited:
			return ch.failure("exited before it served")
		case <-signals:
			return errSignalled
		case <-timeout.C:
			return ch.failure(fmt.Sprintf("did not serve within --ready-timeout %s", c.o.ReadyTimeout))
		}
	}
	return nil
}

// serving is how many of the nodes started have printed their readiness
// line.
func (c *localCluster) serving() int {
	n := 0
	for _, ch := range c.nodes {
		if ch.addr != "" {
			n++
		}
	}
	return n
}

func (ch *child) parseReady(line string) error {
	m := readinessLine.FindStringSubmatch(line)
	if m == nil {
		return ch.failure(fmt.Sprintf("printed %q, not its readiness line", line))
	}
	inc, err := strconv.ParseUint(m[2], 16, 64)
	if err != nil {
		return ch.failure(fmt.Sprintf("printed incarnation %q: %v", m[2], err))
	}
	ch.addr, ch.incarnation, ch.gossip = m[1], inc, m[4]
	if h := readinessHTTP.FindStringSubmatch(m[5]); h != nil {
		ch.http = h[1]
	}
	return nil
}

// waitConverged waits until every node sees every node alive: the router
// routes by its own view, and a decode node picks prefill nodes by its
// own. A node's exit, on exits (nil: none), ends the wait with its failure.
func (c *localCluster) waitConverged(deadline time.Time, signals <-chan os.Signal, exits <-chan *child) error {
	auth, err := c.creds.authority(c.log, trust.RoleOperator, "")
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	cc, err := dialControl("127.0.0.1", auth)
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	defer cc.close()
	tick := time.NewTicker(upPollInterval)
	defer tick.Stop()
	start, said := time.Now(), time.Time{}
	for {
		lagging := c.lagging(cc, deadline)
		if lagging == nil {
			c.log.Info("cluster formed: every node sees every other alive", "nodes", len(c.nodes),
				"after", time.Since(start).Round(time.Millisecond))
			return nil
		}
		if time.Since(said) >= time.Second {
			c.log.Info("waiting for the cluster to form", "progress", lagging.Error())
			said = time.Now()
		}
		select {
		case <-tick.C:
		case ch := <-exits:
			return ch.failure("exited while the cluster formed")
		case <-signals:
			return errSignalled
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("up: the cluster did not form within --ready-timeout %s: %s", c.o.ReadyTimeout, lagging)
		}
	}
}

// lagging is nil when every node sees every node alive, else what the
// first node that does not says.
func (c *localCluster) lagging(cc *controlClient, deadline time.Time) error {
	for _, ch := range c.nodes {
		s, err := cc.status(ch.addr, min(max(time.Until(deadline), time.Millisecond), statusPollTimeout))
		if err != nil {
			return err
		}
		alive := map[uint64]bool{}
		for _, m := range s.Members {
			alive[m.Incarnation] = m.State == messages.MemberAlive
		}
		for _, other := range c.nodes {
			if !alive[other.incarnation] {
				return fmt.Errorf("%s does not see %s (incarnation %016x) alive yet", ch.name, other.name, other.incarnation)
			}
		}
	}
	return nil
}

// print writes the table of nodes and how to use the cluster.
func (c *localCluster) print(w io.Writer) {
	routers := c.routerAddrs()
	endpoint, status := "", ""
	if c.o.Listen != defaultEndpoint || len(routers) > 1 {
		endpoint, status = " --endpoint "+strings.Join(routers, ","), " --endpoint "+routers[0]
		if !c.creds.Insecure && c.o.Listen != defaultEndpoint {
			endpoint += " --certs " + c.creds.Dir
			status += " --certs " + c.creds.Dir
		}
	}
	what := "router on " + routers[0]
	if len(routers) > 1 {
		what = fmt.Sprintf("%d routers on %s", len(routers), strings.Join(routers, ", "))
	}
	fmt.Fprintf(w, "local cluster up: %s, %d prefill and %d decode nodes; logs in %s\n\n", what, c.o.Prefill, c.o.Decode, c.o.LogDir)
	c.printNodes(w)
	fmt.Fprintf(w, "\nsend a request:  node generate%s --tenant acme --prompt \"hello\"\n", endpoint)
	if r := c.nodes[0]; c.keysPath != "" {
		fmt.Fprintf(w, "or over HTTP:    curl -s http://%s/v1/completions -H 'Authorization: Bearer %s' "+
			"-H 'Content-Type: application/json' -d '{\"model\": %q, \"prompt\": \"hello\", \"max_tokens\": 32}'\n",
			r.http, c.o.APIKey, c.o.modelName)
		fmt.Fprintf(w, "OpenAI base URL: http://%s/v1 (API key %s, tenant %s); metrics http://%s/metrics\n", r.http, c.o.APIKey,
			c.o.Tenant, r.http)
		for _, ch := range c.nodes[1:] {
			if ch.role == "router" {
				fmt.Fprintf(w, "                 http://%s/v1 through %s\n", ch.http, ch.name)
			}
		}
	}
	fmt.Fprintf(w, "metrics:         http://<its HTTP>/metrics of each node, /readyz and /healthz its probes\n")
	fmt.Fprintf(w, "see the cluster: node status%s\n", status)
	fmt.Fprintf(w, "drain a node:    node drain --endpoint <its address> --wait (it stays down)\n")
	if !c.o.PromptGiven {
		fmt.Fprintf(w, "a node that fails is restarted, at most %d times within %s; then it is given up and the others serve on\n",
			c.o.RestartsMax, c.o.RestartWindow)
	}
	stop := "node down"
	if c.o.Listen != defaultEndpoint {
		stop += " --listen " + c.o.Listen
	}
	if c.o.ready == nil {
		stop = "Ctrl-C, or " + stop
	}
	fmt.Fprintf(w, "stop:            %s (up is pid %d)\n", stop, os.Getpid())
}

// printNodes writes the table of the nodes.
func (c *localCluster) printNodes(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tADDRESS\tGOSSIP\tHTTP\tINCARNATION\tPID\tLOG")
	for _, ch := range c.nodes {
		http := ch.http
		if http == "" {
			http = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%016x\t%d\t%s\n", ch.name, ch.role, ch.addr, ch.gossip, http, ch.incarnation,
			ch.cmd.Process.Pid, ch.logPath)
	}
	tw.Flush()
}

// makeLocalCerts makes the throwaway credentials of a local cluster of
// prefill and decode nodes in dir (localCertsDir of its router's address,
// where the commands find them): a CA, the gossip keyring, a certificate
// for each node (named as up names the node) and one for an operator.
// What an earlier up left there is replaced; a directory up did not make
// is not touched.
func makeLocalCerts(dir string, prefill, decode int) (string, error) {
	if err := clearLocalDir(dir); err != nil {
		return "", err
	}
	// The CA outlives what it issues, tenants' certificates issued later
	// included.
	ca, err := trust.NewCA("local", 2*localValidFor, time.Now())
	if err != nil {
		return "", err
	}
	// Made here, not found: a directory someone else made in between is an
	// error, not a home for the keys.
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("up: %w", err)
	}
	if err := writeLocalCerts(dir, ca, prefill, decode); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// clearLocalDir removes what an earlier up left at dir; a directory up did
// not make is an error, and is not touched.
func clearLocalDir(dir string) error {
	if _, err := os.Lstat(dir); err != nil {
		return nil
	}
	if !isLocalDir(dir) {
		return fmt.Errorf("up: %s exists and was not made by node up (or is readable by others); remove it", dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	return nil
}

// writeLocalCerts fills makeLocalCerts's directory.
func writeLocalCerts(dir string, ca *trust.CA, prefill, decode int) error {
	if err := ca.WriteCA(dir); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, localMarker), []byte("made by node up; removed when it stops\n"), 0o600); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	ids := []trust.Identity{{Role: trust.RoleRouter, Name: "0"}, {Role: trust.RoleOperator, Name: "admin"}}
	for i := range prefill {
		ids = append(ids, trust.Identity{Role: trust.RolePrefill, Name: strconv.Itoa(i)})
	}
	for i := range decode {
		ids = append(ids, trust.Identity{Role: trust.RoleDecode, Name: strconv.Itoa(i)})
	}
	for _, id := range ids {
		id.Cluster = ca.Cluster
		if err := issue(io.Discard, dir, ca, id, []string{"127.0.0.1"}, localValidFor); err != nil {
			return err
		}
	}
	return nil
}

// issueLocalRouters adds the certificates of routers 1 to n-1 to the
// credentials makeLocalCerts made in dir (which holds router-0's).
func issueLocalRouters(dir string, n int) error {
	if n < 2 {
		return nil
	}
	ca, err := trust.LoadCA(dir)
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	for i := 1; i < n; i++ {
		id := trust.Identity{Cluster: ca.Cluster, Role: trust.RoleRouter, Name: strconv.Itoa(i)}
		if err := issue(io.Discard, dir, ca, id, []string{"127.0.0.1"}, localValidFor); err != nil {
			return err
		}
	}
	return nil
}

// copyCredentials makes a copy of the credentials directory at
// localCertsDir of each router's address beyond the first, so that the
// commands given that address find them with no flags, as they find
// router-0's. A directory there that up did not make is an error, as for
// router-0's.
func (c *localCluster) copyCredentials() error {
	if c.creds.Insecure {
		return nil
	}
	for _, addr := range c.routerAddrs() {
		dst := localCertsDir(addr)
		if dst == c.creds.Dir {
			continue
		}
		if err := clearLocalDir(dst); err != nil {
			return err
		}
		if err := os.Mkdir(dst, 0o700); err != nil {
			return fmt.Errorf("up: %w", err)
		}
		c.credCopies = append(c.credCopies, dst)
		if err := copyFiles(c.creds.Dir, dst); err != nil {
			return err
		}
	}
	return nil
}

// copyFiles copies the regular files of src into dst, readable by this
// user only.
func copyFiles(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return fmt.Errorf("up: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o600); err != nil {
			return fmt.Errorf("up: %w", err)
		}
	}
	return nil
}

// stop stops every node still running: the routers first, so that no new
// request comes in, then the prefill and decode nodes. Each gets SIGTERM
// and, after StopTimeout, SIGKILL; stop returns when all have exited.
func (c *localCluster) stop() error {
	var routers, others []*child
	for _, ch := range c.nodes {
		if ch.role == "router" {
			routers = append(routers, ch)
		} else {
			others = append(others, ch)
		}
	}
	return errors.Join(c.stopAll(routers), c.stopAll(others))
}

func (c *localCluster) stopAll(nodes []*child) error {
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	for i, ch := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.stopOne(ch)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (c *localCluster) stopOne(ch *child) error {
	select {
	case <-ch.exited:
		return nil // its exit, if early, is reported by whoever saw it
	default:
	}
	// An error means the process has exited meanwhile.
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ch.exited:
		c.log.Info("stopped", "node", ch.name, "exit", exitStatus(ch.err))
		return nil
	case <-time.After(c.o.StopTimeout):
	}
	_ = ch.cmd.Process.Kill()
	<-ch.exited
	return fmt.Errorf("up: %s did not stop within %s of SIGTERM and was killed; its log is %s",
		ch.name, c.o.StopTimeout, ch.logPath)
}

// failure is the error of a node that failed, with the end of its log.
func (ch *child) failure(what string) error {
	status := "still running"
	select {
	case <-ch.exited:
		status = exitStatus(ch.err)
	default:
	}
	return fmt.Errorf("up: %s %s (%s); the end of its log %s:\n%s", ch.name, what, status, ch.logPath, tail(ch.logPath))
}

func exitStatus(err error) string {
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return "exit 0"
	case errors.As(err, &exitErr):
		return exitErr.ProcessState.String()
	}
	return err.Error()
}

// tail is the last stderrTailBytes of the file at path, from a line start.
func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := max(info.Size()-stderrTailBytes, 0)
	data, err := io.ReadAll(io.NewSectionReader(f, off, info.Size()-off))
	if err != nil {
		return err.Error()
	}
	s := string(data)
	if off > 0 {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return strings.TrimRight(s, "\n")
}
