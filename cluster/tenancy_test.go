//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// and gRPC; see node_test.go.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/tenancy"
)

// load keeps n requests of a tenant in flight through a client until its
// context ends, counting the tokens streamed to it (all of them, and those
// streamed while counting says so), the requests answered and those that
// failed (with the last failure), and how many of its requests are
// streaming: each has had a decode step and is in a worker's set until it
// ends.
type load struct {
	tokens, counted, done, failed atomic.Uint64
	streaming                     atomic.Int64
	mu                            sync.Mutex
	lastErr                       error
	wg                            sync.WaitGroup
}

func (l *load) start(ctx context.Context, c *client.Client, tenant string, n, maxTokens int, counting func() bool) {
	for i := range n {
		l.wg.Go(func() {
			for ctx.Err() == nil {
				streamed := false
				_, err := c.Generate(ctx, tenant, fmt.Sprintf("Once upon a time, %s's request %d", tenant, i),
					client.GenerateOptions{MaxTokens: maxTokens}, func(int) {
						if !streamed {
							streamed = true
							l.streaming.Add(1)
						}
						l.tokens.Add(1)
						if counting() {
							l.counted.Add(1)
						}
					})
				if streamed {
					l.streaming.Add(-1)
				}
				if err == nil {
					l.done.Add(1)
				}
				if err != nil && ctx.Err() == nil {
					l.failed.Add(1)
					l.mu.Lock()
					l.lastErr = err
					l.mu.Unlock()
				}
			}
		})
	}
}

func (l *load) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastErr
}

// TestTenantsShareASaturatedDecodeWorkerByWeight: a tenant flooding a
// decode worker with twelve times the sequences it steps at once gets no
// more of its compute than its weight says while another tenant has
// sequences waiting there. Counted in tokens streamed to each tenant's
// client while both are backlogged at the worker (their sequences alike,
// so tokens weigh the same), a ratio of counts that the schedule decides,
// not the machine's speed; stepped round robin by sequence, the other
// tenant's part would be 24 of 72, a third.
func TestTenantsShareASaturatedDecodeWorkerByWeight(t *testing.T) {
	for _, c := range []struct {
		name           string
		victimWeight   int
		least, most    float64
		wantPartOfFour string
	}{
		{"equal weights", 1, 0.42, 0.58, "2 of 4"},
		{"weights 3 to 1", 3, 0.62, 0.85, "3 of 4"},
	} {
		t.Run(c.name, func(t *testing.T) {
			policy := tenancy.DefaultPolicy()
			policy.Tenants = map[string]tenancy.Share{"victim": {Weight: c.victimWeight}}
			shares := tenancy.NewShares(policy)
			tune := func(cfg *NodeConfig) {
				cfg.Actors.Tenants = shares
				cfg.Actors.BatchMax, cfg.Actors.QueueMax = 4, 128
				// Room for every request of both tenants, on both sides.
				cfg.Actors.PrefillPages, cfg.Actors.DecodePages = 512, 512
			}
			p := startNodeTuned(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, nil, tune)
			d := startNodeTuned(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, nil, tune, p.GossipAddr())
			r := startNodeTuned(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, nil, tune, p.GossipAddr())
			for _, n := range []*Node{p, d, r} {
				waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 3 && routable(n) })
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// 48 sequences of the flood and 24 of the victim, each far more
			// than its part of a batch of 4. Both stay backlogged while
			// their requests end and start again only as long as a
			// request's turn-over (answer, client, router, prefill,
			// transfer) takes fewer steps than the others' sequences fill;
			// on a loaded machine it may not, and the worker then rightly
			// gives the victim's part to the flood. So tokens count only
			// while at least backlog of the victim's requests are streaming,
			// three times its part of a batch: a request streaming at the
			// client may have ended at the worker, its last tokens on
			// their way.
			backlog := int64(3 * 4 * c.victimWeight / (c.victimWeight + 1))
			var flood, victim load
			counting := func() bool { return victim.streaming.Load() >= backlog && flood.streaming.Load() >= backlog }
			flood.start(ctx, tenantClient(t, r.Address(), "flood"), "flood", 48, 64, counting)
			waitFor(t, "the flood streaming", time.Minute, func() bool { return flood.tokens.Load() >= 48*8 })
			victim.start(ctx, tenantClient(t, r.Address(), "victim"), "victim", 24, 64, counting)
			// Counted once the victim's requests have come to the worker
			// (as many answered as it keeps in flight: while its first
			// requests queue for their prefills behind the flood's, the
			// flood has the worker to itself), for its next 2,048 tokens
			// counted.
			waitFor(t, "the victim's first answers", time.Minute, func() bool { return victim.done.Load() >= 24 })
			f0, v0 := flood.counted.Load(), victim.counted.Load()
			waitFor(t, "the victim's next 2,048 tokens counted", 3*time.Minute, func() bool { return victim.counted.Load()-v0 >= 2048 })
			f, v := flood.counted.Load()-f0, victim.counted.Load()-v0
			cancel()
			testwait.Group(t, "the flood's clients stopped", time.Minute, &flood.wg)
			testwait.Group(t, "the victim's clients stopped", time.Minute, &victim.wg)
			if n := flood.failed.Load() + victim.failed.Load(); n > 0 {
				t.Fatalf("%d requests failed, the last: %v %v", n, flood.err(), victim.err())
			}
			part := float64(v) / float64(v+f)
			t.Logf("victim %d tokens, flood %d: the victim's part %.3f (weight %d to 1, %s of each step)", v, f, part, c.victimWeight, c.wantPartOfFour)
			if part < c.least || part > c.most {
				t.Fatalf("the victim's part of the tokens: %.3f (victim %d, flood %d), want %.2f to %.2f", part, v, f, c.least, c.most)
			}
			waitFor(t, "every pool free", time.Minute, func() bool { return allFree(p, d) })
		})
	}
}

