package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// job is one plan a prefill run took on, as its shell and the oracle see
// it: whom its rows are computed for, and what ended it so far.
type job struct {
	key    handoff.JobKey
	target label  // the plan's owner on its decode run
	local  uint64 // the source pages' owner here
	// acked, aborted: decode's ack or abort for the plan reached the
	// source; failed: its prefill or its send failed. Only these may free
	// source pages before their reclaim deadline.
	acked, aborted, failed bool
	// prompt is the plan's; scope the oracle's account of the cache scope
	// of the client it serves (world.scopeName); read the cached pages
	// its prefill read through shared leases.
	prompt []int
	scope  string
	read   map[kv.Tag]bool
}

// prefilled is a plan computed and not yet sent: the frames, and the
// leases that keep their payloads (the source pages' bytes) in place.
type prefilled struct{ frames handoff.Frames }

// parseSender is the node and run a JobKey's sender names (senderKey).
func (w *world) parseSender(s string) (*node, uint64, error) {
	addr, hex, _ := strings.Cut(s, "/")
	inc, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("sim: sender %q: %w", s, err)
	}
	n, err := w.node(addr)
	return n, inc, err
}

// sourceIn takes a control message for the prefill worker.
func (n *node) sourceIn(d *delivery, m messages.Message) {
	from := senderKey(d.from.addr, d.inc)
	switch m := m.(type) {
	case *messages.TransferPlan:
		key := handoff.JobKey{Sender: from, ID: m.RequestID}
		n.runSource(handoff.PlanIn{Key: key, Plan: m}, d.from, d.inc)
	case *messages.TransferAck:
		key := handoff.JobKey{Sender: from, ID: m.RequestID}
		if j := n.byKey[key]; j != nil {
			j.acked = true
		}
		n.runSource(handoff.AckIn{Key: key, Ack: m}, nil, 0)
	case *messages.TransferAbort:
		key := handoff.JobKey{Sender: from, ID: m.RequestID}
		if j := n.byKey[key]; j != nil {
			j.aborted = true
		}
		n.runSource(handoff.AbortIn{Key: key, Tenant: m.Tenant}, nil, 0)
	default:
		n.w.fail("messages", "%s got a %T, which no node sends to prefill", n.addr, m)
	}
}

// runSource steps the source and carries its effects out; from and inc
// are the sender of the plan being stepped, if one is.
func (n *node) runSource(ev handoff.Event, from *node, inc uint64) {
	handoff.Run(traced{m: n.src, t: &n.w.trace, who: n.addr + " source"}, ev, n.w.now,
		func(e handoff.Effect) handoff.Event { return n.doSource(e, from, inc) })
	n.armNext()
}

// armNext lets the worker start a queued plan, once.
func (n *node) armNext() {
	if n.nextArmd || !n.src.Startable() {
		return
	}
	n.nextArmd = true
	n.at(0, "source may start a plan", func() {
		n.nextArmd = false
		n.runSource(handoff.Next{}, nil, 0)
	})
}

func (n *node) doSource(e handoff.Effect, from *node, inc uint64) handoff.Event {
	w := n.w
	switch e := e.(type) {
	case handoff.RefusePlan:
		done := &messages.TransferDone{RequestID: e.Plan.RequestID, Tenant: e.Plan.Tenant, Err: handoff.Wire(e.Err)}
		n.reply(from, inc, done)
	case handoff.Queued, handoff.Ended:
	case handoff.Dropped:
		if e.Why == "duplicate transfer plan" {
			w.count[DuplicatePlanDropped]++
		}
	case handoff.Prefill:
		n.prefill(e)
	case handoff.SendFrames:
		n.startSend(e)
	case handoff.CancelSend:
		if s := n.sends[e.Key]; s != nil && !s.cancelled {
			s.cancelled = true
			n.at(0, "send cancelled", func() { n.endSend(s, errCancelled) })
		}
	case handoff.Ack:
		if j := n.jobs[e.Owner.Request]; j == nil || !j.acked && !j.aborted && !j.failed {
			w.fail("release after ack", "%s's source acknowledged the pages %s of owner %d without decode's ack, an abort or a failed transfer",
				n.addr, tags(e.Tags), e.Owner.Request)
		}
		if n.cache != nil && len(e.Chain) > 0 {
			handoff.ExecAckKeep(n.pages, n.cache, e, nil)
		} else {
			handoff.ExecAck(n.pages, e, nil)
		}
	case handoff.Release:
		handoff.ExecRelease(n.pages, e, nil)
	case handoff.Reply:
		to, toInc, err := w.parseSender(e.Key.Sender)
		if err != nil {
			w.fail("messages", "%s's source replies to %q: %v", n.addr, e.Key.Sender, err)
			return nil
		}
		if len(e.Done.HeldSums) > 0 && w.chance(Corrupt) {
			// A faulty prefill: the rows it reports for a page decode
			// holds are not the cached page's. Decode must refuse the
			// held pages before it reads a byte, and give them up.
			done := *e.Done
			done.HeldSums = slices.Clone(done.HeldSums)
			done.HeldSums[w.rng.IntN(len(done.HeldSums))] ^= 1 << w.rng.IntN(64)
			e.Done = &done
			w.count[HeldSumForged]++
			w.forged[handoff.JobKey{Sender: senderKey(to.addr, toInc), ID: done.RequestID}] = true
		}
		n.reply(to, toInc, e.Done)
	default:
		w.fail("effects", "%s's source asked for %T, which is not a source effect", n.addr, e)
	}
	return nil
}

