package handoff

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/mutant"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// SourceConfig is one prefill worker's side of its transfers.
type SourceConfig struct {
	// Role names the worker in errors ("prefill").
	Role string
	// PageTokens is the worker's pool's page size; a plan must share it.
	PageTokens int
	// Model is the fingerprint of the model the worker computes; a plan
	// must name the same.
	Model engine.Fingerprint
	// QueueMax bounds the plans waiting to start; SendsMax the transfers
	// to other nodes' data planes in flight at once.
	QueueMax, SendsMax int
	// ReclaimAfter is the pool's reclaim deadline, after which a source
	// page awaiting an ack that never came is gone anyway.
	ReclaimAfter time.Duration
	// DonePlansMax ended plans are remembered, each for DoneFor.
	DonePlansMax int
	DoneFor      time.Duration
}

// JobKey names a plan as its sender does: the request's address and its
// request id. Request ids are unique only per decode node, so the pages a
// plan takes here belong to a local owner of their own.
type JobKey struct {
	Sender string
	ID     uint64
}

// Events of a Source.
type (
	// PlanIn is a plan from Key.Sender; Refused is why the caller's policy
	// refuses its sender, if it does.
	PlanIn struct {
		Key     JobKey
		Plan    *messages.TransferPlan
		Refused error
	}
	// Next: the worker may start one queued plan now.
	Next struct{}
	// Prefilled answers Prefill: the source pages reserved (Sources; the
	// first Marked of them marked as awaiting the ack), prefill's first
	// token and the pages' seal checksums, or why it failed. Once the
	// prompt is computed, Sources are only the pages sent: those of the
	// plan's HeldPages, which decode holds already, are given back.
	//
	// With a prefix cache, Cached is how many of the prompt's first tokens
	// came from it (whole pages), and Chain the keys of the cacheable
	// pages of Sources (Chain[i] is Sources[i]'s): those past Cached are
	// the source pages the cache keeps, under Scope, once decode has them.
	Prefilled struct {
		Key     JobKey
		Sources []kv.Tag
		Marked  int
		First   int
		Sums    []uint64
		// HeldSums are the kv.ContentChecksum of the rows computed for
		// each page of the plan's HeldPages, for decode to check its
		// copies against.
		HeldSums []uint64
		Err      error
		Cached   int
		Scope    kv.Scope
		Chain    []kv.PrefixKey
	}
	// Sent answers SendFrames: the frames went (Err nil) or did not; the
	// leases that kept their payloads are given back already.
	Sent struct {
		Key JobKey
		Err error
	}
	// AckIn and AbortIn end a plan from the side that sent it.
	AckIn struct {
		Key JobKey
		Ack *messages.TransferAck
	}
	AbortIn struct {
		Key    JobKey
		Tenant string
	}
)

// Effects of a Source.
type (
	// RefusePlan answers a plan that will not run with a TransferDone
	// error.
	RefusePlan struct {
		Plan *messages.TransferPlan
		Err  error
	}
	// Queued: a plan was taken; it will be answered with a Reply.
	Queued struct{ Key JobKey }
	// Dropped: a plan was dropped without an answer (a duplicate).
	Dropped struct {
		Key JobKey
		Why string
	}
	// Prefill computes the plan's KV into the worker's pool as Local,
	// reads every page under a lease into a frame for the plan's
	// destination (as Owner), and marks each source page as awaiting the
	// ack; answered by Prefilled.
	Prefill struct {
		Key          JobKey
		Plan         *messages.TransferPlan
		Owner, Local kv.Owner
	}
	// SendFrames sends the prefilled frames: as messages to the request
	// in this process when Plan.DataPlane is empty, else to that data
	// plane; answered by Sent (at once, or when the send ends).
	SendFrames struct {
		Key  JobKey
		Plan *messages.TransferPlan
	}
	// CancelSend ends the send in flight of Key; its Sent follows.
	CancelSend struct{ Key JobKey }
	// Ack marks source pages acknowledged, which frees the released ones;
	// the pages of Chain (the keys of Tags' first pages) past their first
	// Cached tokens (those the prefill computed), once decode has them,
	// go to the prefix cache under Scope instead (ExecAckKeep).
	Ack struct {
		Owner  kv.Owner
		Tags   []kv.Tag
		Cached int
		Scope  kv.Scope
		Chain  []kv.PrefixKey
	}
	// Reply answers the plan's sender with Done.
	Reply struct {
		Key  JobKey
		Done *messages.TransferDone
	}
	// Ended: the plan of Key ended without a Reply (withdrawn by its
	// abort, or aborted while its frames were on their way).
	Ended struct{ Key JobKey }
)

