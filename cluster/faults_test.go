//go:build chaos && !race

// Several protoactor remote instances in one process race inside protoactor
// and gRPC; see node_test.go.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/messages"
)

// injectFaults installs an injector of spec for the test's process: every
// data-plane sender in it faults its frames.
func injectFaults(t *testing.T, spec string) *faults.Injector {
	t.Helper()
	sp, err := faults.Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	inj, err := faults.New(sp)
	if err != nil {
		t.Fatal(err)
	}
	faults.Install(inj)
	t.Cleanup(func() { faults.Install(nil) })
	return inj
}

// startPair starts a prefill and a decode node and waits until each has
// verified the other.
func startPair(t *testing.T) (p, d *Node) {
	t.Helper()
	p = startClusterNode(t, actors.RolePrefill)
	d = startClusterNode(t, actors.RoleDecode, p.GossipAddr())
	for _, n := range []*Node{p, d} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 2 && routable(n) })
	}
	return p, d
}

// answerOrClean asks for maxTokens after prompt and checks the outcome: the
// reference answer, or an error with a wire code; it says which.
func answerOrClean(t *testing.T, c *client.Client, model *engine.Model, tenant, prompt string, maxTokens int) error {
	res, err := c.Generate(context.Background(), tenant, prompt, client.GenerateOptions{MaxTokens: maxTokens}, nil)
	if err != nil {
		var we *messages.WireError
		if !errors.As(err, &we) {
			t.Errorf("%s's request failed without a wire code: %v", tenant, err)
		}
		return err
	}
	if want, _ := model.Answer(prompt, maxTokens); fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
		t.Errorf("%s's request under faults answered %v, reference %v", tenant, res.Tokens, want)
	}
	return nil
}

// TestCorruptFramesRefusedByChecksum: with every frame's payload flipped
// after its checksum, decode's data plane refuses the batch by checksum
// and the request fails with a wire error; the prefill node's status
// reports the spec and what it injected. Without the faults the next
// request answers right, and every page is free again.
func TestCorruptFramesRefusedByChecksum(t *testing.T) {
	p, d := startPair(t)
	inj := injectFaults(t, "seed=1,frame-corrupt=1")
	c := tenantClient(t, d.Address(), "acme")
	model := d.actors.Model()
	if err := answerOrClean(t, c, model, "acme", "a prompt whose frames all arrive corrupted", 4); err == nil {
		t.Fatal("a request whose every frame was corrupted answered")
	}
	if n := d.data.Stats().MalformedChecksum; n == 0 {
		t.Fatal("decode's data plane refused no batch by checksum")
	}
	s := p.status().Node
	if !s.Chaos || s.Faults != "seed=1,frame-corrupt=1" || len(s.FaultCounts) != faults.NumKinds ||
		s.FaultCounts[faults.FrameCorrupt] == 0 || s.FaultCounts[faults.FrameCorrupt] != inj.Counts()[faults.FrameCorrupt] {
		t.Fatalf("prefill status: chaos %t, faults %q, counts %v; injector counts %v", s.Chaos, s.Faults, s.FaultCounts, inj.Counts())
	}
	if err := (&messages.StatusReply{Node: s}).Validate(); err != nil {
		t.Fatalf("status of a node with faults does not validate: %v", err)
	}
	faults.Install(nil)
	if err := answerOrClean(t, c, model, "acme", "a prompt after the faults stopped", 4); err != nil {
		t.Fatalf("request without faults: %v", err)
	}
	waitFor(t, "pools free after the reclaim deadline", time.Minute, func() bool { return allFree(p, d) })
}