func (n *node) reply(to *node, inc uint64, done *messages.TransferDone) {
	if to == nil {
		n.w.fail("effects", "%s's source answers a plan nobody sent", n.addr)
		return
	}
	if err := n.sendMessage(to, inc, done); err != nil {
		n.w.fail("messages", "%s's source built an invalid TransferDone: %v", n.addr, err)
	}
}

// prefill computes the plan now, through the prefix cache as a node's
// worker does, and answers after the compute time, so that an abort can
// land while it runs. It notes the prompt tokens the prefill read from the
// cache, which the client's result must report.
func (n *node) prefill(e handoff.Prefill) {
	w := n.w
	j := &job{key: e.Key, local: e.Local.Request, target: label{owner: e.Owner}, read: map[kv.Tag]bool{}}
	if len(e.Plan.DestTags) > 0 {
		j.target.inc = e.Plan.DestTags[0].Incarnation
	}
	j.prompt = make([]int, len(e.Plan.PromptTokens))
	for i, t := range e.Plan.PromptTokens {
		j.prompt[i] = int(t)
	}
	c := w.byAttempt[e.Key]
	if c == nil {
		w.fail("effects", "%s prefills plan %s/%d, which no client's attempt sent", n.addr, e.Key.Sender, e.Key.ID)
		return
	}
	j.scope = w.scopeName(c.tenant, c.salt)
	n.jobs[j.local], n.byKey[e.Key] = j, j
	var (
		out handoff.Prefilled
		fr  handoff.Frames
	)
	if n.cache == nil {
		out, fr = handoff.ExecPrefill(w.engine, n.pages, e)
	} else {
		if n.probes(j.prompt, j.scope) {
			w.count[CrossScopeProbe]++
		}
		out, fr = handoff.ExecPrefillCached(w.engine, n.pages, n.cache, e)
	}
	if out.Err == nil {
		w.cachedRead[e.Key] = len(j.read) * w.opt.PageTokens
		if len(j.read) > 0 {
			w.count[CacheHit]++
		}
	}
	n.ready[e.Key] = &prefilled{frames: fr}
	t := w.opt.Timing
	compute := time.Duration(len(e.Plan.PromptTokens)-out.Cached)*t.PrefillPerToken + w.between(0, t.Latency)
	n.at(compute, "prefill computed", func() {
		if out.Err != nil {
			j.failed = true // ExecPrefill left no lease
			delete(n.ready, e.Key)
		}
		n.runSource(out, nil, 0)
	})
}

// sourceLabel is the label a frame's rows carry to decode: the plan's
// owner there if every row was computed here for this job, else the first
// row that was not.
func (n *node) sourceLabel(j *job, f kv.Frame) label {
	p := n.pages
	want := label{inc: n.inc, owner: kv.Owner{Request: j.local, Tenant: j.target.owner.Tenant}}
	got := want
	base := int(f.Source.Index) * p.pt
	for r := range f.Tokens {
		if l := p.rows[base+r]; l != want {
			got = l
			break
		}
	}
	if got.inc == n.inc {
		if o := n.jobs[got.owner.Request]; o != nil {
			return o.target
		}
	}
	return got
}
