package live

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kvwarden/kvwarden/messages"
)

// tally collects the outcomes and verdicts as requests end, and the
// fault events, for the progress line and the report. Safe for
// concurrent use.
type tally struct {
	start time.Time

	mu      sync.Mutex
	records []record
	byClass [classes]int
	events  []string // not yet printed
}

type record struct {
	o Outcome
	v Verdict
}

func newTally(start time.Time) *tally { return &tally{start: start} }

func (t *tally) add(o Outcome, v Verdict) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.records = append(t.records, record{o, v})
	t.byClass[v.Class]++
	if v.Class == Wrong {
		t.events = append(t.events, fmt.Sprintf("[%6.1fs] WRONG: request %d of %s: %s", time.Since(t.start).Seconds(),
			o.Request.Index, o.Request.Tenant, v.Why))
	}
}

func (t *tally) event(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.events = append(t.events, fmt.Sprintf("[%6.1fs] %s", time.Since(t.start).Seconds(), s))
}

// snapshot is the counts so far and the events not yet taken.
func (t *tally) snapshot() (int, [classes]int, []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := t.events
	t.events = nil
	return len(t.records), t.byClass, ev
}

// Progress output intervals.
const (
	progressLiveEvery = 250 * time.Millisecond
	progressEvery     = 10 * time.Second
)

// progress writes the progress line and the fault events while a
// campaign runs.
type progress struct {
	w       io.Writer
	live    bool
	t       *tally
	in      *injector
	total   int
	done    chan struct{}
	stopped chan struct{}
}

func startProgress(w io.Writer, live bool, t *tally, in *injector, total int) *progress {
	p := &progress{w: w, live: live, t: t, in: in, total: total, done: make(chan struct{}), stopped: make(chan struct{})}
	go p.loop()
	return p
}

func (p *progress) loop() {
	defer close(p.stopped)
	if p.w == nil {
		<-p.done
		return
	}
	every := progressEvery
	if p.live {
		every = progressLiveEvery
	}
	events := time.NewTicker(progressLiveEvery)
	defer events.Stop()
	last := time.Now()
	for {
		select {
		case <-p.done:
			p.print(true)
			return
		case <-events.C:
			line := time.Since(last) >= every
			if line {
				last = time.Now()
			}
			p.print(line)
		}
	}
}

// print writes the events since the last call and, when line, the
// progress line.
func (p *progress) print(line bool) {
	n, byClass, events := p.t.snapshot()
	clear := ""
	if p.live {
		clear = "\r\x1b[K"
	}
	for _, e := range events {
		fmt.Fprintf(p.w, "%s%s\n", clear, e)
	}
	if !line && len(events) == 0 {
		return
	}
	of := ""
	if p.total > 0 {
		of = fmt.Sprintf("/%d", p.total)
	}
	applied := len(p.in.Applied())
	s := fmt.Sprintf("[%6.1fs] %d%s requests: %d correct, %d refused, %d clean errors, %d cancelled, %d WRONG; faults %d done, %d active",
		time.Since(p.t.start).Seconds(), n, of, byClass[Correct], byClass[Refused], byClass[CleanError], byClass[Cancelled],
		byClass[Wrong], applied, p.in.activeNow())
	if p.live {
		fmt.Fprint(p.w, clear+s)
	} else if line {
		fmt.Fprintln(p.w, s)
	}
}

// stop ends the output, with the last line whole.
func (p *progress) stop() {
	close(p.done)
	<-p.stopped
	if p.w != nil && p.live {
		fmt.Fprintln(p.w)
	}
}

// jsonDuration is a time.Duration that JSON spells as Go does ("1.5s").
type jsonDuration time.Duration

