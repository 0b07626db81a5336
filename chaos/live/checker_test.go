package live

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/messages"
)

// defaultModel is the built-in default model.
func defaultModel(t testing.TB) *engine.Model {
	t.Helper()
	return modeltest.Builtin(t, engine.DefaultModelConfig())
}

// checkerFixture is a checker over two tenants of two prompts each.
func checkerFixture(t *testing.T) (*Workload, *Checker) {
	t.Helper()
	w := newTestWorkload(t, 21, WorkloadConfig{Tenants: 2, PromptsPerTenant: 2, PromptBytesMin: 30, PromptBytesMax: 60,
		MaxTokensMax: 8, ContextTokens: 256})
	c := NewChecker(defaultModel(t), w, 2)
	if err := c.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	return w, c
}

func TestCheckerClassifies(t *testing.T) {
	w, c := checkerFixture(t)
	req := func(tenant, prompt int) Request {
		return Request{Tenant: TenantName(tenant), Prompt: prompt, Text: w.Prompt(tenant, prompt), MaxTokens: 8}
	}
	want := c.Reference(0, 0, 8)
	if len(want) < 2 {
		t.Fatalf("tenant 0's prompt 0 answers %d tokens; the cases need 2", len(want))
	}
	changed := slices.Clone(want)
	changed[len(changed)-1] = (changed[len(changed)-1] + 1) % 256
	other, sibling := c.Reference(1, 0, 8), c.Reference(0, 1, 8)
	oversize := Request{Tenant: TenantName(0), Prompt: -1, Text: strings.Repeat("x", 300), MaxTokens: 4, Oversize: true}
	wire := func(code messages.ErrorCode) error { return &messages.WireError{Code: code, Message: "crafted"} }
	for _, tc := range []struct {
		name string
		o    Outcome
		want Verdict
	}{
		{"the reference", Outcome{Request: req(0, 0), Streamed: want, Answer: want}, Verdict{Class: Correct}},
		{"one token changed", Outcome{Request: req(0, 0), Streamed: want[:1], Answer: changed}, Verdict{Class: Wrong}},
		{"another tenant's answer", Outcome{Request: req(0, 0), Answer: other},
			Verdict{Class: Wrong, CrossTenant: true, Owner: "tenant-1"}},
		{"another request's answer", Outcome{Request: req(0, 0), Answer: sibling},
			Verdict{Class: Wrong, CrossRequest: true, Owner: "tenant-0"}},
		{"another tenant's tokens streamed, then an error", Outcome{Request: req(0, 0), Streamed: other[:2],
			Err: wire(messages.CodeIntegrity)}, Verdict{Class: Wrong, CrossTenant: true, Owner: "tenant-1"}},
		{"a clean error after the reference's first token", Outcome{Request: req(0, 0), Streamed: want[:1],
			Err: wire(messages.CodeNodeLost)}, Verdict{Class: CleanError, Code: "node_lost"}},
		{"a stream shorter than the answer", Outcome{Request: req(0, 0), Streamed: want[:1], Answer: want},
			Verdict{Class: Correct, StreamGap: true}},
		{"a stream longer than the answer", Outcome{Request: req(0, 0), Streamed: append(slices.Clone(want), 1), Answer: want},
			Verdict{Class: Wrong}},
		{"cancelled", Outcome{Request: req(0, 0), Streamed: want[:1], Cancelled: true,
			Err: errors.Join(context.Canceled, wire(messages.CodeCancelled))}, Verdict{Class: Cancelled, Code: CodeCancelled}},
		{"oversize refused", Outcome{Request: oversize, Err: wire(messages.CodePromptTooLong)},
			Verdict{Class: Refused, Code: "prompt_too_long"}},
		{"oversize answered with a request's tokens", Outcome{Request: oversize, Answer: want[:2]},
			Verdict{Class: Wrong, CrossRequest: true, Owner: "tenant-0"}},
		{"oversize answered", Outcome{Request: oversize, Answer: changed}, Verdict{Class: Wrong}},
		{"oversize failed otherwise", Outcome{Request: oversize, Err: wire(messages.CodeBusy)}, Verdict{Class: CleanError, Code: "busy"}},
		{"the client's own error", Outcome{Request: req(1, 1), Err: errors.New("client: spawning the receiver")},
			Verdict{Class: CleanError, Code: CodeClient}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := c.Check(tc.o)
			if v.Class != tc.want.Class || v.Code != tc.want.Code || v.CrossTenant != tc.want.CrossTenant ||
				v.CrossRequest != tc.want.CrossRequest || v.Owner != tc.want.Owner || v.StreamGap != tc.want.StreamGap {
				t.Fatalf("verdict %+v, want %+v", v, tc.want)
			}
			if v.Class == Wrong && v.Why == "" {
				t.Fatal("a wrong verdict without why")
			}
		})
	}
}

// statusCluster is a cluster of crafted statuses, by address.
type statusCluster map[string]*messages.StatusReply

func (c statusCluster) Nodes() []Node {
	var out []Node
	for _, addr := range slices.Sorted(maps.Keys(c)) {
		s := c[addr]
		out = append(out, Node{Name: s.Node.Name, Role: s.Node.Role, Addr: addr, Incarnation: s.Node.Incarnation})
	}
	return out
}