func (PlanIn) event()    {}
func (Next) event()      {}
func (Prefilled) event() {}
func (Sent) event()      {}
func (AckIn) event()     {}
func (AbortIn) event()   {}

func (RefusePlan) effect() {}
func (Queued) effect()     {}
func (Dropped) effect()    {}
func (Prefill) effect()    {}
func (SendFrames) effect() {}
func (CancelSend) effect() {}
func (Ack) effect()        {}
func (Reply) effect()      {}
func (Ended) effect()      {}

// job is one plan from arrival until decode acknowledges it.
type job struct {
	key     JobKey
	plan    *messages.TransferPlan
	owner   kv.Owner // decode's: every frame carries it
	local   kv.Owner // this pool's owner of the source pages
	sources []kv.Tag
	marked  int      // sources marked as awaiting decode's ack
	first   int      // the first generated token
	sums    []uint64 // the sources' seal checksums, in order
	held    []uint64 // the content checksums of the pages decode holds
	cached  int      // prompt tokens read from the prefix cache
	scope   kv.Scope
	chain   []kv.PrefixKey
	expires time.Time
}

// Source is one prefill worker's side of every transfer: plans queue (at
// most QueueMax), start one at a time, and their frames are sent (at most
// SendsMax to other nodes at once); a source page is released when its
// frames went and freed only by decode's ack, the plan's abort, or its
// reclaim deadline. A plan that ended is remembered so that a duplicate is
// dropped rather than prefilled for nobody.
type Source struct {
	cfg       SourceConfig
	queue     []*job
	running   *job            // prefilling, between Prefill and its Prefilled
	sending   map[JobKey]*job // frames on their way
	awaiting  map[JobKey]*job // sent, waiting for decode's ack
	done      *DonePlans
	nextLocal uint64
}

// NewSource is an idle worker's side.
func NewSource(cfg SourceConfig) *Source {
	return &Source{cfg: cfg, sending: map[JobKey]*job{}, awaiting: map[JobKey]*job{},
		done: NewDonePlans(cfg.DonePlansMax, cfg.DoneFor)}
}

// SourceCounts is what a Source holds now.
type SourceCounts struct{ Queued, Sending, AwaitingAck int }

// Counts says how many plans are in each state.
func (s *Source) Counts() SourceCounts {
	return SourceCounts{Queued: len(s.queue), Sending: len(s.sending), AwaitingAck: len(s.awaiting)}
}

// Startable reports whether Next would start a plan: one is queued, and it
// is for this process or fewer than SendsMax sends are in flight.
func (s *Source) Startable() bool { return s.startable() >= 0 }

func (s *Source) startable() int {
	if s.running != nil {
		return -1
	}
	return slices.IndexFunc(s.queue, func(j *job) bool {
		return j.plan.DataPlane == "" || len(s.sending) < s.cfg.SendsMax
	})
}

// Step takes one event at now and returns what to do.
func (s *Source) Step(ev Event, now time.Time) []Effect {
	switch e := ev.(type) {
	case PlanIn:
		return s.planIn(e, now)
	case Next:
		i := s.startable()
		if i < 0 {
			return nil
		}
		j := s.queue[i]
		s.queue = slices.Delete(s.queue, i, i+1)
		s.running = j
		return []Effect{Prefill{Key: j.key, Plan: j.plan, Owner: j.owner, Local: j.local}}
	case Prefilled:
		return s.prefilled(e, now)
	case Sent:
		j := s.sending[e.Key]
		if j == nil {
			return nil
		}
		delete(s.sending, e.Key)
		return s.sent(j, e.Err, now)
	case AckIn:
		// The ack repeats the plan's figures: one for another plan is not
		// this plan's ack.
		if j := s.find(e.Key); j != nil {
			if why := AckMismatch(e.Ack, j.plan); why != "" {
				return []Effect{Dropped{Key: e.Key, Why: why}}
			}
		}
		return s.drop(e.Key, e.Ack.Tenant, now)
	case AbortIn:
		return s.drop(e.Key, e.Tenant, now)
	}
	return nil
}

