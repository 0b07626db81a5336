// Package bench is the pure core of "node bench" and "node plan": the
// workload a benchmark sends (prompt and output length distributions, or
// prompts from a JSONL file), the times it sends them at (a Poisson
// process drawn from a seed), the statistics of what came back (TTFT,
// inter-token latency, end-to-end latency, their percentiles, throughput
// and goodput under SLOs), and the capacity planner's model: a
// discrete-event simulation of a cluster of prefill, decode and colocated
// nodes fed measured per-node figures (a Profile).
//
// # Common path
//
// A Workload (lengths, tenants, a seed) gives Shapes, the distinct requests
// of a run, and Draw picks the shape of every request in order. Poisson
// gives the send times of an open-loop run at a rate, bounded by a
// duration or a count. The caller sends them, times each answer into a
// Sample and, at the end, Summarize computes a Summary. Predict runs the
// same arrivals (same seed, same Poisson draw) through the simulated
// Layout and returns the Summary it expects; Plan does so for every way of
// splitting N nodes and recommends one.
//
// # Contract
//
// Nothing here starts a goroutine, reads a clock or does I/O: time is an
// argument (offsets from a run's start), randomness comes from a
// *rand.Rand the caller seeds, and parsing takes bytes. Every value is
// safe to share once built; a *rand.Rand is not. The same seed gives the
// same workload, the same arrivals and the same prediction, on every
// machine.
package bench
