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
// Exit codes: 0 success, 1 the command ran and failed (preflight refused
// the node, discovery failed), 2 usage error (flags, arguments,
// configuration).
//
// # Concurrency and ownership
//
// One command runs per process, on the main goroutine. run takes its
// arguments and output writers as parameters so tests can call it in
// process.
package main