func (c statusCluster) Status(addr string) (*messages.StatusReply, error) { return c[addr], nil }
func (c statusCluster) Settle(time.Duration) error                        { return nil }
func (c statusCluster) Crashes() []Crash                                  { return nil }

func craftedStatus(name, role string, pools ...messages.PoolStatus) *messages.StatusReply {
	return &messages.StatusReply{Node: messages.NodeStatus{Name: name, Role: role, Incarnation: 7, Pools: pools}}
}

// reportOf is the report of a campaign of no requests against c, read
// once (the quiesce timeout is spent at once).
func reportOf(t *testing.T, c Cluster) *Report {
	t.Helper()
	figs, unread := quiesce(context.Background(), c, time.Nanosecond)
	camp := &Campaign{Config: Config{Seed: 1, Model: defaultModel(t)}}
	return buildReport(camp, newTally(time.Now()), nil, nil, afterFaults{nodes: figs, unread: unread}, time.Now(), 0, nil)
}

func TestCheckerFindsLeakedPages(t *testing.T) {
	free := statusCluster{
		"127.0.0.1:1": craftedStatus("router-0", messages.RoleRouter),
		"127.0.0.1:2": craftedStatus("decode-0", messages.RoleDecode, messages.PoolStatus{Name: "decode-0", Capacity: 64, Free: 64}),
	}
	if r := reportOf(t, free); !r.Passed() || r.PagesLeaked != 0 || r.PagesTotal != 64 {
		t.Fatalf("every page free: leaked %d of %d, violations %v", r.PagesLeaked, r.PagesTotal, r.Violations)
	}
	leaky := statusCluster{
		"127.0.0.1:2": craftedStatus("decode-0", messages.RoleDecode, messages.PoolStatus{Name: "decode-0", Capacity: 64, Free: 64},
			messages.PoolStatus{Name: "decode-1", Capacity: 64, Free: 61}),
	}
	r := reportOf(t, leaky)
	if r.Passed() || r.PagesLeaked != 3 || !strings.Contains(strings.Join(r.Violations, "\n"), "3 pages leaked") {
		t.Fatalf("3 pages held after quiescence: leaked %d, violations %v", r.PagesLeaked, r.Violations)
	}
}

func TestCheckerFindsCrossReads(t *testing.T) {
	cross := statusCluster{
		"127.0.0.1:2": craftedStatus("decode-0", messages.RoleDecode,
			messages.PoolStatus{Name: "decode-0", Capacity: 64, Free: 64, CrossTenantRows: 2}),
	}
	r := reportOf(t, cross)
	bpt := engine.DefaultModelConfig().Geometry(1).BytesPerToken()
	if r.Passed() || r.CrossTenantRows != 2 || r.CrossTenantBytes != 2*bpt {
		t.Fatalf("2 cross-tenant rows: rows %d, bytes %d (want %d), violations %v", r.CrossTenantRows, r.CrossTenantBytes,
			2*bpt, r.Violations)
	}
}

func TestReportCountsWrongAnswers(t *testing.T) {
	w, c := checkerFixture(t)
	tl := newTally(time.Now())
	r := Request{Tenant: TenantName(0), Prompt: 0, Text: w.Prompt(0, 0), MaxTokens: 8}
	other := c.Reference(1, 0, 8)
	for i, o := range []Outcome{{Request: r, Answer: c.Reference(0, 0, 8)}, {Request: r, Answer: other}} {
		o.Request.Index, o.Streamed = i, o.Answer
		o.End = time.Duration(i+1) * time.Millisecond
		tl.add(o, c.Check(o))
	}
	camp := &Campaign{Config: Config{Seed: 1, Model: defaultModel(t)}}
	rep := buildReport(camp, tl, nil, nil, afterFaults{}, time.Now(), 0, nil)
	if rep.Passed() || rep.Wrong != 1 || rep.CrossTenantAnswers != 1 || rep.CrossTenantBytes != len(engine.DecodeText(engine.ByteTokenizer{}, -1, other)) ||
		rep.Requests.ByClass["correct"] != 1 {
		t.Fatalf("one correct and one cross-tenant answer: %+v, violations %v", rep.Requests, rep.Violations)
	}
}

// A request cancelled after the node answered comes back from the client
// as ctx's error joined with the answer's nil *messages.WireError: the
// campaign keeps the cancellation, and nothing calls the nil's Error.
func TestCancelledAfterTheAnswer(t *testing.T) {
	err := errors.Join(context.Canceled, (*messages.WireError)(nil))
	if code := CodeOf(err); code != CodeCancelled {
		t.Errorf("CodeOf: %q, want %q", code, CodeCancelled)
	}
	clean := withoutNilWireErrors(err)
	if !errors.Is(clean, context.Canceled) || clean.Error() != context.Canceled.Error() {
		t.Errorf("cleaned: %v", clean)
	}
	node := &messages.WireError{Code: messages.CodeCancelled}
	if kept := withoutNilWireErrors(errors.Join(context.Canceled, node)); !errors.Is(kept, node) {
		t.Errorf("the node's own error was dropped: %v", kept)
	}
}
