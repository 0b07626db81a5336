package bench

import (
	"cmp"
	"container/heap"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// Layout is a cluster's nodes behind its router: Prefill and Decode nodes
// of those roles, All nodes that do both.
type Layout struct {
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
	All     int `json:"all"`
}

// LayoutNodesMax bounds the nodes of a layout.
const LayoutNodesMax = 64

// Nodes is how many nodes the layout has.
func (l Layout) Nodes() int { return l.Prefill + l.Decode + l.All }

// Validate refuses a layout with no node to prefill or none to decode.
func (l Layout) Validate() error {
	if l.Prefill < 0 || l.Decode < 0 || l.All < 0 || l.Nodes() > LayoutNodesMax ||
		(l.Prefill+l.All == 0) || (l.Decode+l.All == 0) {
		return &SpecError{Spec: l.String(), Reason: fmt.Sprintf("a layout needs a node that prefills and one that decodes, at most %d nodes", LayoutNodesMax)}
	}
	return nil
}

// String names the layout: "2 all", "1P:3D", "1P:1D+2 all".
func (l Layout) String() string {
	var s string
	if l.Prefill+l.Decode > 0 {
		s = fmt.Sprintf("%dP:%dD", l.Prefill, l.Decode)
	}
	if l.All > 0 {
		if s != "" {
			s += "+"
		}
		s += strconv.Itoa(l.All) + " all"
	}
	return s
}

// Load is what one request asks of the cluster: the tokens of its prompt
// and the tokens it will generate.
type Load struct {
	PromptTokens, OutputTokens int
}

// Run is an open-loop run: request i sent At[i] after the start with
// Loads[i]; the first Warm are the warm-up, which lasts Warmup: the
// measured window starts there, as a benchmark's does.
type Run struct {
	At     []time.Duration
	Loads  []Load
	Warm   int
	Warmup time.Duration
}

// Predict simulates run on layout, each node as profile measured it, and
// summarizes it as a benchmark of the same run would. The model: the
// router sends each request to the prefill node and the decode node with
// the least KV outstanding through it, in tokens (ties to the first; the
// router's two random choices are both nodes of a pair), a prompt's
// counted where it is prefilled until its first token, a whole request's
// where it is decoded until it ends; after OverheadS it joins its prefill node's queue, prefilled one
// at a time (PrefillS); its KV then moves (TransferS, none when prefill and
// decode are one node) and its first token reaches the client; it then
// joins its decode node's sequences, which are stepped in batches of at
// most BatchMax (StepS), one token each per step, a step taking those that
// joined before it began. A node of role all shares its processor
// between a prefill and a decode step that run at once, half each, as two
// busy goroutines on one processor do.
func Predict(p Profile, l Layout, run Run, slo SLO) (Summary, error) {
	if err := p.Validate(); err != nil {
		return Summary{}, err
	}
	if err := l.Validate(); err != nil {
		return Summary{}, err
	}
	if len(run.At) != len(run.Loads) || run.Warm < 0 || run.Warm > len(run.At) {
		return Summary{}, &SpecError{Spec: fmt.Sprintf("run of %d send times, %d loads, %d warm", len(run.At), len(run.Loads), run.Warm),
			Reason: "want a load for every send time and at most as many warm"}
	}
	if run.Warmup < 0 || (run.Warm > 0 && run.At[run.Warm-1] >= run.Warmup) || (run.Warm < len(run.At) && run.At[run.Warm] < run.Warmup) {
		return Summary{}, &SpecError{Spec: fmt.Sprintf("run of %d warm with a warm-up of %s", run.Warm, run.Warmup),
			Reason: "want the warm ones sent within the warm-up and the others after it"}
	}
	for i, ld := range run.Loads {
		if ld.PromptTokens < 1 || ld.OutputTokens < 1 {
			return Summary{}, &RangeError{What: fmt.Sprintf("the tokens of request %d (prompt %d)", i, ld.PromptTokens),
				Value: float64(min(ld.PromptTokens, ld.OutputTokens)), Min: 1, Max: LengthMax}
		}
	}
	s := newSim(p, l, run)
	s.loop()
	return slo.Summarize(s.samples, run.Warmup), nil
}

// simNode is one node of the simulation.
type simNode struct {
	prefills, decodes, shared bool
	queue                     []int   // requests waiting for prefill, the head being prefilled
	prefillLeft               float64 // seconds of work left of the head's prefill
	seqs                      []int   // requests decoding
	batch                     []int   // the sequences of the step under way
	stepLeft                  float64 // seconds of work left of the step
	// out is what the router has outstanding here, in tokens of KV: a
	// prompt's until its first token, where it is prefilled; a whole
	// request's (prompt and answer) until it ends, where it is decoded.
	out int
}

// rate is the share of the processor each of the node's activities gets.
func (n *simNode) rate() float64 {
	if n.shared && len(n.queue) > 0 && len(n.batch) > 0 {
		return 0.5
	}
	return 1
}

type simEvent struct {
	at   float64
	kind int // evEnter or evArrive
	req  int
}

const (
	evEnter  = iota // the request joins its prefill node's queue
	evArrive        // its KV reached its decode node: the first token
)

type eventHeap []simEvent

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || (h[i].at == h[j].at && h[i].req < h[j].req)
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *eventHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type sim struct {
	p       Profile
	run     Run
	nodes   []*simNode
	events  eventHeap
	now     float64
	prefill []int // each request's prefill node
	decode  []int // each request's decode node
	last    []float64
	samples []Sample
}

func newSim(p Profile, l Layout, run Run) *sim {
	s := &sim{p: p, run: run, prefill: make([]int, len(run.At)), decode: make([]int, len(run.At)),
		last: make([]float64, len(run.At)), samples: make([]Sample, len(run.At))}
	for range l.Prefill {
		s.nodes = append(s.nodes, &simNode{prefills: true})
	}
	for range l.Decode {
		s.nodes = append(s.nodes, &simNode{decodes: true})
	}
	for range l.All {
		s.nodes = append(s.nodes, &simNode{prefills: true, decodes: true, shared: true})
	}
	for i, at := range run.At {
		s.samples[i] = Sample{Start: at, PromptTokens: run.Loads[i].PromptTokens, Warmup: i < run.Warm,
			Gaps: make([]time.Duration, 0, run.Loads[i].OutputTokens-1)}
		heap.Push(&s.events, simEvent{at: at.Seconds() + p.OverheadS, kind: evEnter, req: i})
	}
	return s
}

// least is the node with the least outstanding among those ok admits.
func (s *sim) least(ok func(*simNode) bool) int {
	best := -1
	for i, n := range s.nodes {
		if ok(n) && (best < 0 || n.out < s.nodes[best].out) {
			best = i
		}
	}
	return best
}

func (s *sim) loop() {
	for {
		next, what, node := math.Inf(1), -1, -1
		if len(s.events) > 0 {
			next, what = s.events[0].at, 0
		}
		for i, n := range s.nodes {
			r := n.rate()
			if len(n.queue) > 0 && s.now+n.prefillLeft/r < next {
				next, what, node = s.now+n.prefillLeft/r, 1, i
			}
			if len(n.batch) > 0 && s.now+n.stepLeft/r < next {
				next, what, node = s.now+n.stepLeft/r, 2, i
			}
		}
		if what < 0 {
			return
		}
		s.advance(next)
		switch what {
		case 0:
			s.event(heap.Pop(&s.events).(simEvent))
		case 1:
			s.prefilled(node)
		case 2:
			s.stepped(node)
		}
	}
}

// advance moves every activity on to time t.
func (s *sim) advance(t float64) {
	dt := t - s.now
	for _, n := range s.nodes {
		r := n.rate()
		if len(n.queue) > 0 {
			n.prefillLeft = max(n.prefillLeft-dt*r, 0)
		}
		if len(n.batch) > 0 {
			n.stepLeft = max(n.stepLeft-dt*r, 0)
		}
	}
	s.now = t
}

func (s *sim) event(e simEvent) {
	ld := s.run.Loads[e.req]
	switch e.kind {
	case evEnter:
		p := s.least(func(n *simNode) bool { return n.prefills })
		d := s.least(func(n *simNode) bool { return n.decodes })
		s.prefill[e.req], s.decode[e.req] = p, d
		s.nodes[p].out += ld.PromptTokens
		s.nodes[d].out += ld.PromptTokens + ld.OutputTokens
		n := s.nodes[p]
		n.queue = append(n.queue, e.req)
		if len(n.queue) == 1 {
			n.prefillLeft = s.p.PrefillS(ld.PromptTokens)
		}
	case evArrive:
		x := &s.samples[e.req]
		x.TTFT, x.Tokens = s.since(e.req), 1
		s.nodes[s.prefill[e.req]].out -= ld.PromptTokens
		s.last[e.req] = s.now
		n := s.nodes[s.decode[e.req]]
		if ld.OutputTokens == 1 {
			s.finish(e.req)
			return
		}
		n.seqs = append(n.seqs, e.req)
		if len(n.batch) == 0 {
			s.startStep(n)
		}
	}
}

// since is the time from request i's send to now.
func (s *sim) since(i int) time.Duration {
	return time.Duration((s.now - s.run.At[i].Seconds()) * float64(time.Second))
}

func (s *sim) prefilled(i int) {
	n := s.nodes[i]
	req := n.queue[0]
	n.queue = n.queue[1:]
	if len(n.queue) > 0 {
		n.prefillLeft = s.p.PrefillS(s.run.Loads[n.queue[0]].PromptTokens)
	}
	move := 0.0
	if s.decode[req] != i {
		move = s.p.TransferS(s.run.Loads[req].PromptTokens)
	}
	heap.Push(&s.events, simEvent{at: s.now + move, kind: evArrive, req: req})
}

func (s *sim) startStep(n *simNode) {
	b := min(len(n.seqs), s.p.BatchMax)
	n.batch = append(n.batch[:0], n.seqs[:b]...)
	// Round robin: the next step begins after this one's sequences.
	n.seqs = append(n.seqs[b:], n.seqs[:b]...)
	n.stepLeft = s.p.StepS(b)
}

func (s *sim) stepped(i int) {
	n := s.nodes[i]
	for _, req := range n.batch {
		x := &s.samples[req]
		x.Tokens++
		x.Gaps = append(x.Gaps, time.Duration((s.now-s.last[req])*float64(time.Second)))
		s.last[req] = s.now
		if x.Tokens == s.run.Loads[req].OutputTokens {
			n.seqs = slices.DeleteFunc(n.seqs, func(r int) bool { return r == req })
			s.finish(req)
		}
	}
	n.batch = n.batch[:0]
	if len(n.seqs) > 0 {
		s.startStep(n)
	}
}

func (s *sim) finish(req int) {
	s.samples[req].E2E = s.since(req)
	ld := s.run.Loads[req]
	s.nodes[s.decode[req]].out -= ld.PromptTokens + ld.OutputTokens
}

// Prediction is the simulated outcome of one layout.
type Prediction struct {
	Layout  Layout  `json:"layout"`
	Summary Summary `json:"summary"`
}

// Plan predicts every layout of nodes nodes (all of role all; each split
// into P prefill and D decode nodes, P + D = nodes), best goodput first,
// then fewer prefill nodes.
func Plan(p Profile, nodes int, run Run, slo SLO) ([]Prediction, error) {
	if nodes < 1 || nodes > LayoutNodesMax {
		return nil, &RangeError{What: "nodes to plan for", Value: float64(nodes), Min: 1, Max: LayoutNodesMax}
	}
	layouts := []Layout{{All: nodes}}
	for pf := 1; pf < nodes; pf++ {
		layouts = append(layouts, Layout{Prefill: pf, Decode: nodes - pf})
	}
	out := make([]Prediction, 0, len(layouts))
	for _, l := range layouts {
		sum, err := Predict(p, l, run, slo)
		if err != nil {
			return nil, err
		}
		out = append(out, Prediction{Layout: l, Summary: sum})
	}
	slices.SortStableFunc(out, func(a, b Prediction) int {
		if a.Summary.GoodputPerS != b.Summary.GoodputPerS {
			return cmp.Compare(b.Summary.GoodputPerS, a.Summary.GoodputPerS)
		}
		return a.Layout.Prefill - b.Layout.Prefill
	})
	return out, nil
}
