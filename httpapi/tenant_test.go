//go:build !race

// The node here serves protoactor remote; see api_test.go.

package httpapi

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/testwait"
)

// tenantsSeen is the generator of a real node, recording the tenant of
// every generation the API asks of it; the first generation of the tenant
// held waits, once entered is closed, until its context ends or release is
// called.
type tenantsSeen struct {
	Generator
	held    string
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once // closes gate
	holding sync.Once // the first generation of held

	mu      sync.Mutex
	tenants []string
}

func (g *tenantsSeen) release() { g.once.Do(func() { close(g.gate) }) }

func (g *tenantsSeen) Generate(ctx context.Context, tenant, prompt string, opt client.GenerateOptions, onToken func(int)) (client.Result, error) {
	g.mu.Lock()
	g.tenants = append(g.tenants, tenant)
	g.mu.Unlock()
	hold := false
	if tenant == g.held {
		g.holding.Do(func() { hold = true })
	}
	if hold {
		close(g.entered)
		select {
		case <-g.gate:
		case <-ctx.Done():
		}
	}
	return g.Generator.Generate(ctx, tenant, prompt, opt, onToken)
}

func (g *tenantsSeen) seen() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.tenants)
}

// Keys whose names are not their tenants: one named after another tenant,
// and two of a tenant limited to one request at a time.
const (
	keyCI       = "kvw-test-ci"       // "ci-pipeline", tenant acme
	keyNamedAs  = "kvw-test-named-as" // "acme", tenant globex
	keyGlobex2  = "kvw-test-globex-2" // "globex-2", tenant globex
	heldTenant  = "globex"
	globexLimit = 1
)

// startTenantAPI is a real node's API with those keys, its generations seen
// by the returned tenantsSeen, which holds globex's first.
func startTenantAPI(t *testing.T) (*tenantsSeen, string) {
	t.Helper()
	a := startAPI(t)
	path := filepath.Join(t.TempDir(), "keys.json")
	for _, k := range []struct {
		e      KeyEntry
		limits *TenantLimits
	}{
		{KeyEntry{Name: "ci-pipeline", Tenant: "acme", SHA256: HashKey(keyCI)}, nil},
		{KeyEntry{Name: "acme", Tenant: "globex", SHA256: HashKey(keyNamedAs)}, &TenantLimits{ConcurrentMax: globexLimit}},
		{KeyEntry{Name: "globex-2", Tenant: "globex", SHA256: HashKey(keyGlobex2)}, nil},
	} {
		if err := AddKey(path, k.e, k.limits); err != nil {
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
		client.Options{}), held: heldTenant, entered: make(chan struct{}), gate: make(chan struct{})}
	t.Cleanup(gen.release)
	w, err := NewWeb(a.node, &APIConfig{Model: a.model, Generator: gen, Keys: keys, Node: cfg.Limits()}, DefaultLimits(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return gen, startWeb(t, w).URL
}

// TestRequestRunsAsItsKeysTenant: a request runs as its key's tenant, not
// as the key's name (here the name of another tenant) nor as anything the
// body says (OpenAI's "user"); and a tenant's concurrency limit counts its
// requests over all its keys, by tenant.
func TestRequestRunsAsItsKeysTenant(t *testing.T) {
	gen, url := startTenantAPI(t)
	url += "/v1/completions"
	body := `{"model":"stories260K","prompt":"hi","max_tokens":2,"user":"initech"}`
	if status, _, e := post(t, url, keyCI, body); status != 200 {
		t.Fatalf("key ci-pipeline: %d %+v", status, e)
	}
	if got := gen.seen(); !slices.Equal(got, []string{"acme"}) {
		t.Fatalf("key ci-pipeline of tenant acme ran as %q", got)
	}

	// globex's one request in flight, held in the generator: its second,
	// by its other key, is refused; acme's is served.
	first := make(chan string, 1)
	go func() { first <- postFrom(url, keyNamedAs, body) }()
	testwait.Recv(t, "globex's first request in the generator", time.Minute, gen.entered)
	status, retry, e := post(t, url, keyGlobex2, body)
	if status != 429 || retry != "1" || e.Code != "tenant_concurrency_limit" {
		t.Errorf("globex's second request, by its other key: %d (Retry-After %q) %+v, want 429", status, retry, e)
	}
	if status, _, e := post(t, url, keyCI, body); status != 200 {
		t.Errorf("acme's request while globex is at its limit: %d %+v", status, e)
	}
	gen.release()
	if got := testwait.Recv(t, "globex's first request answered", time.Minute, first); got != "200 OK" {
		t.Fatalf("globex's first request: %s", got)
	}
	if got, want := gen.seen(), []string{"acme", "globex", "acme"}; !slices.Equal(got, want) {
		t.Fatalf("generations ran as %q, want %q", got, want)
	}
}

// postFrom is post for a goroutine other than the test's: the response's
// status, or why there is none.
func postFrom(url, key, body string) string {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer res.Body.Close()
	_, err = io.Copy(io.Discard, res.Body)
	if err != nil {
		return err.Error()
	}
	return res.Status
}
