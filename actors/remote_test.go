//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// and gRPC (logger setup, endpoint manager), which the race detector
// reports although kvwarden's code is not involved; the cmd/node tests run
// the same path across real processes under any build.

package actors

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvwarden/kvwarden/client"

	"github.com/kvwarden/kvwarden/trust"
)

// TestRemoteClient generates through protoactor remote, from a client with
// its own actor system, to a node serving on a loopback port.
func TestRemoteClient(t *testing.T) {
	cfg := testConfig()
	n, err := Start(cfg, withModel(t, cfg, Options{Listen: "127.0.0.1:0", Auth: trust.Insecure(nil)}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		quiesce(t, n)
		n.Stop()
	})
	c, err := client.Dial(n.Address(), client.Options{Auth: trust.Insecure(nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	for i, prompt := range []string{"hello", "a somewhat longer prompt that spans more than one page of sixteen tokens"} {
		var streamed []int
		res, err := c.Generate(context.Background(), fmt.Sprintf("tenant-%d", i), prompt, client.GenerateOptions{MaxTokens: 20},
			func(tok int) { streamed = append(streamed, tok) })
		if err != nil {
			t.Fatal(err)
		}
		want := reference(t, cfg, prompt, 20)
		if fmt.Sprint(res.Tokens) != fmt.Sprint(want) || fmt.Sprint(streamed) != fmt.Sprint(want) {
			t.Fatalf("%q over remote: got %v (streamed %v), reference %v", prompt, res.Tokens, streamed, want)
		}
	}
}
