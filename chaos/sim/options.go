package sim

import (
	"fmt"
	"io"
	"time"
)

// Options are one simulated cluster, its workload, its timings and the
// faults a run may draw. Validate runs in Run before anything is built.
type Options struct {
	// PrefillNodes and DecodeNodes are the nodes of each role, at least 1
	// each; DecodeWorkers the decode workers of every decode node, at
	// least 1.
	PrefillNodes, DecodeNodes, DecodeWorkers int
	// Requests is the number of client requests of a run, at least 1, from
	// Tenants tenants (1 to 26).
	Requests, Tenants int
	// PageTokens is the page size of every pool, in tokens, at least 1.
	PageTokens int
	// PrefillPagesMin..PrefillPagesMax and DecodePagesMin..DecodePagesMax
	// bound each pool's size, in pages, drawn per node and run: pools of
	// different sizes put the smallest pool of a path to the test.
	PrefillPagesMin, PrefillPagesMax int
	DecodePagesMin, DecodePagesMax   int
	// PromptTokensMax bounds an ordinary prompt, in tokens (oversize
	// prompts go past every bound on purpose); MaxTokensMax bounds the
	// tokens a request asks for, and is admission's MaxTokensMax.
	PromptTokensMax, MaxTokensMax int
	// ContextTokens is the model's context window, in tokens: the
	// simulator's model is a one-layer transformer of width 32, so that a
	// run costs milliseconds.
	ContextTokens int
	// PrefixCachePercent is the most of each prefill pool its prefix
	// cache keeps, in percent (0 to 100; 0 runs prefill without one), as
	// a node's --prefix-cache-percent: small pools make small caches, so
	// that evictions race the leases of the prefills that read them.
	PrefixCachePercent int
	// DecodeCachePercent is the most of a decode pool its prefix cache
	// keeps, in percent (0 to 100), as a node's --decode-cache-percent,
	// for the decode nodes that keep one: each decode node draws, once
	// for the world, whether it does (three in four), so that a world
	// runs answered requests that release their prompt pages beside
	// those that hand them to a cache. 0 runs every decode node without.
	DecodeCachePercent int
	// Prefixes is how many prompt prefixes the workload shares among
	// requests of every tenant, cache salt and scope, so that prefills
	// hit their own scope's pages and probe other scopes' (0 for none).
	Prefixes int
	// BatchPagesMax is the most frames one batch carries on the data
	// plane, at least 1.
	BatchPagesMax int
	// StepsMax bounds the steps of a run: a run that has not quiesced by
	// then fails its liveness check.
	StepsMax int
	// Timing is the simulated clock's side of the configuration.
	Timing Timing
	// Faults are the faults a run may inject.
	Faults Faults
	// Trace, when not nil, receives every step: the event, the machine it
	// went to and every effect, one line each.
	Trace io.Writer
}

// Timing are the durations of the simulated world.
type Timing struct {
	// Arrivals is the window, from the start, in which clients send their
	// requests.
	Arrivals time.Duration
	// Latency is the base one-way delay of a message, Jitter the most
	// added to it at random (which reorders messages on its own).
	Latency, Jitter time.Duration
	// PrefillPerToken is prefill's compute time per prompt token;
	// DecodeStep one decode step; BatchGap the time between two batches of
	// one send.
	PrefillPerToken, DecodeStep, BatchGap time.Duration
	// Tick is how often every node ticks its pool.
	Tick time.Duration
	// RequestTimeout, PrefillTimeout, ReserveWait and ReserveRetry are the
	// decode nodes' handoff.RequestConfig timers.
	RequestTimeout, PrefillTimeout, ReserveWait, ReserveRetry time.Duration
	// ReclaimAfter and OwnedTimeout are every pool's deadlines (kv.Config);
	// OwnedTimeout must be longer than RequestTimeout, since a request
	// owns its pages that long.
	ReclaimAfter, OwnedTimeout time.Duration
	// DoneFor is how long a prefill source remembers a plan that ended.
	DoneFor time.Duration
	// Detect is the most membership takes to report a node that died, or
	// one that (re)started.
	Detect time.Duration
}

