package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// tenantFlood is a tenant's certificate client keeping n max-context
// requests in flight through a router, as attack 4 did, counting what
// each ended with.
type tenantFlood struct {
	done, limited atomic.Int64
	mu            sync.Mutex
	failed        []error // anything but an answer or a refusal at the tenant's bound
	wg            sync.WaitGroup
}

func startTenantFlood(t *testing.T, ctx context.Context, router, tenant string, n, promptBytes, maxTokens int) *tenantFlood {
	t.Helper()
	auth, err := credFlags{}.authority(slog.New(slog.NewTextHandler(io.Discard, nil)), trust.RoleTenant, "tenant-"+tenant)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(router, client.Options{Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	f := &tenantFlood{}
	prompt := strings.Repeat("a flood of long prompts. ", promptBytes/25+1)[:promptBytes]
	for range n {
		f.wg.Go(func() {
			for ctx.Err() == nil {
				_, err := c.Generate(ctx, tenant, prompt, client.GenerateOptions{MaxTokens: maxTokens}, nil)
				var we *messages.WireError
				switch {
				case err == nil:
					f.done.Add(1)
				case ctx.Err() != nil:
				case errors.As(err, &we) && we.Code == messages.CodeBusy && we.Where == "tenant concurrent_max":
					f.limited.Add(1)
					// Ten times a second for each request it keeps trying:
					// a tighter loop costs the router more refusals, and
					// this machine's cores, which the victim's cluster
					// shares, more of the attacker's own work.
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
				default:
					f.mu.Lock()
					f.failed = append(f.failed, err)
					f.mu.Unlock()
				}
			}
		})
	}
	return f
}

// TestBinaryTenantFlood (attack 4): against a secure cluster of real
// processes whose router serves the API with a tenants' shares file, one
// tenant, by its certificate, keeps 64 max-context requests in flight (a
// tenant the file does not name: the default share bounds it), while
// another asks through the API with its key. The router holds the flood
// to the default share's concurrent_max, refusing the rest busy at that
// bound, counted in node status; the other tenant is answered right, every
// time, with the flood running. With $KVWARDEN_TENANT_FLOOD_MEASURE set it
// measures the victim's goodput under the flood against alone:
//
//	KVWARDEN_TENANT_FLOOD_MEASURE=1 go test -run TestBinaryTenantFlood -v ./cmd/node
func TestBinaryTenantFlood(t *testing.T) {
	const concurrentMax = 8
	tenants := filepath.Join(t.TempDir(), "tenants.json")
	if err := os.WriteFile(tenants, []byte(`{"default": {"weight": 1, "concurrent_max": 8}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	router, web, key := startAPIRouter(t, "--tenants", tenants)
	prefill := startMember(t, "prefill", router.gossip)
	decode := startMember(t, "decode", router.gossip, "--tenants", tenants)
	waitConverged(t, router, prefill, decode)
	measure := os.Getenv("KVWARDEN_TENANT_FLOOD_MEASURE") != ""

	v := newVictim(web, key)
	v.want, _ = referenceText(t, actors.DefaultConfig(), v.prompt, v.maxTokens)
	var alone int
	if measure {
		alone = v.goodput(t, 10*time.Second)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Max-context: a prompt of 1,000 tokens and 1,000 more to generate,
	// of the built-in model's 2,048.
	flood := startTenantFlood(t, ctx, router.addr, "globex", 64, 1000, 1000)
	testwait.Report(t, "the flood at its tenant's bound", time.Minute, func() (bool, string) {
		s, err := statusOf(t, router.addr)
		if err != nil {
			return false, err.Error()
		}
		return s.Node.InFlight >= concurrentMax && flood.limited.Load() > 0,
			fmt.Sprintf("%d requests in flight at the router, %d of the flood refused", s.Node.InFlight, flood.limited.Load())
	})
	for i := range 8 {
		if text, err := v.ask(); err != nil || text != v.want {
			t.Fatalf("the victim's request %d under the flood: %q, %v; want %q", i, text, err, v.want)
		}
	}
	var under int
	if measure {
		under = v.goodput(t, 10*time.Second)
	}
	s, err := statusOf(t, router.addr)
	if err != nil {
		t.Fatal(err)
	}
	if s.Node.InFlight > concurrentMax+4 {
		t.Errorf("%d requests in flight at the router under a flood held to %d (and the victim's 4 at most)", s.Node.InFlight, concurrentMax)
	}
	cancel()
	testwait.Group(t, "the flood's clients stopped", commandTimeout, &flood.wg)
	if len(flood.failed) > 0 {
		t.Errorf("%d of the flood's requests failed otherwise than at its bound, the first: %v", len(flood.failed), flood.failed[0])
	}
	// Counted by the router as refused; the flood heard of all but those
	// on their way when it stopped, one per request in flight at most.
	if s, err = statusOf(t, router.addr); err != nil {
		t.Fatal(err)
	}
	names := actors.RejectBoundNames()
	var limited uint64
	for i, n := range s.Node.RejectedBy {
		if names[i] == "tenant_concurrent_max" {
			limited = n
		}
	}
	if heard := uint64(flood.limited.Load()); limited < heard || limited > heard+64 {
		t.Errorf("status counts %d refusals at tenant_concurrent_max; the flood heard of %d", limited, heard)
	}
	code, stdout, stderr := runBinary(t, "", "status", "--endpoint", router.addr)
	want := fmt.Sprintf("0 named in the shares, the rest weight 1, concurrent_max %d, no pages_max, pool_percent_max 75; refused %d at a tenant's concurrent_max, 0 at its pages_max",
		concurrentMax, limited)
	if code != exitOK || !strings.Contains(stdout, want) {
		t.Errorf("node status of the router: exit %d, want a line with %q; stdout:\n%s\nstderr:\n%s", code, want, stdout, stderr)
	}
	// A new share, read again on SIGHUP, is in force at once.
	if err := os.WriteFile(tenants, []byte(`{"default": {"weight": 1, "concurrent_max": 2}, "tenants": {"acme": {"weight": 2}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := router.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testwait.Report(t, "the router's shares read again", time.Minute, func() (bool, string) {
		_, stdout, _ := runBinary(t, "", "status", "--endpoint", router.addr)
		return strings.Contains(stdout, "1 named in the shares, the rest weight 1, concurrent_max 2,"), stdout
	})
	t.Logf("flood: %d answered, %d refused at its concurrent_max", flood.done.Load(), flood.limited.Load())
	if measure {
		t.Logf("the victim's goodput: %d right answers in 10s alone, %d under the flood: %.2f", alone, under, float64(under)/float64(alone))
	}
	waitPoolsFree(t, prefill, decode)
}

// TestBinaryTenantFloodDefaultShare (attack 4, no tenants' file): one
// tenant, by its certificate, keeps 64 max-context requests in flight, as
// many as the default share allows, more than the decode pool holds (8).
// The default share keeps it to three quarters of the pool, so another
// tenant's requests through the API find pages at once and are answered
// right, every time, with the flood running.
func TestBinaryTenantFloodDefaultShare(t *testing.T) {
	router, web, key := startAPIRouter(t)
	prefill := startMember(t, "prefill", router.gossip)
	decode := startMember(t, "decode", router.gossip)
	waitConverged(t, router, prefill, decode)
	v := newVictim(web, key)
	v.want, _ = referenceText(t, actors.DefaultConfig(), v.prompt, v.maxTokens)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flood := startTenantFlood(t, ctx, router.addr, "globex", 64, 1000, 1000)
	// Once some of the flood's requests wait for decode pages, the flood
	// holds all the pool it may: a quarter stays free of it (more than a
	// max-context request's pages, which without the bound the waiting
	// requests would take).
	var s *messages.StatusReply
	testwait.Report(t, "the flood's requests waiting for decode pages", time.Minute, func() (bool, string) {
		var err error
		if s, err = statusOf(t, decode.addr); err != nil || len(s.Node.Pools) == 0 {
			return false, fmt.Sprint(err)
		}
		return s.Node.WaitingPages > 0, fmt.Sprintf("%d waiting for pages, pools %+v", s.Node.WaitingPages, s.Node.Pools)
	})
	if p := s.Node.Pools[0]; p.Free < p.Capacity/4 {
		t.Fatalf("the flood holds %d of the decode pool's %d pages, over the default share's 75%%", p.Capacity-p.Free, p.Capacity)
	}
	for i := range 8 {
		if text, err := v.ask(); err != nil || text != v.want {
			t.Fatalf("the victim's request %d under the flood: %q, %v; want %q", i, text, err, v.want)
		}
	}
	cancel()
	testwait.Group(t, "the flood's clients stopped", commandTimeout, &flood.wg)
	for _, err := range flood.failed {
		// The flood's requests past the pool wait for pages and are
		// answered busy at the decode pool: that is the bound working.
		var we *messages.WireError
		if !errors.As(err, &we) || we.Code != messages.CodeBusy {
			t.Errorf("a flood request failed otherwise than busy: %v", err)
		}
	}
	waitPoolsFree(t, prefill, decode)
}

// waitPoolsFree waits until every pool of every member is free, with
// nothing in flight.
func waitPoolsFree(t *testing.T, ms ...*member) {
	t.Helper()
	for _, m := range ms {
		testwait.Report(t, m.role+" node's pools free", commandTimeout, func() (bool, string) {
			s, err := statusOf(t, m.addr)
			if err != nil {
				return false, err.Error()
			}
			return allFree(s.Node.Pools) && s.Node.InFlight == 0, fmt.Sprintf("pools %+v, %d in flight", s.Node.Pools, s.Node.InFlight)
		})
	}
}