// AckMismatch says why ack is not the acknowledgement of plan (it repeats
// the plan's token and page counts), or "" when it is.
func AckMismatch(ack *messages.TransferAck, plan *messages.TransferPlan) string {
	if int(ack.TokenCount) == len(plan.PromptTokens) && int(ack.Pages) == len(plan.DestTags) {
		return ""
	}
	return fmt.Sprintf("ack for %d tokens in %d pages, the plan has %d in %d",
		ack.TokenCount, ack.Pages, len(plan.PromptTokens), len(plan.DestTags))
}

// planIn queues a plan, or answers at once why it cannot run.
func (s *Source) planIn(e PlanIn, now time.Time) []Effect {
	err := e.Refused
	switch {
	case err != nil:
	case e.Plan.Model != s.cfg.Model.String():
		theirs, _ := engine.ParseFingerprint(e.Plan.Model) // a plan's fingerprint was validated on arrival
		err = &engine.FingerprintError{Ours: s.cfg.Model, Theirs: theirs}
	case int(e.Plan.PageTokens) != s.cfg.PageTokens:
		err = &BadRequestError{Reason: fmt.Sprintf("plan pages of %d tokens, this pool's hold %d", e.Plan.PageTokens, s.cfg.PageTokens)}
	case s.find(e.Key) != nil || s.done.Has(e.Key, now):
		// A duplicate of a plan in hand, or of one that ended: answering
		// it with an error would make the request abandon the transfer
		// under way, and running it again would prefill for nobody.
		return []Effect{Dropped{Key: e.Key, Why: "duplicate transfer plan"}}
	case len(s.queue) >= s.cfg.QueueMax:
		err = &BusyError{Where: s.cfg.Role + " queue", Have: len(s.queue), Limit: s.cfg.QueueMax}
	}
	if err != nil {
		return []Effect{RefusePlan{Plan: e.Plan, Err: err}}
	}
	s.nextLocal++
	s.queue = append(s.queue, &job{key: e.Key, plan: e.Plan, owner: e.Plan.Owner(),
		local: kv.Owner{Request: s.nextLocal, Tenant: e.Plan.Tenant}})
	return []Effect{Queued{Key: e.Key}}
}

// find is the plan of key in hand, if any.
func (s *Source) find(key JobKey) *job {
	if s.running != nil && s.running.key == key {
		return s.running
	}
	if j := s.sending[key]; j != nil {
		return j
	}
	if j := s.awaiting[key]; j != nil {
		return j
	}
	if i := slices.IndexFunc(s.queue, func(j *job) bool { return j.key == key }); i >= 0 {
		return s.queue[i]
	}
	return nil
}

func (s *Source) prefilled(e Prefilled, now time.Time) []Effect {
	j := s.running
	if j == nil || j.key != e.Key {
		return nil
	}
	s.running = nil
	j.sources, j.marked, j.first, j.sums, j.held = e.Sources, e.Marked, e.First, e.Sums, e.HeldSums
	j.cached, j.scope, j.chain = e.Cached, e.Scope, e.Chain
	if e.Err != nil {
		return s.sent(j, e.Err, now)
	}
	s.sending[j.key] = j
	return []Effect{SendFrames{Key: j.key, Plan: j.plan}}
}