// TestFaultedTransfersRightOrClean runs several tenants' requests at once
// while frames are dropped, duplicated, reordered, corrupted and sent to
// other requests: every answer is the reference or a wire error, no pool
// returned a row another tenant or request wrote, and once the faults
// stop and the reclaim deadline passes every page is free.
func TestFaultedTransfersRightOrClean(t *testing.T) {
	p, d := startPair(t)
	inj := injectFaults(t, "seed=42,frame-drop=0.05,frame-dup=0.05,frame-reorder=0.05,frame-corrupt=0.02,frame-misdirect=0.2")
	tenants := []string{"acme", "globex", "initech"}
	clients := map[string]*client.Client{}
	for _, tn := range tenants {
		clients[tn] = tenantClient(t, d.Address(), tn)
	}
	model := d.actors.Model()
	const requests = 24
	var wg sync.WaitGroup
	errs := make([]error, requests)
	for i := range requests {
		tn := tenants[i%len(tenants)]
		// From one page to five: short transfers come through more often.
		prompt := strings.Repeat(fmt.Sprintf("%s canary %d. ", tn, i), 8)[:10+(i%5)*16]
		wg.Go(func() { errs[i] = answerOrClean(t, clients[tn], model, tn, prompt, 4) })
	}
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	c := inj.Counts()
	t.Logf("%d of %d requests answered, %d failed cleanly; faults injected %v", requests-failed, requests, failed, c)
	if failed == 0 || failed == requests || c[faults.FrameMisdirect] == 0 {
		t.Errorf("%d of %d failed, %d misdirected: want some of each outcome under faults", failed, requests, c[faults.FrameMisdirect])
	}
	for _, n := range []*Node{p, d} {
		for _, pool := range n.status().Node.Pools {
			if pool.CrossTenantRows != 0 || pool.CrossRequestRows != 0 {
				t.Errorf("pool %s read %d rows of another tenant and %d of another request", pool.Name, pool.CrossTenantRows, pool.CrossRequestRows)
			}
		}
	}
	faults.Install(nil)
	waitFor(t, "pools free after the reclaim deadline", time.Minute, func() bool { return allFree(p, d) })
}

// TestPressureHoldsPoolPages: pool pressure holds the pages asked for in
// each pool, or all that are free, releases them after the hold, and
// refuses a hold as long as pages may be owned and one over the bound.
func TestPressureHoldsPoolPages(t *testing.T) {
	n := startClusterNode(t, actors.RoleAll)
	capacity := map[string]uint32{}
	for _, p := range n.status().Node.Pools {
		capacity[p.Name] = p.Capacity
	}
	rep := n.pressure(&messages.PressureRequest{Pages: 10, DurationMs: 200})
	if rep.Err != nil || len(rep.Held) != len(capacity) {
		t.Fatalf("pressure of 10 pages: %+v", rep)
	}
	rep = n.pressure(&messages.PressureRequest{Pages: messages.PressurePagesMax, DurationMs: 400})
	for _, h := range rep.Held {
		if h.Pages != capacity[h.Name]-10 {
			t.Errorf("pool %s: the second hold took %d pages, want the %d left", h.Name, h.Pages, capacity[h.Name]-10)
		}
	}
	for _, p := range n.status().Node.Pools {
		if p.Free != 0 {
			t.Errorf("pool %s: %d pages free under pressure of every page", p.Name, p.Free)
		}
	}
	waitFor(t, "held pages released", time.Minute, func() bool { return allFree(n) })

	owned := n.cfg.Actors.OwnedPageTimeout
	rep = n.pressure(&messages.PressureRequest{Pages: 1, DurationMs: uint32(owned.Milliseconds())})
	if rep.Err == nil || rep.Err.Code != messages.CodeBadRequest || rep.Err.Limit != uint64(owned.Milliseconds()) {
		t.Fatalf("a hold as long as OwnedPageTimeout: %+v", rep)
	}
	for i := range pressureHoldsMax {
		if rep := n.pressure(&messages.PressureRequest{Pages: 1, DurationMs: 200}); rep.Err != nil {
			t.Fatalf("hold %d: %v", i, rep.Err)
		}
	}
	if rep := n.pressure(&messages.PressureRequest{Pages: 1, DurationMs: 200}); rep.Err == nil || rep.Err.Code != messages.CodeBusy {
		t.Fatalf("hold %d: %+v, want busy", pressureHoldsMax+1, rep)
	}
	waitFor(t, "held pages released", time.Minute, func() bool { return allFree(n) })
}
