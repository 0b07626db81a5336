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
// validates everything before any device is touched.
//
// "node preflight" discovers the devices, sizes each KV pool and refuses the
// node when a pool is smaller than the context window it would advertise.
//
// "node run" starts one node (actors.Start) with its own prefill and decode
// workers on --listen (default 127.0.0.1:7070). Before it serves it makes
// preflight's check for its own pools, each a configured pool of pages ×
// page tokens: the advertised context window must fit every pool. It then
// prints exactly one line to stdout, "serving on <address> (incarnation
// <hex>)", logs to stderr and serves until SIGINT or SIGTERM. --role accepts
// only "all" until cluster mode.
//
// "node generate" sends one prompt to a node (client.Dial) and prints the
// text as the tokens arrive, then a summary to stderr.
//
// Exit codes: 0 success, 1 the command ran and failed (preflight refused
// the node, discovery failed, the node refused a request), 2 usage error
// (flags, arguments, configuration), 70 an actor broke an invariant and the
// node stopped, 130 Ctrl-C interrupted a request. An error that decides its
// own code implements exitCoder; any other error is 1.
//
// # Concurrency and ownership
//
// One command runs per process, on the main goroutine. run takes its
// arguments and output writers as parameters so tests can call it in
// process. "node run" owns its Node from start to stop: the main goroutine
// waits for a signal or an invariant failure and then stops it. "node
// generate" receives tokens on the client's goroutine; tokenPrinter
// serializes them with the final newline.
package main