// sent finishes a job whose frames went (err nil) or did not: the source
// pages are released and decode is told. Released now, a source page
// awaiting the ack is freed when decode acknowledges, or at its reclaim
// deadline if decode never answers (a dead decode node strands nothing). A
// failed transfer will not be acknowledged, so its pages are acknowledged
// here.
func (s *Source) sent(j *job, err error, now time.Time) []Effect {
	if err != nil && s.done.Has(j.key, now) {
		// Aborted, and its send cut short: nobody waits for an answer.
		return []Effect{Ack{Owner: j.local, Tags: j.sources[:j.marked]}, Release{Owner: j.local, Tags: j.sources},
			Ended{Key: j.key}}
	}
	var out []Effect
	if err != nil {
		out = append(out, Ack{Owner: j.local, Tags: j.sources[:j.marked]})
	}
	out = append(out, Release{Owner: j.local, Tags: j.sources})
	if err != nil {
		return append(out, Reply{Key: j.key, Done: &messages.TransferDone{RequestID: j.owner.Request, Tenant: j.owner.Tenant,
			Err: Wire(err)}})
	}
	if s.done.Has(j.key, now) {
		// Aborted while its frames were on their way: nobody will
		// acknowledge them.
		return append(out, Ack{Owner: j.local, Tags: j.sources}, Ended{Key: j.key})
	}
	for k, a := range s.awaiting {
		if now.After(a.expires) {
			delete(s.awaiting, k) // reclaimed: its decode node will never answer
		}
	}
	if mutant.Is(mutant.EarlyRelease) {
		out = append(out, Ack{Owner: j.local, Tags: j.sources}) // the planted bug: freed before decode's ack
	}
	j.expires = now.Add(s.cfg.ReclaimAfter)
	s.awaiting[j.key] = j
	return append(out, Reply{Key: j.key, Done: &messages.TransferDone{RequestID: j.owner.Request, Tenant: j.owner.Tenant,
		First: uint32(j.first), Frames: uint32(len(j.sums)), Source: j.local.Request, Sums: j.sums, Cached: uint32(j.cached),
		HeldSums: j.held}})
}

// drop ends a plan, acknowledged or abandoned, and remembers it so that a
// duplicate is not run again: a queued plan is withdrawn, a send in flight
// is cancelled (its Sent frees the pages), and a plan awaiting its ack has
// its source pages (released already) freed. Only the plan's tenant may.
func (s *Source) drop(key JobKey, tenant string, now time.Time) []Effect {
	if i := slices.IndexFunc(s.queue, func(j *job) bool { return j.key == key }); i >= 0 {
		if s.queue[i].owner.Tenant == tenant {
			s.queue = slices.Delete(s.queue, i, i+1)
			s.done.Add(key, now)
			return []Effect{Ended{Key: key}}
		}
		return nil
	}
	if j := s.running; j != nil && j.key == key {
		if j.owner.Tenant == tenant {
			s.done.Add(key, now) // its send will find it ended
		}
		return nil
	}
	if j := s.sending[key]; j != nil {
		if j.owner.Tenant == tenant {
			s.done.Add(key, now)
			return []Effect{CancelSend{Key: key}}
		}
		return nil
	}
	j := s.awaiting[key]
	if j == nil || j.owner.Tenant != tenant {
		return nil
	}
	delete(s.awaiting, key)
	s.done.Add(key, now)
	// Sent whole and sealed, the pages hold the prompt's KV whatever
	// decode made of it: worth keeping after an abort as after the ack.
	held := int(j.plan.HeldPages) * s.cfg.PageTokens // before Sources and Chain
	return []Effect{Ack{Owner: j.local, Tags: j.sources, Cached: max(0, j.cached-held), Scope: j.scope, Chain: j.chain}}
}

// DonePlans remembers plans that ended (acknowledged or aborted) by their
// key, each for a while and at most max of them, so that a duplicate of one
// is dropped rather than run again: its pages were acknowledged or given up
// already. The oldest are forgotten first.
type DonePlans struct {
	max   int
	ttl   time.Duration
	at    map[JobKey]time.Time
	order []JobKey // by age
}

// NewDonePlans remembers at most max plans, each for ttl.
func NewDonePlans(max int, ttl time.Duration) *DonePlans {
	return &DonePlans{max: max, ttl: ttl, at: map[JobKey]time.Time{}}
}

// Add remembers k as ended at now.
func (d *DonePlans) Add(k JobKey, now time.Time) {
	d.forget(now)
	if _, ok := d.at[k]; ok {
		return
	}
	if len(d.order) == d.max {
		delete(d.at, d.order[0])
		d.order = d.order[1:]
	}
	d.at[k] = now
	d.order = append(d.order, k)
}

// Has reports whether k ended within ttl of now.
func (d *DonePlans) Has(k JobKey, now time.Time) bool {
	d.forget(now)
	_, ok := d.at[k]
	return ok
}

func (d *DonePlans) forget(now time.Time) {
	for len(d.order) > 0 && now.Sub(d.at[d.order[0]]) >= d.ttl {
		delete(d.at, d.order[0])
		d.order = d.order[1:]
	}
}