// Faults are the probabilities of each fault. A run draws which of the
// enabled kinds it injects (each with probability 3/4, so that runs differ
// in what they combine, as in swarm testing) and where.
type Faults struct {
	// Per message (frame batches and control messages: plan, done, ack,
	// abort): lost, delivered twice, delayed past the prefill timeout,
	// delayed a little (so that later ones overtake it), delivered to
	// another node or request. Reorder also has an answered request's
	// Keep carried out at once, before its decode worker closed its
	// sequence.
	Drop, Duplicate, Delay, Reorder, Misdirect float64
	// Corrupt is per frame batch: one to three bits of the encoded batch
	// flipped.
	Corrupt float64
	// Per run, the chance of each of up to three events: a partition
	// between two nodes for a while, a crash (and restart with a new
	// incarnation), a pool shrunk by a dummy owner for a while, a jump of
	// the clock past the reclaim deadlines, a bit flipped in a sealed page
	// at rest before its reader verifies it. BitFlip also flips, with a
	// quarter of its probability, a bit of each held copy a decode node
	// makes from its cache, before the copy is sealed.
	Partition, Crash, Shrink, ClockJump, BitFlip float64
	// Per request: a prompt too long for its path, a cancellation.
	Oversize, Cancel float64
	// Move is per request, the chance of up to three asks (an operator's
	// node migrate) that its decode node move it, KV and all, to another
	// decode node while it decodes; and per run, of a drain's: every
	// request of one decode node asked to move at once. Misdirect also has
	// a decode node forge, now and then, the next chunk of another node's
	// stream, which the stream's relay must refuse.
	Move float64
}

// DefaultOptions is the CI configuration: two prefill and two decode nodes,
// eight requests of three tenants sharing two prompt prefixes, prefix
// caches of half of each prefill pool and of most decode pools, every
// fault enabled.
func DefaultOptions() Options {
	return Options{
		PrefillNodes: 2, DecodeNodes: 2, DecodeWorkers: 2,
		Requests: 8, Tenants: 3,
		PageTokens:      4,
		PrefillPagesMin: 6, PrefillPagesMax: 24,
		DecodePagesMin: 12, DecodePagesMax: 40,
		PromptTokensMax: 32, MaxTokensMax: 8, ContextTokens: 64,
		PrefixCachePercent: 50, DecodeCachePercent: 50, Prefixes: 2,
		BatchPagesMax: 3,
		StepsMax:      200_000,
		Timing:        DefaultTiming(),
		Faults: Faults{
			Drop: 0.02, Duplicate: 0.03, Delay: 0.01, Reorder: 0.05, Misdirect: 0.01, Corrupt: 0.03,
			Partition: 0.2, Crash: 0.2, Shrink: 0.3, ClockJump: 0.15, BitFlip: 0.2,
			Oversize: 0.1, Cancel: 0.08, Move: 0.3,
		},
	}
}

// DefaultTiming is milliseconds between nodes and seconds of timeouts.
func DefaultTiming() Timing {
	return Timing{
		Arrivals: 200 * time.Millisecond,
		Latency:  time.Millisecond, Jitter: 2 * time.Millisecond,
		PrefillPerToken: 50 * time.Microsecond, DecodeStep: time.Millisecond, BatchGap: 200 * time.Microsecond,
		Tick:           100 * time.Millisecond,
		RequestTimeout: 2 * time.Second, PrefillTimeout: 200 * time.Millisecond,
		ReserveWait: 100 * time.Millisecond, ReserveRetry: 10 * time.Millisecond,
		ReclaimAfter: 500 * time.Millisecond, OwnedTimeout: 5 * time.Second,
		DoneFor: 2 * time.Second,
		Detect:  300 * time.Millisecond,
	}
}

