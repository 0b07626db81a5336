//go:build !race

// Like node_test.go, these start several protoactor remotes in one process,
// which race inside protoactor itself.

package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/internal/stories"
	"github.com/kvwarden/kvwarden/kv"
)

// storiesTrio starts a prefill, a decode and a router node serving
// stories260K, and returns the model and a client of the router.
func storiesTrio(t testing.TB) (*engine.Model, *Node, *client.Client) {
	t.Helper()
	m := modeltest.Stories(t, kv.F32)
	p := startNodeServing(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, m)
	d := startNodeServing(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, m, p.GossipAddr())
	r := startNodeServing(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, m, p.GossipAddr())
	for _, n := range []*Node{p, d, r} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 3 && routable(n) })
	}
	return m, r, tenantClient(t, r.Address(), "acme")
}

// TestStoriesAcrossNodes: router, prefill and decode nodes serving
// stories260K, the KV moved over the data plane, answer every prompt as
// the in-process reference does, and write the published story.
func TestStoriesAcrossNodes(t *testing.T) {
	m, _, c := storiesTrio(t)
	for _, tc := range []struct {
		prompt string
		max    int
		finish string
	}{
		{"Once upon a time", 64, "length"}, {"Tom had a red kite.", 64, "length"}, {"", 64, "length"}, {"naïve ☃ 🙂", 64, "length"},
		// The reference emits the stop token (BOS) as the 218th token.
		{"The little dog", stories.PublishedTokens, "stop"},
	} {
		res, err := c.Generate(context.Background(), "acme", tc.prompt, client.GenerateOptions{MaxTokens: tc.max}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, err := m.Answer(tc.prompt, tc.max)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Tokens, want) || res.Text != m.Text(tc.prompt, want) || res.Finish != tc.finish {
			t.Fatalf("prompt %q: the cluster answered %q (finish %s), the reference %q", tc.prompt, res.Text, res.Finish, m.Text(tc.prompt, want))
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
