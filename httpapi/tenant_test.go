//go:build !race

// The node here serves protoactor remote; see api_test.go.

package httpapi

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
)

// tenantsSeen is the generator of a real node, recording the tenant of
// every generation the API asks of it.
type tenantsSeen struct {
	Generator
	mu      sync.Mutex
	tenants []string
}

func (g *tenantsSeen) Generate(ctx context.Context, tenant, prompt string, opt client.GenerateOptions, onToken func(int)) (client.Result, error) {
	g.mu.Lock()
	g.tenants = append(g.tenants, tenant)
	g.mu.Unlock()
	return g.Generator.Generate(ctx, tenant, prompt, opt, onToken)
}

func (g *tenantsSeen) seen() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.tenants)
}

// Keys whose names are not their tenants: one named after another tenant.
const (
	keyCI      = "kvw-test-ci"       // "ci-pipeline", tenant acme
	keyNamedAs = "kvw-test-named-as" // "acme", tenant globex
	keyGlobex2 = "kvw-test-globex-2" // "globex-2", tenant globex
)

// startTenantAPI is a real node's API with those keys, its generations seen
// by the returned tenantsSeen.
func startTenantAPI(t *testing.T) (*tenantsSeen, string) {
	t.Helper()
	a := startAPI(t)
	path := filepath.Join(t.TempDir(), "keys.json")
	for _, e := range []KeyEntry{
		{Name: "ci-pipeline", Tenant: "acme", SHA256: HashKey(keyCI)},
		{Name: "acme", Tenant: "globex", SHA256: HashKey(keyNamedAs)},
		{Name: "globex-2", Tenant: "globex", SHA256: HashKey(keyGlobex2)},
	} {
		if err := AddKey(path, e); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	n := a.node.Actors()
	cfg := n.Config()
	gen := &tenantsSeen{Generator: client.New(n.Root().ActorSystem(), actor.NewPID(a.node.Address(), actors.AdmissionName),
		client.Options{})}
	w, err := NewWeb(a.node, &APIConfig{Model: a.model, Generator: gen, Keys: keys, Node: cfg.Limits()}, DefaultLimits(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return gen, startWeb(t, w).URL
}

// TestRequestRunsAsItsKeysTenant: a request runs as its key's tenant, not
// as the key's name (here the name of another tenant) nor as anything the
// body says (OpenAI's "user"), whichever of the tenant's keys it comes by.
// (That a tenant's share counts its requests over all its keys is
// TestAPITenantLimit's.)
func TestRequestRunsAsItsKeysTenant(t *testing.T) {
	gen, url := startTenantAPI(t)
	url += "/v1/completions"
	body := `{"model":"stories260K","prompt":"hi","max_tokens":2,"user":"initech"}`
	for _, key := range []string{keyCI, keyNamedAs, keyGlobex2} {
		if status, _, e := post(t, url, key, body); status != 200 {
			t.Fatalf("key %s: %d %+v", key, status, e)
		}
	}
	if got, want := gen.seen(), []string{"acme", "globex", "globex"}; !slices.Equal(got, want) {
		t.Fatalf("generations ran as %q, want %q", got, want)
	}
}
