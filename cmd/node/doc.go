// Command node is the single kvwarden binary: it checks, runs and inspects
// nodes of a disaggregated inference cluster.
//
// # Common path
//
// main builds a cobra root command named node and adds every subcommand
// listed in subcommands; each subcommand lives in its own file and exposes a
// newXCmd constructor. A subcommand's RunE goes flags → config → validate →
// run: nodeConfig holds the settings, --config reads them from a JSON file,
// flags given on the command line override the file, and nodeConfig.build
// (preflight) or nodeConfig.clusterNode (run) validates everything before
// any device is touched or any port is listened on.
//
// "node preflight" discovers the devices, sizes each KV pool and refuses the
// node when a pool is smaller than the context window it would advertise.
//
// "node run" starts one node of a role (cluster.StartNode) on --listen
// (default 127.0.0.1:7070 for a router or role all, a free port of loopback
// for prefill and decode): "all" (its own prefill and decode workers and
// admission; with no --join it serves alone), "prefill", "decode" (admission,
// decode workers and the KV data plane on --data) or "router" (admits and
// routes, holds no pages). It gossips membership on --gossip, an IP:port
// (default 127.0.0.1:0; loopback gets cluster.DefaultLocalNodeConfig's fast
// timers, any other address the LAN timers), and joins the cluster through
// the gossip addresses given to --join. Before it serves it makes
// preflight's check for the pools its role holds, each a configured pool of
// pages × page tokens: the advertised context window must fit every pool.
// It authenticates every peer with the certificates of --certs (see "node
// certs"), or nobody with an explicit --insecure. It then prints exactly one
// line to stdout, "serving on <address> (incarnation <hex>, role <role>,
// gossip <address>, as <identity>)", logs to stderr and
// serves until SIGINT or SIGTERM (it leaves the cluster gracefully and
// exits 0) or until it has been drained and has left (exit 0). Behind a
// proxy, --advertise and --data-advertise are the addresses peers reach.
// A binary built with -tags chaos has fault points, which --faults turns
// on (the readiness line then ends ", FAULTS <spec>"); any other refuses
// --faults. --http serves the probes and metrics (package httpapi; the
// readiness line then ends ", http <address>"), and on a router or a node
// of role all, with --api-keys, the OpenAI-compatible API, whose requests
// enter the node's own admission actor as local requests of the key's
// tenant (client.New); SIGHUP reads the keys file again.
//
// "node keys new" makes an API key, adds its hash to a keys file
// (httpapi.AddKey) and prints the key.
//
// "node up" starts a local cluster on loopback as child processes of the
// same binary (os.Executable): a router on --listen gossiping at
// --gossip-base-port, then --prefill prefill and --decode decode nodes on
// free ports that join through it. Arguments after "--" go to every node
// run. Each child's stderr goes to <name>.log in --log-dir (a new temporary
// directory unless given), which up prints; every node serves its probes
// and metrics on an HTTP port up chooses (planPorts) and keeps across
// restarts. Up reads each child's readiness line, waits until every node
// sees every other alive, prints a table of the nodes (and, with --http,
// the routers' API with one key, --api-key, in api-keys.json in the log
// directory), then supervises them (supervisor): a node that fails is
// started again after a backoff, with its first flags, joining the nodes
// that serve, until it has failed --restarts-max times within
// --restart-window and is given up; one that exits 0 (drained) stays down;
// with no router left up exits 1 with the end of that router's log. On
// SIGINT or SIGTERM it stops them (routers first; SIGTERM, then SIGKILL
// after --stop-timeout) and exits 0. Children run in their own process
// group and, on Linux, die with up (Pdeathsig).
//
// "node status" asks a node's control actor (cluster.ControlName) for its
// StatusReply and prints the node, its pools and the members it sees alive
// (--json: the reply as JSON; --watch: a compact table every --interval,
// with what moved since the one before, until SIGINT or SIGTERM). "node
// drain" asks a node to drain; with --wait it watches the node until it has
// left. "node requests" lists a node's requests in flight (ListInFlight),
// each named INCARNATION-NUMBER, the node's run and its own number for the
// request, which "node cancel" takes (CancelInFlight). All of them talk
// through controlClient, an actor system with its own protoactor remote
// endpoint on the local address that reaches the node, since nodes answer
// by sending to the requester's address.
//
// "node generate" sends one prompt to a node, or to any of several
// routers (client.DialEndpoints: a request whose router dies goes on
// through another), and prints the text as the tokens arrive, then a
// summary to stderr.
//
// "node chaos" runs a chaos campaign (package chaos/live): a seeded
// multi-tenant workload under a seeded fault schedule, every answer
// checked against the reference engine and every pool read afterwards.
// It starts its own cluster with node up's code (localCluster: a throwaway
// CA, each node on fixed ports behind toxiproxy proxies it advertises,
// restarted on the same ones after a kill) or targets a running one at
// --endpoint; it exits 3 when it found a violation.
//
// drain --wait asks without Wait and watches the node until it no longer
// answers as the run it drained, which also covers a node restarted at the
// same address and one that died during the drain.
//
// Exit codes: 0 success, 1 the command ran and failed (preflight refused
// the node, discovery failed, the node refused a request), 2 usage error
// (flags, arguments, configuration), 70 an actor broke an invariant and the
// node stopped, 3 node chaos found a violation, 130 Ctrl-C interrupted a
// request. "node up" exits 1 when a
// node fails to start or no router is left; status and drain exit 1 when the node cannot be reached. An
// error that decides its own code implements exitCoder; any other error
// is 1.
//
// # Concurrency and ownership
//
// One command runs per process, on the main goroutine. run takes its
// arguments and output writers as parameters so tests can call it in
// process. "node run" owns its Node from start to stop: the main goroutine
// waits for a signal, the end of a drain or an invariant failure and then
// stops it. "node up" owns its children: one goroutine per child reads its
// readiness line and one waits for its exit; the supervisor's goroutines
// only wait (a backoff, a restarted child's readiness) and report back; the
// main goroutine alone starts, watches, restarts and stops them, and every
// child has exited when up returns. "node generate" receives tokens on the client's goroutine;
// tokenPrinter serializes them with the final newline.
package main