// TestTenantBoundsHoldAtTheRouter: the router holds each tenant, named by
// its certificate, to its share's concurrent_max and pages_max, refusing
// the request past either as busy naming the bound, with the numbers,
// counted by bound in status; another tenant is admitted meanwhile, and
// the tenant again once its requests end.
func TestTenantBoundsHoldAtTheRouter(t *testing.T) {
	policy := tenancy.DefaultPolicy()
	policy.Tenants = map[string]tenancy.Share{"flood": {ConcurrentMax: 2}, "paged": {PagesMax: 1}}
	shares := tenancy.NewShares(policy)
	p, d, r, gate := startGatedTrio(t, func(cfg *NodeConfig) { cfg.Actors.Tenants = shares })
	flood, victim := tenantClient(t, r.Address(), "flood"), tenantClient(t, r.Address(), "victim")
	inFlight := func(want uint32) func() bool { return func() bool { return r.Status().Node.InFlight == want } }
	gate.Shut()
	ctx, cancel := context.WithCancel(context.Background())
	var held sync.WaitGroup
	hold := func(c *client.Client, tenant string) {
		held.Go(func() {
			_, _ = c.Generate(ctx, tenant, "Once upon a time", client.GenerateOptions{MaxTokens: 32}, nil)
		})
	}
	// Every transfer to the decode node is held at the gate: the requests
	// stay in flight until cancelled.
	hold(flood, "flood")
	hold(flood, "flood")
	waitFor(t, "the flood's two requests in flight", time.Minute, inFlight(2))
	_, err := flood.Generate(context.Background(), "flood", "Once upon a time", client.GenerateOptions{MaxTokens: 32}, nil)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodeBusy || we.Where != "tenant concurrent_max" || we.Have != 2 || we.Limit != 2 {
		t.Fatalf("the flood's third request: %v, want busy at tenant concurrent_max, have 2, limit 2", err)
	}
	hold(victim, "victim")
	waitFor(t, "the victim's request in flight beside the flood's", time.Minute, inFlight(3))
	_, err = tenantClient(t, r.Address(), "paged").Generate(context.Background(), "paged", "Once upon a time",
		client.GenerateOptions{MaxTokens: 32}, nil)
	if !errors.As(err, &we) || we.Code != messages.CodeBusy || we.Where != "tenant pages_max" || we.Have != 0 || we.Limit != 1 {
		t.Fatalf("a request of more pages than its tenant's pages_max: %v, want busy at tenant pages_max, have 0, limit 1", err)
	}
	cancel()
	testwait.Group(t, "the held requests cancelled", time.Minute, &held)
	waitFor(t, "every request ended", time.Minute, inFlight(0))
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	hold(flood, "flood")
	waitFor(t, "the flood admitted again once its requests ended", time.Minute, inFlight(1))
	names := actors.RejectBoundNames()
	got := map[string]uint64{}
	for i, n := range r.Status().Node.RejectedBy {
		got[names[i]] = n
	}
	if got["tenant_concurrent_max"] != 1 || got["tenant_pages_max"] != 1 {
		t.Fatalf("refusals by bound %v, want one each of tenant_concurrent_max and tenant_pages_max", got)
	}
	cancel()
	testwait.Group(t, "the held requests cancelled", time.Minute, &held)
	waitFor(t, "every pool free", time.Minute, func() bool { return allFree(p, d) })
}
