//go:build !race

package cluster

import (
	"fmt"
	"testing"

	"github.com/kvwarden/kvwarden/client"
)

// TestTokensTravelInBatches: requests sent at once through a router are
// answered with the reference, every token and result of theirs having
// travelled in TokenBatch messages from the decode node to the router and
// from the router to the client; a client that asks for no batches gets
// the same answers one message at a time from the router, while the
// decode node still batches for the router.
func TestTokensTravelInBatches(t *testing.T) {
	_, d, r, c := startTrio(t)
	const requests, maxTokens = 16, 24
	prompts := make([]string, requests)
	items := uint64(0) // chunks (one token each) and results
	for i := range prompts {
		prompts[i] = fmt.Sprintf("batched %d", i)
		want, err := withModel(t, r.cfg).Model.Answer(prompts[i], maxTokens)
		if err != nil {
			t.Fatal(err)
		}
		items += uint64(len(want)) + 1
	}
	generateAnswers(t, r, c, prompts, maxTokens)
	dm, rm := d.actors.Metrics(), r.actors.Metrics()
	if dm.StreamItems != items || rm.StreamItems != items {
		t.Errorf("the decode node sent %d items, the router %d; want the %d chunks and results, each in a batch", dm.StreamItems, rm.StreamItems, items)
	}
	if dm.StreamBatches == 0 || dm.StreamBatches > dm.StreamItems || rm.StreamBatches == 0 || rm.StreamBatches > rm.StreamItems {
		t.Errorf("batches: decode %d, router %d, for %d items each", dm.StreamBatches, rm.StreamBatches, items)
	}
	t.Logf("items a batch: decode node %.1f, router %.1f", float64(dm.StreamItems)/float64(dm.StreamBatches),
		float64(rm.StreamItems)/float64(rm.StreamBatches))

	unbatched, err := client.Dial(r.Address(), client.Options{Auth: tenantAuth(t, "acme"), Unbatched: true})
	if err != nil {
		t.Fatal(err)
	}
	defer unbatched.Close()
	generateAnswers(t, r, unbatched, prompts, maxTokens)
	if got := r.actors.Metrics().StreamItems; got != rm.StreamItems {
		t.Errorf("the router sent %d items in batches to a client that asked for none", got-rm.StreamItems)
	}
	if got := d.actors.Metrics().StreamItems; got != 2*items {
		t.Errorf("the decode node sent %d items to the router, want %d", got, 2*items)
	}
	if got := d.actors.Metrics().StreamUnknown + r.actors.Metrics().StreamUnknown; got != 0 {
		t.Errorf("%d items for no stream", got)
	}
}