func (d jsonDuration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// Report is a campaign's findings; Violations lists what must never
// happen, and happened.
type Report struct {
	Seed uint64 `json:"seed"`
	// Replay is the command line that replays the campaign's schedule
	// and workload; the command that ran the campaign sets it.
	Replay  string    `json:"replay,omitempty"`
	Started time.Time `json:"started"`
	// Wall is the campaign's whole time; Faults its time to the end of
	// the last fault, when settling began.
	Wall   jsonDuration `json:"wall"`
	Faults jsonDuration `json:"faults_end"`
	// Requests counts the requests by outcome and code.
	Requests Counts `json:"requests"`
	// Wrong counts wrong outcomes; CrossTenantAnswers those whose tokens
	// are another tenant's reference, CrossTenantBytes their text's
	// bytes; CrossRequestAnswers those of another prompt of the same
	// tenant.
	Wrong               int `json:"wrong_answers"`
	CrossTenantAnswers  int `json:"cross_tenant_answers"`
	CrossTenantBytes    int `json:"cross_tenant_bytes"`
	CrossRequestAnswers int `json:"cross_request_answers"`
	// CrossTenantRows and CrossRequestRows are the rows the nodes' reads
	// returned that another tenant, or another request, wrote (counted by
	// chaos builds), over every incarnation read; CrossTenantBytes
	// includes the tenant rows' KV bytes.
	CrossTenantRows  uint64 `json:"cross_tenant_rows"`
	CrossRequestRows uint64 `json:"cross_request_rows"`
	// CacheHits counts the correct answers that say prefill read some of
	// their prompt from its prefix cache, CachedTokens those tokens.
	// CacheQueryTokens and CacheHitTokens are the prefill pools' own
	// counts (the prompt tokens their lookups could have found, and
	// found), over every incarnation read.
	CacheHits        int    `json:"cache_hits"`
	CachedTokens     int    `json:"cached_tokens"`
	CacheQueryTokens uint64 `json:"cache_query_tokens"`
	CacheHitTokens   uint64 `json:"cache_hit_tokens"`
	// InNodeFaults are the in-node faults the nodes injected, by kind,
	// over every incarnation read.
	InNodeFaults map[string]uint64 `json:"in_node_faults,omitempty"`
	// Unexplained counts, by code, requests of the workload that failed
	// with a code no fault explains: internal (a bug by its definition),
	// an error of the client itself, bad_request or forbidden (the
	// workload's requests are valid and sent with their tenant's
	// certificate). Each is a violation.
	Unexplained map[string]int `json:"unexplained_errors,omitempty"`
	// StreamGaps are correct answers whose stream lost tokens (none
	// wrong): the client refuses a chunk out of sequence, and the final
	// answer carries them all.
	StreamGaps int `json:"stream_gaps"`
	// PagesLeaked are the pages not free once the cluster was quiet, of
	// PagesTotal in every pool read.
	PagesLeaked int `json:"pages_leaked"`
	PagesTotal  int `json:"pages_total"`
	// Latency of the requests answered with their reference, and of all
	// requests but oversize ones.
	Latency    Latencies `json:"latency_answered"`
	LatencyAll Latencies `json:"latency_all"`
	// FaultsByKind counts the faults injected (and healed) without an
	// error; ByFault says how the requests that overlapped each such
	// kind's windows ended. FaultsFailed are those that failed to inject
	// or heal: each is a violation, since the campaign did not test what
	// its schedule said.
	FaultsByKind map[string]int `json:"faults_by_kind"`
	FaultsFailed []string       `json:"faults_failed,omitempty"`
	ByFault      []KindShare    `json:"by_fault_kind"`
	// Unreached are kinds asked for and never injected.
	Unreached []string      `json:"unreached_kinds,omitempty"`
	FaultLog  []FaultRecord `json:"faults"`
	Rogue     RogueSummary  `json:"rogue"`
	Drains    DrainSummary  `json:"drains"`
	// Nodes are the nodes' figures once quiet; Unread the nodes whose
	// pools could not be read.
	Nodes  []NodeFigures `json:"nodes"`
	Unread []string      `json:"unread,omitempty"`
	// Departed are the figures of incarnations killed, read just before.
	Departed []NodeFigures `json:"departed,omitempty"`
	Crashes  []CrashRecord `json:"crashes,omitempty"`
	Settle   string        `json:"settle_error,omitempty"`
	Probes   []Probe       `json:"probes"`
	// FrameFaults is the in-node fault spec the nodes ran with.
	FrameFaults string `json:"frame_faults,omitempty"`
	// Notes are what the command says of the campaign (faults it could
	// not inject, and why).
	Notes      []string        `json:"notes,omitempty"`
	Violations []string        `json:"violations"`
	Records    []RequestRecord `json:"records"`
}

// Counts are requests by outcome.
type Counts struct {
	Total int `json:"total"`
	// ByClass counts by Class's name.
	ByClass map[string]int `json:"by_outcome"`
	// ByCode counts the clean errors by code.
	ByCode map[string]int `json:"clean_errors_by_code"`
	// Oversize are the oversize prompts: refused with prompt_too_long,
	// answered (each a wrong outcome), or failed with another code.
	Oversize OversizeCounts `json:"oversize"`
}

// OversizeCounts are oversize prompts by outcome.
type OversizeCounts struct {
	Total    int            `json:"total"`
	Refused  int            `json:"refused"`
	Answered int            `json:"answered"`
	Other    map[string]int `json:"other_codes,omitempty"`
}

// Latencies summarizes latencies, in milliseconds.
type Latencies struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// KindShare is how the requests whose time overlapped a kind's windows
// ended, oversize and cancelled ones left out. ErrorShare is the share of
// them that failed with an error; CleanShare the share of the failures
// that were clean errors, with a code a fault explains (1 when none
// failed: anything less is a wrong answer or an unexplained error).
type KindShare struct {
	Kind        string  `json:"kind"`
	Faults      int     `json:"faults"`
	Requests    int     `json:"requests"`
	Correct     int     `json:"correct"`
	CleanErrors int     `json:"clean_errors"`
	Unexplained int     `json:"unexplained_errors"` // of CleanErrors, see Report.Unexplained
	Wrong       int     `json:"wrong"`
	ErrorShare  float64 `json:"error_share"`
	CleanShare  float64 `json:"clean_share"`
	// ByCode counts the clean errors by code.
	ByCode map[string]int `json:"clean_errors_by_code,omitempty"`
}

// FaultRecord is one injected fault in a report.
type FaultRecord struct {
	Seq            int          `json:"seq"`
	Kind           Kind         `json:"kind"`
	Target         string       `json:"target"`
	At             jsonDuration `json:"planned_at"`
	For            jsonDuration `json:"planned_for"`
	Start          jsonDuration `json:"start"`
	End            jsonDuration `json:"end"`
	Latency        jsonDuration `json:"latency,omitempty"`
	BandwidthKiBps int          `json:"bandwidth_kib_per_s,omitempty"`
	Pages          int          `json:"pages,omitempty"`
	Err            string       `json:"error,omitempty"`
	Attacks        []Attack     `json:"attacks,omitempty"`
	// Moved is how many running requests a drained node moved, by its
	// last status.
	Moved uint64 `json:"moved,omitempty"`
}

// RogueSummary counts a campaign's rogue attacks.
type RogueSummary struct {
	Rounds  int `json:"rounds"`
	Attacks int `json:"attacks"`
	// RefusedCounted were refused and counted in the node's status.
	RefusedCounted int `json:"refused_and_counted"`
	Skipped        int `json:"skipped"`
	// Failed are the attacks made and not both refused and counted.
	Failed []Attack `json:"failed,omitempty"`
}

// DrainSummary counts a campaign's drains of decode nodes and the
// requests they moved.
type DrainSummary struct {
	// Drains are the drains injected without an error: the node exited 0
	// and was restarted.
	Drains int `json:"drains"`
	// Moved are the running requests the drained nodes moved to other
	// decode nodes, KV and all, by each one's last status before it left
	// (every drain's, failed or not).
	Moved uint64 `json:"moved"`
	// MovedIn are the requests the decode nodes took over from another,
	// StreamsMoved the streams the routers' relays followed from one
	// decode node to another: over every incarnation read.
	MovedIn      uint64 `json:"moved_in"`
	StreamsMoved uint64 `json:"streams_moved"`
}

// CrashRecord is a node that exited on its own.
type CrashRecord struct {
	Node   string       `json:"node"`
	Status string       `json:"status"`
	At     jsonDuration `json:"at"`
}

// RequestRecord is one request in a report.
type RequestRecord struct {
	Index       int          `json:"index"`
	Tenant      string       `json:"tenant"`
	Prompt      int          `json:"prompt"`
	PromptBytes int          `json:"prompt_bytes"`
	MaxTokens   int          `json:"max_tokens"`
	Oversize    bool         `json:"oversize,omitempty"`
	CancelAfter int          `json:"cancel_after,omitempty"`
	Start       jsonDuration `json:"start"`
	End         jsonDuration `json:"end"`
	Class       Class        `json:"outcome"`
	Code        string       `json:"code,omitempty"`
	Streamed    int          `json:"streamed"`
	Answered    int          `json:"answered"`
	Why         string       `json:"why,omitempty"`
	Owner       string       `json:"tokens_of,omitempty"`
	// CacheSalt is the salt the request sent; CachedTokens the prompt
	// tokens its answer read from the prefix cache.
	CacheSalt    string `json:"cache_salt,omitempty"`
	CachedTokens int    `json:"cached_tokens,omitempty"`
}

// buildReport makes the report of a campaign.
func buildReport(c *Campaign, t *tally, applied []Applied, crashes []Crash, after afterFaults, start time.Time,
	faultsEnd time.Duration, kinds []Kind) *Report {
	t.mu.Lock()
	records := slices.Clone(t.records)
	t.mu.Unlock()
	sort.Slice(records, func(i, j int) bool { return records[i].o.Request.Index < records[j].o.Request.Index })
	sort.Slice(applied, func(i, j int) bool { return applied[i].Seq < applied[j].Seq })
	r := &Report{Seed: c.Seed, Started: start, Wall: jsonDuration(time.Since(start)), Faults: jsonDuration(faultsEnd),
		Nodes: after.nodes, Unread: after.unread, Probes: after.probes, FrameFaults: c.FrameFaults, Violations: []string{},
		FaultsByKind: map[string]int{}}
	r.count(records)
	r.faults(applied, kinds)
	r.ByFault = shares(records, slices.DeleteFunc(slices.Clone(applied), func(a Applied) bool { return a.Err != "" }))
	for _, n := range after.nodes {
		for _, p := range n.Pools {
			r.PagesTotal += p.Capacity
			r.PagesLeaked += p.Leaked()
		}
	}
	r.Departed = after.departed
	r.nodeCounts(append(slices.Clone(after.nodes), after.departed...), c.Model.Config().Geometry(1).BytesPerToken())
	for _, cr := range crashes {
		r.Crashes = append(r.Crashes, CrashRecord{Node: cr.Node, Status: cr.Status, At: jsonDuration(cr.At)})
	}
	if after.settle != nil {
		r.Settle = after.settle.Error()
	}
	r.violations()
	return r
}

// count fills the request counts, latencies and records.
func (r *Report) count(records []record) {
	r.Requests = Counts{ByClass: map[string]int{}, ByCode: map[string]int{}, Oversize: OversizeCounts{Other: map[string]int{}}}
	r.Unexplained = map[string]int{}
	var answered, all []time.Duration
	for _, rec := range records {
		o, v := rec.o, rec.v
		r.Requests.Total++
		r.Requests.ByClass[v.Class.String()]++
		switch v.Class {
		case CleanError:
			r.Requests.ByCode[v.Code]++
			if Unexplained(v.Code) {
				r.Unexplained[v.Code]++
			}
		case Wrong:
			r.Wrong++
			if v.CrossTenant {
				r.CrossTenantAnswers++
				r.CrossTenantBytes += v.Bytes
			}
			if v.CrossRequest {
				r.CrossRequestAnswers++
			}
		}
		if o.Request.Oversize {
			r.oversize(o, v)
		} else {
			all = append(all, o.End-o.Start)
		}
		if v.Class == Correct {
			answered = append(answered, o.End-o.Start)
			if o.CachedTokens > 0 {
				r.CacheHits++
				r.CachedTokens += o.CachedTokens
			}
		}
		if v.StreamGap {
			r.StreamGaps++
		}
		r.Records = append(r.Records, RequestRecord{Index: o.Request.Index, Tenant: o.Request.Tenant, Prompt: o.Request.Prompt,
			PromptBytes: len(o.Request.Text), MaxTokens: o.Request.MaxTokens, Oversize: o.Request.Oversize,
			CancelAfter: o.Request.CancelAfter, Start: jsonDuration(o.Start), End: jsonDuration(o.End), Class: v.Class,
			Code: v.Code, Streamed: len(o.Streamed), Answered: len(o.Answer), Why: v.Why, Owner: v.Owner,
			CacheSalt: o.Request.CacheSalt, CachedTokens: o.CachedTokens})
	}
	r.Latency, r.LatencyAll = latencyOf(answered), latencyOf(all)
}

func (r *Report) oversize(o Outcome, v Verdict) {
	r.Requests.Oversize.Total++
	switch {
	case v.Class == Refused:
		r.Requests.Oversize.Refused++
	case o.Err == nil:
		r.Requests.Oversize.Answered++
	default:
		r.Requests.Oversize.Other[v.Code]++
	}
}

func latencyOf(ds []time.Duration) Latencies {
	if len(ds) == 0 {
		return Latencies{}
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	// The nearest rank: the smallest value with at least q of them at or
	// below it.
	at := func(q float64) time.Duration { return ds[max(int(math.Ceil(q*float64(len(ds))))-1, 0)] }
	return Latencies{Count: len(ds), P50: ms(at(0.5)), P99: ms(at(0.99)), Max: ms(ds[len(ds)-1])}
}

// nodeCounts sums the nodes' cross rows, prefix cache counts, in-node
// faults and moves.
func (r *Report) nodeCounts(nodes []NodeFigures, bytesPerToken int) {
	for _, n := range nodes {
		r.Drains.MovedIn += n.MovedIn
		r.Drains.StreamsMoved += n.StreamsMoved
		for _, p := range n.Pools {
			r.CrossTenantRows += p.CrossTenantRows
			r.CrossRequestRows += p.CrossRequestRows
			r.CacheQueryTokens += p.CacheQueryTokens
			r.CacheHitTokens += p.CacheHitTokens
		}
		for k, c := range n.FaultCounts {
			if r.InNodeFaults == nil {
				r.InNodeFaults = map[string]uint64{}
			}
			r.InNodeFaults[k] += c
		}
	}
	r.CrossTenantBytes += int(r.CrossTenantRows) * bytesPerToken
}

// faults fills the fault log, the counts by kind, the rogue's summary and
// the kinds never reached.
func (r *Report) faults(applied []Applied, kinds []Kind) {
	for _, a := range applied {
		if a.Err != "" {
			r.FaultsFailed = append(r.FaultsFailed, fmt.Sprintf("#%d %s %s: %s", a.Seq, a.Kind, a.Target, a.Err))
		} else {
			r.FaultsByKind[a.Kind.String()]++
		}
		r.FaultLog = append(r.FaultLog, FaultRecord{Seq: a.Seq, Kind: a.Kind, Target: a.Target, At: jsonDuration(a.At),
			For: jsonDuration(a.For), Start: jsonDuration(a.Start), End: jsonDuration(a.End), Latency: jsonDuration(a.Latency),
			BandwidthKiBps: a.BandwidthKiBps, Pages: a.Pages, Err: a.Err, Attacks: a.Attacks, Moved: a.Moved})
		if a.Kind == Drain {
			r.Drains.Moved += a.Moved
			if a.Err == "" {
				r.Drains.Drains++
			}
		}
		if a.Kind != Rogue {
			continue
		}
		r.Rogue.Rounds++
		for _, at := range a.Attacks {
			r.Rogue.Attacks++
			switch {
			case at.Skipped:
				r.Rogue.Skipped++
			case at.Failed():
				r.Rogue.Failed = append(r.Rogue.Failed, at)
			default:
				r.Rogue.RefusedCounted++
			}
		}
	}
	for _, k := range kinds {
		if r.FaultsByKind[k.String()] == 0 {
			r.Unreached = append(r.Unreached, k.String())
		}
	}
}

// shares says, for each kind injected (and for no fault at all), how the
// requests that overlapped its windows ended.
func shares(records []record, applied []Applied) []KindShare {
	byKind := map[Kind][]Applied{}
	for _, a := range applied {
		byKind[a.Kind] = append(byKind[a.Kind], a)
	}
	var out []KindShare
	none := KindShare{Kind: "none", ByCode: map[string]int{}}
	for _, k := range slices.Sorted(maps.Keys(byKind)) {
		s := KindShare{Kind: k.String(), Faults: len(byKind[k]), ByCode: map[string]int{}}
		for _, rec := range records {
			if counts(rec) && overlaps(rec.o, byKind[k]) {
				s.add(rec.v)
			}
		}
		out = append(out, s.finish())
	}
	for _, rec := range records {
		if counts(rec) && !overlaps(rec.o, applied) {
			none.add(rec.v)
		}
	}
	return append(out, none.finish())
}

// Unexplained says whether a workload request's failure with code is one
// no fault explains (see Report.Unexplained).
func Unexplained(code string) bool {
	switch code {
	case messages.CodeInternal.String(), CodeClient, messages.CodeBadRequest.String(), messages.CodeForbidden.String(),
		messages.CodeModelMismatch.String():
		return true
	}
	return false
}

// counts says whether a record counts in the shares by fault kind.
func counts(rec record) bool { return !rec.o.Request.Oversize && rec.v.Class != Cancelled }

func overlaps(o Outcome, ws []Applied) bool {
	return slices.ContainsFunc(ws, func(a Applied) bool { return o.Start < a.End && o.End > a.Start })
}

func (s *KindShare) add(v Verdict) {
	s.Requests++
	switch v.Class {
	case Correct:
		s.Correct++
	case CleanError:
		s.CleanErrors++
		s.ByCode[v.Code]++
		if Unexplained(v.Code) {
			s.Unexplained++
		}
	case Wrong:
		s.Wrong++
	}
}

func (s KindShare) finish() KindShare {
	if s.Requests > 0 {
		s.ErrorShare = float64(s.CleanErrors) / float64(s.Requests)
	}
	s.CleanShare = 1
	if failed := s.CleanErrors + s.Wrong; failed > 0 {
		s.CleanShare = float64(s.CleanErrors-s.Unexplained) / float64(failed)
	}
	return s
}

// violations lists what must never happen and did.
func (r *Report) violations() {
	add := func(format string, args ...any) { r.Violations = append(r.Violations, fmt.Sprintf(format, args...)) }
	if r.Wrong > 0 {
		add("%d wrong answers (%d cross-tenant, %d bytes; %d cross-request)", r.Wrong, r.CrossTenantAnswers,
			r.CrossTenantBytes, r.CrossRequestAnswers)
	}
	if r.CrossTenantRows > 0 || r.CrossRequestRows > 0 {
		add("the nodes' reads returned %d rows another tenant wrote and %d another request wrote", r.CrossTenantRows,
			r.CrossRequestRows)
	}
	if n := total(r.Unexplained); n > 0 {
		add("%d requests failed with a code no fault explains: %s", n, countsText(r.Unexplained))
	}
	if o := r.Requests.Oversize; o.Answered > 0 || total(o.Other) > 0 {
		add("oversize prompts not refused with prompt_too_long: %d answered, other codes: %s", o.Answered, countsText(o.Other))
	}
	for _, f := range r.FaultsFailed {
		add("fault %s", f)
	}
	if r.PagesLeaked > 0 {
		add("%d pages leaked: not free once the cluster was quiet", r.PagesLeaked)
	}
	for _, u := range r.Unread {
		add("pools not read after the faults: %s", u)
	}
	for _, cr := range r.Crashes {
		add("%s exited on its own at %s: %s", cr.Node, time.Duration(cr.At).Round(time.Millisecond), cr.Status)
	}
	for _, a := range r.Rogue.Failed {
		add("rogue attack %q on %s not refused and counted (refused %t, counted %t): %s", a.Name, a.Node, a.Refused,
			a.Counted, a.Detail)
	}
	if r.Settle != "" {
		add("the cluster did not settle after the faults: %s", r.Settle)
	}
	for _, p := range r.Probes {
		if !p.Recovered() {
			add("%s's probe after the faults, try %d: %s %s%s", p.Tenant, p.Attempts, p.Verdict.Class, p.Error, p.Verdict.Why)
		}
	}
}

// Passed says whether the campaign found no violation.
func (r *Report) Passed() bool { return len(r.Violations) == 0 }

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteSummary writes the report's summary tables.
func (r *Report) WriteSummary(out io.Writer) error {
	w := &stickyWriter{w: out}
	verdict := "PASS"
	if !r.Passed() {
		verdict = "FAIL"
	}
	faults := 0
	for _, n := range r.FaultsByKind {
		faults += n
	}
	fmt.Fprintf(w, "chaos campaign, seed %d: %d requests, %d faults in %s: %s\n\n", r.Seed, r.Requests.Total, faults,
		time.Duration(r.Wall).Round(100*time.Millisecond), verdict)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OUTCOME\tREQUESTS\t")
	for c := range classes {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", c, r.Requests.ByClass[c.String()], r.classNote(c))
	}
	for _, code := range slices.Sorted(maps.Keys(r.Requests.ByCode)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", code, r.Requests.ByCode[code])
	}
	tw.Flush()
	fmt.Fprintf(w, "\ncross-tenant answers: %d; cross-request answers: %d; cross-tenant bytes: %d\n", r.CrossTenantAnswers,
		r.CrossRequestAnswers, r.CrossTenantBytes)
	fmt.Fprintf(w, "rows read that another tenant wrote: %d, another request: %d (counted by chaos builds)\n",
		r.CrossTenantRows, r.CrossRequestRows)
	fmt.Fprintf(w, "correct answers whose stream lost tokens (none wrong): %d\n", r.StreamGaps)
	fmt.Fprintf(w, "pages leaked: %d of %d in %d pools read\n", r.PagesLeaked, r.PagesTotal, r.pools())
	fmt.Fprintf(w, "prefix cache: %d correct answers read %d prompt tokens from it; prefill pools found %d of %d tokens looked up\n",
		r.CacheHits, r.CachedTokens, r.CacheHitTokens, r.CacheQueryTokens)
	fmt.Fprintf(w, "latency, answered (%d): p50 %s, p99 %s, max %s; all but oversize (%d): p50 %s, p99 %s, max %s\n",
		r.Latency.Count, ms(r.Latency.P50), ms(r.Latency.P99), ms(r.Latency.Max),
		r.LatencyAll.Count, ms(r.LatencyAll.P50), ms(r.LatencyAll.P99), ms(r.LatencyAll.Max))
	r.writeFaults(w)
	recovered, tries := 0, 0
	for _, p := range r.Probes {
		tries += p.Attempts
		if p.Recovered() {
			recovered++
		}
	}
	fmt.Fprintf(w, "\nprobes after the faults: %d of %d tenants answered their reference (%d tries)", recovered, len(r.Probes), tries)
	fmt.Fprintf(w, "\nrogue: %d rounds, %d attacks: %d refused and counted, %d skipped, %d not\n", r.Rogue.Rounds,
		r.Rogue.Attacks, r.Rogue.RefusedCounted, r.Rogue.Skipped, len(r.Rogue.Failed))
	fmt.Fprintf(w, "drains of decode nodes: %d (each exited 0 and was restarted); running requests moved: %d by the drained nodes' last status, %d taken over by decode nodes, %d streams followed by the routers\n",
		r.Drains.Drains, r.Drains.Moved, r.Drains.MovedIn, r.Drains.StreamsMoved)
	if r.FrameFaults != "" {
		fmt.Fprintf(w, "in-node faults (%s): injected %s\n", r.FrameFaults, countsText(r.InNodeFaults))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if len(r.Unreached) > 0 {
		fmt.Fprintf(w, "note: kinds asked for and never injected: %s\n", strings.Join(r.Unreached, ", "))
	}
	fmt.Fprintln(w)
	if r.Passed() {
		fmt.Fprintln(w, "violations: none")
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "VIOLATION: %s\n", v)
	}
	if r.Replay != "" {
		fmt.Fprintf(w, "replay: %s\n", r.Replay)
	}
	return w.err
}

// stickyWriter writes to w until a write fails, and keeps that error.
type stickyWriter struct {
	w   io.Writer
	err error
}

func (s *stickyWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.w.Write(p)
	s.err = err
	return n, err
}

func (r *Report) classNote(c Class) string {
	switch c {
	case Refused:
		return fmt.Sprintf("oversize prompts: %d; refused prompt_too_long %d, answered %d, other codes: %s", r.Requests.Oversize.Total,
			r.Requests.Oversize.Refused, r.Requests.Oversize.Answered, countsText(r.Requests.Oversize.Other))
	case CleanError:
		return "by code:"
	}
	return ""
}

// total is the sum of counts.
func total(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// countsText is counts by name, in name order: "busy 2, node_lost 5";
// "none" when there are none.
func countsText[N int | uint64](counts map[string]N) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		out = append(out, fmt.Sprintf("%s %d", k, counts[k]))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

func (r *Report) pools() int {
	n := 0
	for _, node := range r.Nodes {
		n += len(node.Pools)
	}
	return n
}

func ms(v float64) string {
	return (time.Duration(v * float64(time.Millisecond))).Round(time.Millisecond).String()
}

// writeFaults writes the faults by kind and the share of clean errors.
func (r *Report) writeFaults(w io.Writer) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FAULT KIND\tFAULTS\tREQUESTS DURING\tCORRECT\tCLEAN ERRORS\tWRONG\tERROR SHARE\tCLEAN SHARE OF FAILED\tERRORS BY CODE")
	for _, s := range r.ByFault {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.1f%%\t%.1f%%\t%s\n", s.Kind, s.Faults, s.Requests, s.Correct, s.CleanErrors,
			s.Wrong, 100*s.ErrorShare, 100*s.CleanShare, countsText(s.ByCode))
	}
	tw.Flush()
}
