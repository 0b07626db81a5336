package sim

import (
	"container/heap"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/mutant"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/tenancy"
)

// Result is what one run found.
type Result struct {
	Seed uint64
	// Steps is the number of steps run; Requests the client requests,
	// by outcome in Outcomes ("answered", or the error code's name).
	Steps    int
	Requests int
	Outcomes map[string]int
	// Elapsed is the simulated time the run took.
	Elapsed time.Duration
	// Counters are the paths the run reached.
	Counters Counters
	// TraceHash is a hash of every line of the trace: two runs of one seed
	// and one build have the same.
	TraceHash uint64
	// Violation is the first broken invariant, nil if none.
	Violation *Violation
}

// Violation is a broken invariant: which, where, and how to replay it.
type Violation struct {
	Seed      uint64
	Step      int
	At        time.Duration // simulated time since the start
	Invariant string
	Message   string
}

func (v *Violation) Error() string {
	return fmt.Sprintf("seed=%d step %d at +%s: invariant %q broken: %s\nreplay: %s",
		v.Seed, v.Step, v.At, v.Invariant, v.Message, Replay(v.Seed))
}

// Replay is the command that replays seed of DefaultOptions step by step
// with its trace, under this build's mutant tag if it has one.
func Replay(seed uint64) string {
	tags := ""
	if mutant.Active != "" {
		tags = " -tags mutant_" + mutant.Active
	}
	return fmt.Sprintf("go test%s ./chaos/sim -run 'TestSimSeed$' -seed %d -v", tags, seed)
}

// item is one scheduled step: fn runs at at; seq breaks ties in the order
// they were scheduled, so that the order is the seed's alone.
type item struct {
	at   time.Time
	seq  uint64
	what string
	fn   func()
}

type queue []*item

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*item)) }
func (q *queue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// world is one simulated cluster: its nodes, clients, network and clock,
// every random choice drawn from one PCG seeded with the run's seed.
type world struct {
	opt    Options
	seed   uint64
	rng    *rand.Rand
	start  time.Time
	now    time.Time
	q      queue
	seq    uint64
	steps  int
	engine *engine.ReferenceEngine
	limits handoff.Limits
	batch  kv.BatchLimits
	on     [kinds]bool // the fault kinds this run injects

	prefill, decode []*node
	nodes           []*node
	incs            map[uint64]bool // every incarnation drawn so far
	parts           []partition
	clients         []*client
	all             []*dreq // every request of every decode run
	open            int     // client requests not yet answered
	refs            map[string][]int

	// The prefix caches' side: the tenants' policy (some tenants in a
	// cache group), the oracle's own account of it (groups), the
	// workload's shared prefixes, the client each attempt serves, and the
	// prompt tokens each plan's prefill read from its cache.
	policy     *tenancy.Policy
	groups     map[string]string
	prefixes   [][]int
	byAttempt  map[handoff.JobKey]*client
	cachedRead map[handoff.JobKey]int
	// forged are the attempts whose prefill reported rows for a held
	// page that are not the cached page's: none may be answered.
	forged map[handoff.JobKey]bool

	count     Counters
	trace     tracer
	violation *Violation
}

// Run builds the world of seed under opt, runs it until every request has
// ended and nothing is left to happen, checking every invariant after every
// step, and reports what it found. An invalid opt is reported as a
// violation of invariant "options".
func Run(seed uint64, opt Options) Result {
	w := newWorld(seed, opt)
	w.run()
	return w.result()
}

// newWorld builds the world of seed under opt, ready to run.
func newWorld(seed uint64, opt Options) *world {
	w := &world{opt: opt, seed: seed}
	w.trace.out, w.trace.hash = opt.Trace, fnv.New64a()
	w.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	w.start = time.Unix(1_000_000, 0)
	w.now = w.start
	w.trace.start = w.start
	if err := opt.Validate(); err != nil {
		w.fail("options", "%v", err)
		return w
	}
	w.guard(w.build)
	return w
}

func (w *world) result() Result {
	r := Result{Seed: w.seed, Steps: w.steps, Requests: len(w.clients), Outcomes: map[string]int{},
		Elapsed: w.now.Sub(w.start), Counters: w.count, TraceHash: w.trace.hash.Sum64(), Violation: w.violation}
	for _, c := range w.clients {
		if c.done {
			r.Outcomes[c.outcome]++
		}
	}
	return r
}

func (w *world) run() {
	for w.q.Len() > 0 && w.violation == nil {
		if w.steps >= w.opt.StepsMax {
			w.fail("liveness", "the run has not quiesced after %d steps (%d requests open, %d steps queued)", w.steps, w.open, w.q.Len())
			return
		}
		it := heap.Pop(&w.q).(*item)
		if it.at.After(w.now) {
			w.now = it.at
		}
		w.steps++
		w.trace.step(w.steps, w.now, it.what)
		if w.guard(it.fn) {
			w.guard(w.checkStep)
		}
	}
	if w.violation == nil {
		w.guard(w.checkEnd)
	}
}

// guard runs fn and turns a panic into a violation: the cores panic on a
// broken invariant (two owners of a page, a generation going backwards).
func (w *world) guard(fn func()) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			stack := strings.SplitN(string(debug.Stack()), "\n", 12)
			w.fail("panic", "%v\n%s", p, strings.Join(stack[min(5, len(stack)):], "\n"))
			ok = false
		}
	}()
	fn()
	return w.violation == nil
}

