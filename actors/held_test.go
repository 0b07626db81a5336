package actors

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
)

// TestWorkerWithoutACacheAnswersAsAnEmptyOne: a decode worker that keeps
// no prefix cache answers a request's lookup with nothing and its
// eviction with none, at once, and releases the pages of a Keep: a
// request that took it for one with a cache loses no time and strands no
// page.
func TestWorkerWithoutACacheAnswersAsAnEmptyOne(t *testing.T) {
	cfg := testConfig()
	cfg.DecodeCachePercent = 0
	n := startNode(t, cfg)
	pools := n.Pools()
	pool, worker := pools[len(pools)-1], n.decode[0] // prefill workers' pools first
	owner := kv.Owner{Request: 1, Tenant: "acme"}
	tags, err := pool.Reserve(n.Root(), owner, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	cache := workerCache{r: n.Root(), worker: worker, timeout: time.Minute}
	if hits, scope, _ := cache.Match("acme", "", []int{1, 2, 3}); len(hits) != 0 || !scope.IsZero() {
		t.Fatalf("a worker without a cache found %d pages under scope %s", len(hits), scope)
	}
	if got := cache.Evict(4, 1); got != 0 {
		t.Fatalf("a worker without a cache evicted %d pages", got)
	}
	n.Root().Send(worker, keepPages{handoff.Keep{Owner: owner, Tags: tags}})
	testwait.Report(t, "the kept pages released", time.Minute, func() (bool, string) {
		s, err := pool.Status(n.Root())
		return err == nil && s.Free == s.Capacity, fmt.Sprintf("%d of %d pages free (%v)", s.Free, s.Capacity, err)
	})
}
