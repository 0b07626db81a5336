package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
)

// Messages from a request actor to its decode worker, which keeps the
// decode pool's prefix cache (Config.DecodeCachePercent).
type (
	// heldMatch asks for the cached run of a prompt's first pages
	// (handoff.HeldCache.Match); answered by a heldMatchReply.
	heldMatch struct {
		Tenant, Salt string
		Prompt       []int
	}
	heldMatchReply struct {
		Hits  []kv.CachedPage
		Scope kv.Scope
		Use   uint64
	}
	// heldForget evicts a page of a match whose lease was refused.
	heldForget struct{ Hit kv.CachedPage }
	// heldEvict gives up cached pages for a reservation the pool is
	// short of; answered by how many (an int).
	heldEvict struct {
		N   int
		Use uint64
	}
	// heldRead counts the pages of a match a request copied.
	heldRead struct{ Pages int }
	// keepPages hands an answered request's prompt pages to the cache
	// (handoff.ExecKeep).
	keepPages struct{ handoff.Keep }
)

// workerCache is a decode worker's prefix cache as a request actor
// reserves through it (handoff.HeldCache): asks to the worker, which keeps
// the index. An ask that is not answered in time is a miss, or no page
// given up: the request's own pages are reserved from the pool actor, so
// nothing is stranded.
type workerCache struct {
	r       Requester
	worker  *actor.PID
	timeout time.Duration
}

var _ handoff.HeldCache = workerCache{}

func (w workerCache) Match(tenant, salt string, prompt []int) ([]kv.CachedPage, kv.Scope, uint64) {
	rep, err := ask[heldMatchReply](w.r, w.worker, heldMatch{Tenant: tenant, Salt: salt, Prompt: prompt}, w.timeout)
	if err != nil {
		return nil, kv.Scope{}, 0
	}
	return rep.Hits, rep.Scope, rep.Use
}

func (w workerCache) Forget(hit kv.CachedPage) { w.r.Send(w.worker, heldForget{Hit: hit}) }

func (w workerCache) Read(pages int) { w.r.Send(w.worker, heldRead{Pages: pages}) }

func (w workerCache) Evict(n int, use uint64) int {
	got, err := ask[int](w.r, w.worker, heldEvict{N: n, Use: use}, w.timeout)
	if err != nil {
		return 0
	}
	return got
}

// held answers a message of the decode pool's prefix cache. Only the
// requests of a node with one send them; a worker without one answers as
// an empty cache would, and releases the pages of a Keep, so that a
// request told otherwise loses no time and strands no page.
func (w *workerActor) held(c actor.Context, m any) {
	refused := func(t kv.Tag, err error) {
		w.log.Warn("release of decode page refused", "tag", t.String(), "err", err)
	}
	if w.cache == nil {
		switch m := m.(type) {
		case heldMatch:
			c.Respond(heldMatchReply{})
		case heldEvict:
			c.Respond(0)
		case keepPages:
			handoff.ExecRelease(w.kv, handoff.Release{Owner: m.Owner, Tags: m.Tags}, refused)
		}
		return
	}
	local := handoff.LocalCache{Pages: w.kv, Cache: w.cache}
	switch m := m.(type) {
	case heldMatch:
		hits, scope, use := local.Match(m.Tenant, m.Salt, m.Prompt)
		c.Respond(heldMatchReply{Hits: hits, Scope: scope, Use: use})
	case heldForget:
		local.Forget(m.Hit)
	case heldEvict:
		c.Respond(local.Evict(m.N, m.Use))
	case heldRead:
		local.Read(m.Pages)
	case keepPages:
		handoff.ExecKeep(w.kv, w.cache, m.Keep, refused)
	}
	w.pool.cache.Store(new(w.cache.Stats()))
}
