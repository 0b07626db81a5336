package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/stories"
	"github.com/kvwarden/kvwarden/kv"
)

// storiesTrio starts a prefill, a decode and a router node serving
// stories260K, and returns the model and a client of the router.
func storiesTrio(t testing.TB) (*engine.Model, *Node, *client.Client) {
	t.Helper()
	model, tok := stories.Files(t)
	m, err := engine.LoadModel(model, tok, kv.F32)
	if err != nil {
		t.Fatal(err)
	}
	p := startNodeServing(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, m)
	d := startNodeServing(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, m, p.GossipAddr())
	r := startNodeServing(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, m, p.GossipAddr())
	for _, n := range []*Node{p, d, r} {
		waitFor(t, "membership converges", 10*time.Second, func() bool { return aliveCount(n) == 3 && routable(n) })
	}
	return m, r, tenantClient(t, r.Address(), "acme")
}

// TestStoriesAcrossNodes: router, prefill and decode nodes serving
// stories260K, the KV moved over the data plane, answer every prompt as
// the in-process reference does, and write the published story.
func TestStoriesAcrossNodes(t *testing.T) {
	m, _, c := storiesTrio(t)
	for _, p := range []string{"Once upon a time", "Tom had a red kite.", "", "naïve ☃ 🙂"} {
		res, err := c.Generate(context.Background(), "acme", p, client.GenerateOptions{MaxTokens: 64}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, err := m.Answer(p, 64)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Tokens, want) || res.Text != m.Text(p, want) {
			t.Fatalf("prompt %q: the cluster answered %q, the reference %q", p, res.Text, m.Text(p, want))
		}
	}
	res, err := c.Generate(context.Background(), "acme", "", client.GenerateOptions{MaxTokens: stories.PublishedTokens}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Text != stories.Published(t) {
		t.Fatalf("the cluster wrote\n%s", res.Text)
	}
}
