package actors

import (
	"log/slog"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// PrefillName is the name of every prefilling node's dispatcher: request
// actors, here or in other nodes, send plans to actor.NewPID(address,
// PrefillName).
const PrefillName = "prefill"

// DispatchStatus asks a dispatcher for a DispatchStatusReply.
type DispatchStatus struct{}

// DispatchStatusReply counts the plans a dispatcher has handed out and not
// seen acknowledged or aborted.
type DispatchStatusReply struct{ Outstanding int }

// dispatchActor hands each transfer plan to the prefill worker with the
// fewest outstanding plans, or, with prefix caches, to the worker it sent
// the longest run of the prompt's pages to before (handoff.PrefixAffinity)
// unless that worker has handoff.AffinityImbalanceMax more plans
// outstanding than the least loaded; it keeps the plan's sender as the
// sender so the worker answers the request actor directly; the plan's ack
// or abort goes to the same worker. It refuses, before any worker sees
// them, plans that the policy refuses, and drops duplicates of plans that
// ended.
type dispatchActor struct {
	workers []*actor.PID
	forget  time.Duration // after which a plan never acknowledged is dropped
	policy  planPolicy
	ended   *handoff.DonePlans
	log     *slog.Logger
	load    []int
	jobs    map[handoff.JobKey]dispatched // until its ack or abort
	// keysOf are the keys of a plan's cacheable pages in its scope, as
	// the workers' caches key them; nil without caches or with one worker.
	keysOf   func(*messages.TransferPlan) []kv.PrefixKey
	affinity *handoff.PrefixAffinity
}

type dispatched struct {
	worker  int
	plan    *messages.TransferPlan
	expires time.Time
}

func (d *dispatchActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		d.load = make([]int, len(d.workers))
		d.jobs = map[handoff.JobKey]dispatched{}
		d.affinity = handoff.NewPrefixAffinity()
	case *messages.TransferPlan:
		now := time.Now()
		d.prune(now)
		key := handoff.JobKey{Sender: senderKey(c), ID: m.RequestID}
		if err := d.policy.check(c, m); err != nil {
			if err := refusePlan(c, m, err); err != nil {
				d.log.Error("transfer done refused by its own validation", "err", err)
			}
			return
		}
		if d.ended.Has(key, now) {
			d.log.Warn("duplicate of an ended transfer plan dropped", "request", m.RequestID, "from", key.Sender)
			return
		}
		j, ok := d.jobs[key]
		if !ok {
			j = dispatched{worker: d.pick(m), plan: m, expires: now.Add(d.forget)}
			d.jobs[key] = j
			d.load[j.worker]++
		}
		c.RequestWithCustomSender(d.workers[j.worker], m, c.Sender())
	case *messages.TransferAck:
		key := handoff.JobKey{Sender: senderKey(c), ID: m.RequestID}
		if j, ok := d.jobs[key]; ok {
			if why := handoff.AckMismatch(m, j.plan); why != "" {
				d.log.Warn(why+"; dropped", "request", m.RequestID, "from", key.Sender)
				return
			}
		}
		d.done(c, key, m)
	case *messages.TransferAbort:
		d.done(c, handoff.JobKey{Sender: senderKey(c), ID: m.RequestID}, m)
	case DispatchStatus:
		c.Respond(DispatchStatusReply{Outstanding: len(d.jobs)})
	}
}

// pick is the worker a new plan goes to.
func (d *dispatchActor) pick(m *messages.TransferPlan) int {
	least := slices.Index(d.load, slices.Min(d.load))
	if d.keysOf == nil {
		return least
	}
	keys := d.keysOf(m)
	best, hits := least, 0
	for w := range d.workers {
		if h := d.affinity.Hits(keys, uint64(w)); h > hits || h == hits && h > 0 && d.load[w] < d.load[best] {
			best, hits = w, h
		}
	}
	if hits == 0 || d.load[best]-d.load[least] > handoff.AffinityImbalanceMax {
		best = least
	}
	d.affinity.Routed(keys, uint64(best))
	return best
}

func (d *dispatchActor) done(c actor.Context, key handoff.JobKey, m messages.Message) {
	j, ok := d.jobs[key]
	if !ok {
		return
	}
	delete(d.jobs, key)
	d.ended.Add(key, time.Now())
	d.load[j.worker]--
	c.RequestWithCustomSender(d.workers[j.worker], m, c.Sender())
}

// prune drops plans whose decode node never answered: by now the worker's
// source pages have been reclaimed.
func (d *dispatchActor) prune(now time.Time) {
	for k, j := range d.jobs {
		if now.After(j.expires) {
			delete(d.jobs, k)
			d.load[j.worker]--
		}
	}
}