// fail records the first broken invariant; the run stops after the step.
func (w *world) fail(invariant, format string, args ...any) {
	if w.violation != nil {
		return
	}
	w.violation = &Violation{Seed: w.seed, Step: w.steps, At: w.now.Sub(w.start), Invariant: invariant,
		Message: fmt.Sprintf(format, args...)}
	w.trace.line("VIOLATION " + invariant + ": " + w.violation.Message)
}

// after schedules fn to run d from now; what names it in the trace.
func (w *world) after(d time.Duration, what string, fn func()) {
	w.seq++
	heap.Push(&w.q, &item{at: w.now.Add(d), seq: w.seq, what: what, fn: fn})
}

// between draws a duration in [lo, hi].
func (w *world) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1))
}

// chance reports true with probability p of kind k, when the run injects
// k.
func (w *world) chance(k Kind) bool {
	return w.on[k] && w.rng.Float64() < w.opt.Faults.prob(k)
}

// newIncarnation draws a run id no node has had.
func (w *world) newIncarnation() uint64 {
	for {
		inc := w.rng.Uint64() >> 16 // short in traces, still unique in practice
		if inc != 0 && !w.incs[inc] {
			w.incs[inc] = true
			return inc
		}
	}
}

// build draws the world: which faults run, the nodes, the clients and the
// scheduled faults.
func (w *world) build() {
	for _, k := range allKinds {
		w.on[k] = w.opt.Faults.prob(k) > 0 && w.rng.IntN(4) != 0
	}
	m := engine.DefaultModelConfig()
	m.Dim, m.Layers, m.Heads, m.KVHeads, m.HeadDim, m.HiddenDim, m.ContextTokens = 32, 1, 2, 1, 16, 64, w.opt.ContextTokens
	e, err := engine.NewReferenceEngine(m)
	if err != nil {
		w.fail("options", "model: %v", err)
		return
	}
	w.engine = e
	g := m.Geometry(w.opt.PageTokens)
	w.limits = handoff.Limits{ContextTokens: m.ContextTokens, MaxTokensMax: w.opt.MaxTokensMax, Geometry: g}
	w.batch = kv.BatchLimits{PagesMax: w.opt.BatchPagesMax, Frame: g.Limits()}
	w.batch.BytesMax = w.opt.BatchPagesMax * w.batch.Frame.FrameBytesMax()
	w.incs = map[uint64]bool{}
	w.refs = map[string][]int{}
	w.buildPolicy()
	for i := range w.opt.PrefillNodes {
		w.prefill = append(w.prefill, w.newNode(rolePrefill, i, w.opt.PrefillPagesMin, w.opt.PrefillPagesMax))
	}
	for i := range w.opt.DecodeNodes {
		w.decode = append(w.decode, w.newNode(roleDecode, i, w.opt.DecodePagesMin, w.opt.DecodePagesMax))
	}
	w.nodes = append(append([]*node(nil), w.prefill...), w.decode...)
	for _, n := range w.nodes {
		n.boot()
		n.known = n.inc
	}
	w.trace.line(w.describeWorld())
	w.buildClients()
	w.buildFaults()
}

func (w *world) describeWorld() string {
	var b strings.Builder
	fmt.Fprintf(&b, "world seed=%d faults:", w.seed)
	for _, k := range allKinds {
		if w.on[k] {
			b.WriteString(" " + k.String())
		}
	}
	for _, n := range w.nodes {
		fmt.Fprintf(&b, " %s(inc %x, %d pages)", n.addr, n.inc, n.pagesN)
	}
	b.WriteString(w.describeGroups())
	return b.String()
}