// Validate reports the first option out of range, with its value.
func (o Options) Validate() error {
	for _, f := range []struct {
		name   string
		v, min int
	}{
		{"PrefillNodes", o.PrefillNodes, 1}, {"DecodeNodes", o.DecodeNodes, 1}, {"DecodeWorkers", o.DecodeWorkers, 1},
		{"Requests", o.Requests, 1}, {"Tenants", o.Tenants, 1}, {"PageTokens", o.PageTokens, 1},
		{"PrefillPagesMin", o.PrefillPagesMin, 1}, {"PrefillPagesMax", o.PrefillPagesMax, o.PrefillPagesMin},
		{"DecodePagesMin", o.DecodePagesMin, 1}, {"DecodePagesMax", o.DecodePagesMax, o.DecodePagesMin},
		{"PromptTokensMax", o.PromptTokensMax, 1}, {"MaxTokensMax", o.MaxTokensMax, 1},
		{"ContextTokens", o.ContextTokens, o.PromptTokensMax + o.MaxTokensMax},
		{"BatchPagesMax", o.BatchPagesMax, 1}, {"StepsMax", o.StepsMax, 1},
		{"PrefixCachePercent", o.PrefixCachePercent, 0}, {"DecodeCachePercent", o.DecodeCachePercent, 0},
		{"Prefixes", o.Prefixes, 0},
	} {
		if f.v < f.min {
			return fmt.Errorf("sim: %s (%d) must be at least %d", f.name, f.v, f.min)
		}
	}
	if o.PrefixCachePercent > 100 {
		return fmt.Errorf("sim: PrefixCachePercent (%d) must be at most 100", o.PrefixCachePercent)
	}
	if o.DecodeCachePercent > 100 {
		return fmt.Errorf("sim: DecodeCachePercent (%d) must be at most 100", o.DecodeCachePercent)
	}
	if o.Tenants > 26 {
		return fmt.Errorf("sim: Tenants (%d) must be at most 26", o.Tenants)
	}
	if err := o.Timing.validate(); err != nil {
		return err
	}
	return o.Faults.validate()
}

func (t Timing) validate() error {
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"Arrivals", t.Arrivals}, {"Latency", t.Latency}, {"PrefillPerToken", t.PrefillPerToken},
		{"DecodeStep", t.DecodeStep}, {"BatchGap", t.BatchGap}, {"Tick", t.Tick},
		{"RequestTimeout", t.RequestTimeout}, {"PrefillTimeout", t.PrefillTimeout},
		{"ReserveWait", t.ReserveWait}, {"ReserveRetry", t.ReserveRetry},
		{"ReclaimAfter", t.ReclaimAfter}, {"OwnedTimeout", t.OwnedTimeout},
		{"DoneFor", t.DoneFor}, {"Detect", t.Detect},
	} {
		if f.v <= 0 {
			return fmt.Errorf("sim: Timing.%s (%s) must be positive", f.name, f.v)
		}
	}
	if t.Jitter < 0 {
		return fmt.Errorf("sim: Timing.Jitter (%s) must not be negative", t.Jitter)
	}
	if t.OwnedTimeout <= t.RequestTimeout {
		return fmt.Errorf("sim: Timing.OwnedTimeout (%s) must be longer than RequestTimeout (%s)", t.OwnedTimeout, t.RequestTimeout)
	}
	return nil
}

func (f Faults) validate() error {
	for _, k := range allKinds {
		if p := f.prob(k); p < 0 || p > 1 {
			return fmt.Errorf("sim: Faults.%s (%g) must be in [0, 1]", k, p)
		}
	}
	return nil
}

// Kind is one kind of fault.
type Kind uint8

// The fault kinds, one per field of Faults.
const (
	Drop Kind = iota
	Duplicate
	Delay
	Reorder
	Misdirect
	Corrupt
	Partition
	Crash
	Shrink
	ClockJump
	BitFlip
	Oversize
	Cancel
	Move
	kinds
)

var allKinds = func() []Kind {
	ks := make([]Kind, kinds)
	for i := range ks {
		ks[i] = Kind(i)
	}
	return ks
}()

var kindNames = [kinds]string{"Drop", "Duplicate", "Delay", "Reorder", "Misdirect", "Corrupt", "Partition",
	"Crash", "Shrink", "ClockJump", "BitFlip", "Oversize", "Cancel", "Move"}

func (k Kind) String() string { return kindNames[k] }

func (f Faults) prob(k Kind) float64 {
	return [kinds]float64{f.Drop, f.Duplicate, f.Delay, f.Reorder, f.Misdirect, f.Corrupt, f.Partition,
		f.Crash, f.Shrink, f.ClockJump, f.BitFlip, f.Oversize, f.Cancel, f.Move}[k]
}

// Enabled lists the kinds with a non-zero probability.
func (f Faults) Enabled() []Kind {
	var out []Kind
	for _, k := range allKinds {
		if f.prob(k) > 0 {
			out = append(out, k)
		}
	}
	return out
}
