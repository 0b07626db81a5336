package membership

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// eventDeadline bounds every wait for an event. It is far above what the
// waits take (joins and leaves ~0.1 s, a crash a few seconds) so that a
// loaded machine or the race detector does not make the tests flaky; it is
// only reached when something is broken.
const eventDeadline = 30 * time.Second

// waitFor waits for a condition with a bound; every test of the package
// that waits for a counter or a state to change uses it.
var waitFor = testwait.For

// Every test member gets a fresh incarnation and fresh advertised
// addresses. Incarnations grow, so a restart also wins the tie-break if two
// runs start in the same millisecond.
var (
	nextIncarnation = atomic.Uint64{}
	nextFakePort    = atomic.Uint32{}
)

func init() {
	nextIncarnation.Store(uint64(time.Now().UnixNano()))
	nextFakePort.Store(20000)
}

// testGossipKey seals the gossip of every test member that is not about
// keys, so that those tests run gossip as production does.
var testGossipKey = []byte("kvwarden test gossip key 32 byte")

// unverifiedConfig is a local member whose gossip is sealed but whose
// peers are listed unverified: for the tests of membership itself, whose
// members advertise addresses where nothing serves.
func unverifiedConfig() Config {
	c := DefaultLocalConfig()
	c.Insecure = true
	c.Keys = [][]byte{testGossipKey}
	return c
}

func testMeta() Meta {
	port := nextFakePort.Add(2)
	return Meta{
		Role:          RoleDecode,
		Incarnation:   nextIncarnation.Add(1),
		RemoteAddr:    fmt.Sprintf("127.0.0.1:%d", port),
		DataAddr:      fmt.Sprintf("127.0.0.1:%d", port+1),
		CapacityPages: 1024,
		FreePages:     1024,
		Model:         testModel,
	}
}

func startMember(t *testing.T, cfg Config, meta Meta) *Membership {
	t.Helper()
	m, err := Start(cfg, meta)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return m
}

// startCluster starts n members, each joining through the first, and waits
// until every member has seen every join. It returns the members and how
// long convergence took after the last Start.
func startCluster(t *testing.T, n int) ([]*Membership, time.Duration) {
	t.Helper()
	ms := make([]*Membership, 0, n)
	for i := 0; i < n; i++ {
		cfg := unverifiedConfig()
		if i > 0 {
			cfg.JoinAddrs = []string{ms[0].LocalAddr().String()}
		}
		ms = append(ms, startMember(t, cfg, testMeta()))
	}
	started := time.Now()
	var want []match
	for _, m := range ms {
		want = append(want, match{kind: EventJoin, name: m.Name()})
	}
	for _, m := range ms {
		awaitEvents(t, m, want...)
	}
	took := time.Since(started)
	for _, m := range ms {
		if got := m.Members(); len(got) != n {
			t.Fatalf("%s sees %d members after every join event, want %d: %v", m.Name(), len(got), n, got)
		}
	}
	return ms, took
}

type match struct {
	kind EventKind // zero: any kind
	name string
	ok   func(Event) bool // optional extra condition
}

func (w match) String() string { return w.kind.String() + " " + w.name }

// awaitEvents reads m's events until each of want has been matched, in any
// order, and returns the matching events in want's order. Other events are
// skipped. It fails the test at eventDeadline, listing what it saw.
func awaitEvents(t *testing.T, m *Membership, want ...match) []Event {
	t.Helper()
	got := make([]Event, len(want))
	done := make([]bool, len(want))
	left := len(want)
	var seen []string
	timer := time.NewTimer(eventDeadline)
	defer timer.Stop()
	for left > 0 {
		select {
		case ev, open := <-m.Events():
			if !open {
				t.Fatalf("%s: events closed while waiting for %v; saw %v", m.Name(), want, seen)
			}
			seen = append(seen, fmt.Sprintf("%s %s(%s)", ev.Kind, ev.Member.Name, ev.Member.State))
			for i, w := range want {
				if !done[i] && (w.kind == 0 || ev.Kind == w.kind) && ev.Member.Name == w.name && (w.ok == nil || w.ok(ev)) {
					got[i], done[i] = ev, true
					left--
					break
				}
			}
		case <-timer.C:
			var missing []match
			for i, w := range want {
				if !done[i] {
					missing = append(missing, w)
				}
			}
			t.Fatalf("%s: after %s still waiting for %v; saw %v", m.Name(), eventDeadline, missing, seen)
		}
	}
	return got
}

func memberNames(ms []Member) []string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	return names
}

func TestJoinConverges(t *testing.T) {
	ms, took := startCluster(t, 5)
	t.Logf("5 members converged %s after the last start", took)
	for _, m := range ms {
		for _, mem := range m.Members() {
			if mem.State != StateAlive {
				t.Errorf("%s sees %s %s", m.Name(), mem.Name, mem.State)
			}
			if !nameMatches(mem.Name, mem.Meta.Incarnation) || mem.Meta.StartedUnixMilli == 0 {
				t.Errorf("%s sees %s with meta %+v", m.Name(), mem.Name, mem.Meta)
			}
		}
		if st := m.Stats(); st != (MembershipStats{}) {
			t.Errorf("%s stats %+v, want zero", m.Name(), st)
		}
	}
}

func TestUpdateMetaPropagates(t *testing.T) {
	ms, _ := startCluster(t, 3)
	src := ms[2]
	meta := src.Meta()
	meta.FreePages, meta.Draining = 7, true
	start := time.Now()
	if err := src.UpdateMeta(meta); err != nil {
		t.Fatalf("UpdateMeta: %v", err)
	}
	seen := func(ev Event) bool { return ev.Member.Meta.FreePages == 7 && ev.Member.Meta.Draining }
	for _, m := range ms[:2] {
		ev := awaitEvents(t, m, match{kind: EventUpdate, name: src.Name(), ok: seen})[0]
		if ev.Member.Meta != src.Meta() {
			t.Fatalf("%s sees %+v, want %+v", m.Name(), ev.Member.Meta, src.Meta())
		}
	}
	t.Logf("metadata update seen by all in %s", time.Since(start))
	for _, m := range ms[:2] {
		for _, mem := range m.Members() {
			if mem.Name == src.Name() && mem.Meta.FreePages != 7 {
				t.Fatalf("%s Members shows %s with %d free pages, want 7", m.Name(), mem.Name, mem.Meta.FreePages)
			}
		}
	}
}

func TestUpdateMetaRefusals(t *testing.T) {
	m := startMember(t, unverifiedConfig(), testMeta())
	before := m.Meta()

	tooLong := before
	tooLong.DataAddr = longAddr(AddrLenMax + 1)
	otherRun := before
	otherRun.Incarnation++
	otherRole := before
	otherRole.Role = RolePrefill
	leaving := before
	leaving.Leaving = true
	for _, bad := range []Meta{tooLong, otherRun, otherRole, leaving} {
		err := m.UpdateMeta(bad)
		if !errors.Is(err, ErrMetaInvalid) {
			t.Fatalf("UpdateMeta(%+v) = %v, want ErrMetaInvalid", bad, err)
		}
		if m.Meta() != before {
			t.Fatalf("refused update changed meta to %+v", m.Meta())
		}
	}
	var ae *MetaAddrError
	if err := m.UpdateMeta(tooLong); !errors.As(err, &ae) || ae.Len != AddrLenMax+1 || ae.LenMax != AddrLenMax {
		t.Fatalf("UpdateMeta(too long) = %v, want MetaAddrError{Len: %d, LenMax: %d}", err, AddrLenMax+1, AddrLenMax)
	}
	// Alone in its cluster, an update needs nobody to acknowledge it.
	ok := before
	ok.FreePages = 1
	if err := m.UpdateMeta(ok); err != nil {
		t.Fatalf("UpdateMeta alone: %v", err)
	}
	if got := m.Meta(); got != ok {
		t.Fatalf("Meta() = %+v, want %+v", got, ok)
	}
}

// TestLeaveSeenAsLeft: Leave gossips the Leaving flag and then leaves; a
// member that got the flag reports the departure as a leave. Leave does
// not wait for the flag to arrive everywhere, so on a loaded machine the
// departure can overtake it at some member, which then reports a failure
// (Leave's documentation): that is allowed, and only then.
func TestLeaveSeenAsLeft(t *testing.T) {
	ms, _ := startCluster(t, 4)
	leaver := ms[3]
	start := time.Now()
	if err := leaver.Leave(5 * time.Second); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if !leaver.Meta().Leaving {
		t.Fatal("Leave did not set the Leaving flag")
	}
	if err := leaver.Shutdown(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	left := 0
	for _, m := range ms[:3] {
		flagged := false
		ev := awaitEvents(t, m, match{name: leaver.Name(), ok: func(ev Event) bool {
			flagged = flagged || ev.Kind == EventUpdate && ev.Member.Meta.Leaving
			return ev.Kind == EventLeave || ev.Kind == EventFail
		}})[0]
		switch {
		case ev.Kind == EventLeave && (ev.Member.State != StateLeft || ev.Reason != "" || !flagged):
			t.Fatalf("%s: leave event %+v (flag seen before: %t)", m.Name(), ev, flagged)
		case ev.Kind == EventFail && flagged:
			t.Fatalf("%s: saw the Leaving flag, then reported a failure: %+v", m.Name(), ev)
		case ev.Kind == EventLeave:
			left++
		}
	}
	t.Logf("graceful leave seen by all in %s, as a leave by %d of 3", time.Since(start), left)
	for _, m := range ms[:3] {
		if names := memberNames(m.Members()); len(names) != 3 || strings.Contains(strings.Join(names, " "), leaver.Name()) {
			t.Fatalf("%s Members after leave: %v", m.Name(), names)
		}
	}
	if err := leaver.Leave(time.Second); !errors.Is(err, ErrClosed) {
		t.Fatalf("Leave after Shutdown = %v, want ErrClosed", err)
	}
	for range leaver.Events() {
		// Drain what was buffered: the channel must end closed.
	}
}

func TestCrashDetectedAsFailed(t *testing.T) {
	ms, _ := startCluster(t, 4)
	victim := ms[3]
	start := time.Now()
	if err := victim.Shutdown(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for _, m := range ms[:3] {
		ev := awaitEvents(t, m, match{kind: EventFail, name: victim.Name()})[0]
		if ev.Member.State != StateDead {
			t.Fatalf("%s: fail event %+v", m.Name(), ev)
		}
		t.Logf("%s saw the crash after %s", m.Name(), time.Since(start))
	}
	for _, m := range ms[:3] {
		if names := memberNames(m.Members()); len(names) != 3 {
			t.Fatalf("%s Members after crash: %v", m.Name(), names)
		}
	}
}

// A node that crashes and restarts on the same gossip port with a new
// incarnation is a new member; its old run is reported failed as soon as the
// new one is seen, without waiting for failure detection.
func TestRestartIsNewMember(t *testing.T) {
	ms, _ := startCluster(t, 3)
	old := ms[2]
	port := int(old.LocalAddr().Port())
	if err := old.Shutdown(); err != nil {
		t.Fatal(err)
	}
	meta := testMeta()
	meta.RemoteAddr, meta.DataAddr = old.Meta().RemoteAddr, old.Meta().DataAddr
	cfg := unverifiedConfig()
	cfg.BindPort = port
	cfg.JoinAddrs = []string{ms[0].LocalAddr().String()}
	start := time.Now()
	restarted, err := Start(cfg, meta)
	if err != nil {
		t.Logf("port %d not free again (%v); restarting on a new port, same advertised addresses", port, err)
		cfg.BindPort = 0
		restarted = startMember(t, cfg, meta)
	} else {
		t.Cleanup(func() { _ = restarted.Shutdown() })
	}
	if restarted.Name() == old.Name() {
		t.Fatalf("restart kept the name %s", old.Name())
	}
	for _, m := range ms[:2] {
		evs := awaitEvents(t, m,
			match{kind: EventJoin, name: restarted.Name()},
			match{kind: EventFail, name: old.Name(), ok: func(ev Event) bool { return strings.Contains(ev.Reason, "superseded") }})
		t.Logf("%s: %s joined, %s failed (%s), %s after restart", m.Name(), evs[0].Member.Name, evs[1].Member.Name, evs[1].Reason, time.Since(start))
	}
	for _, m := range []*Membership{ms[0], ms[1], restarted} {
		names := memberNames(m.Members())
		joined := strings.Join(names, " ")
		if len(names) != 3 || !strings.Contains(joined, restarted.Name()) || strings.Contains(joined, old.Name()) {
			t.Fatalf("%s Members after restart: %v (old %s, new %s)", m.Name(), names, old.Name(), restarted.Name())
		}
		if m != restarted && m.Stats().Superseded != 1 {
			t.Fatalf("%s stats %+v, want one superseded", m.Name(), m.Stats())
		}
	}
}

func TestStartRefusesOversizedMeta(t *testing.T) {
	meta := testMeta()
	meta.RemoteAddr = longAddr(AddrLenMax + 1)
	m, err := Start(unverifiedConfig(), meta)
	if err == nil {
		_ = m.Shutdown()
		t.Fatal("Start accepted an address over AddrLenMax")
	}
	var ae *MetaAddrError
	if !errors.As(err, &ae) || ae.Len != AddrLenMax+1 || ae.LenMax != AddrLenMax {
		t.Fatalf("Start = %v, want MetaAddrError{Len: %d, LenMax: %d}", err, AddrLenMax+1, AddrLenMax)
	}
	if want := fmt.Sprintf("(%d bytes, limit %d)", AddrLenMax+1, AddrLenMax); !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q lacks the numbers %q", err, want)
	}
}

func TestStartRefusesLeaving(t *testing.T) {
	meta := testMeta()
	meta.Leaving = true
	if m, err := Start(unverifiedConfig(), meta); !errors.Is(err, ErrMetaInvalid) {
		if err == nil {
			_ = m.Shutdown()
		}
		t.Fatalf("Start with Leaving set = %v, want ErrMetaInvalid", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for name, c := range map[string]Config{"DefaultConfig": DefaultConfig(), "DefaultLocalConfig": DefaultLocalConfig()} {
		c.Insecure = true
		if err := c.Validate(); err != nil {
			t.Fatalf("%s with Insecure: %v", name, err)
		}
	}
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no prefix", func(c *Config) { c.NamePrefix = "" }, "NamePrefix"},
		{"prefix with space", func(c *Config) { c.NamePrefix = "a b" }, "byte 0x20 at 1"},
		{"prefix too long", func(c *Config) { c.NamePrefix = strings.Repeat("p", 65) }, "65 bytes, want 1..64"},
		{"bind host name", func(c *Config) { c.BindAddr = "localhost" }, `BindAddr "localhost"`},
		{"wildcard advertise", func(c *Config) { c.AdvertiseAddr = "0.0.0.0" }, "AdvertiseAddr"},
		{"bind port", func(c *Config) { c.BindPort = 70000 }, "BindPort (70000)"},
		{"advertise port", func(c *Config) { c.AdvertisePort = -1 }, "AdvertisePort (-1)"},
		{"empty join address", func(c *Config) { c.JoinAddrs = []string{"a:1", ""} }, "join address 1 is empty"},
		{"too many joins", func(c *Config) { c.JoinAddrs = make([]string, 65) }, "65 join addresses, limit 64"},
		{"label", func(c *Config) { c.ClusterLabel = strings.Repeat("l", 256) }, "256 bytes, limit 255"},
		{"probe timeout", func(c *Config) { c.ProbeTimeout = 0 }, "ProbeTimeout (0s)"},
		{"probe interval", func(c *Config) { c.ProbeInterval = c.ProbeTimeout }, "ProbeInterval (200ms) must exceed ProbeTimeout (200ms)"},
		{"indirect", func(c *Config) { c.IndirectChecks = -1 }, "IndirectChecks (-1)"},
		{"suspicion", func(c *Config) { c.SuspicionMult = 0 }, "SuspicionMult (0)"},
		{"suspicion max", func(c *Config) { c.SuspicionMaxTimeoutMult = 0 }, "SuspicionMaxTimeoutMult (0)"},
		{"gossip interval", func(c *Config) { c.GossipInterval = 0 }, "GossipInterval (0s)"},
		{"gossip nodes", func(c *Config) { c.GossipNodes = 0 }, "GossipNodes (0)"},
		{"push pull", func(c *Config) { c.PushPullInterval = -time.Second }, "PushPullInterval (-1s)"},
		{"tcp timeout", func(c *Config) { c.TCPTimeout = 0 }, "TCPTimeout (0s)"},
		{"update timeout", func(c *Config) { c.UpdateTimeout = 0 }, "UpdateTimeout (0s)"},
		{"no event buffer", func(c *Config) { c.EventBufferLen = 0 }, "EventBufferLen (0) must be in 1..65536"},
		{"huge event buffer", func(c *Config) { c.EventBufferLen = EventBufferLenMax + 1 }, "EventBufferLen (65537)"},
		{"short gossip key", func(c *Config) { c.Keys = [][]byte{make([]byte, 32), make([]byte, 15)} },
			"gossip key 1 is 15 bytes, want 16, 24 or 32"},
		{"too many gossip keys", func(c *Config) { c.Keys = make([][]byte, GossipKeysMax+1) }, "9 gossip keys, limit 8"},
		{"retry interval", func(c *Config) { c.VerifyRetryInterval = 0 }, "VerifyRetryInterval (0s) must be positive"},
		{"retry cap", func(c *Config) { c.VerifyRetryIntervalMax = time.Millisecond },
			"VerifyRetryIntervalMax (1ms) must be at least VerifyRetryInterval (100ms)"},
		{"no parallel probes", func(c *Config) { c.VerifyParallelMax = 0 }, "VerifyParallelMax (0) must be in 1..256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := unverifiedConfig()
			tt.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tt.want)
			}
			if m, err := Start(c, testMeta()); err == nil {
				_ = m.Shutdown()
				t.Fatal("Start accepted a config Validate refuses")
			}
		})
	}
}

func TestStartFailsWhenNoSeedAnswers(t *testing.T) {
	probe := startMember(t, unverifiedConfig(), testMeta())
	dead := probe.LocalAddr().String()
	if err := probe.Shutdown(); err != nil {
		t.Fatal(err)
	}
	cfg := unverifiedConfig()
	cfg.JoinAddrs = []string{dead}
	cfg.TCPTimeout = time.Second
	m, err := Start(cfg, testMeta())
	if err == nil {
		_ = m.Shutdown()
		t.Fatalf("Start joined through %s, where nothing listens", dead)
	}
	if !strings.Contains(err.Error(), "joined 0 of 1") {
		t.Fatalf("Start = %v, want the join counts", err)
	}
}

// rawDelegate lets a plain memberlist join with metadata that is not ours,
// as a buggy or hostile holder of the gossip key would.
type rawDelegate struct{ meta []byte }

func (d rawDelegate) NodeMeta(int) []byte           { return d.meta }
func (rawDelegate) NotifyMsg([]byte)                {}
func (rawDelegate) GetBroadcasts(int, int) [][]byte { return nil }
func (rawDelegate) LocalState(bool) []byte          { return nil }
func (rawDelegate) MergeRemoteState([]byte, bool)   {}

// logSignal is a slog handler that reports each record's message on a
// channel without blocking.
type logSignal chan string

func (s logSignal) Enabled(context.Context, slog.Level) bool { return true }
func (s logSignal) Handle(_ context.Context, r slog.Record) error {
	select {
	case s <- r.Message:
	default:
	}
	return nil
}
func (s logSignal) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s logSignal) WithGroup(string) slog.Handler      { return s }

func TestUndecodableMemberExcluded(t *testing.T) {
	logs := make(logSignal, 16)
	cfg := unverifiedConfig()
	cfg.Logger = slog.New(logs)
	m := startMember(t, cfg, testMeta())

	bad := []string{"garbage", "name-mismatch"}
	good := testMeta()
	mismatch, err := EncodeMeta(nil, Meta{Role: good.Role, Incarnation: good.Incarnation, StartedUnixMilli: 1,
		RemoteAddr: good.RemoteAddr, DataAddr: good.DataAddr, Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	for i, meta := range [][]byte{[]byte("\x02not our metadata"), mismatch} {
		rc := memberlist.DefaultLocalConfig()
		rc.Name, rc.BindAddr, rc.BindPort, rc.AdvertisePort = bad[i], "127.0.0.1", 0, 0
		rc.SecretKey = testGossipKey // a member of the cluster, buggy or hostile
		rc.LogOutput = io.Discard
		rc.Delegate = rawDelegate{meta: meta}
		raw, err := memberlist.Create(rc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = raw.Shutdown() })
		if _, err := raw.Join([]string{m.LocalAddr().String()}); err != nil {
			t.Fatal(err)
		}
		select {
		case msg := <-logs:
			if !strings.Contains(msg, "metadata refused") {
				t.Fatalf("logged %q, want a refusal", msg)
			}
		case <-time.After(eventDeadline):
			t.Fatalf("no refusal logged for %s", bad[i])
		}
	}
	if st := m.Stats(); st.MetaRefused < 2 {
		t.Fatalf("stats %+v, want at least 2 refusals", st)
	}
	// A good member still joins, and the refused ones stay out of Members.
	jcfg := unverifiedConfig()
	jcfg.JoinAddrs = []string{m.LocalAddr().String()}
	other := startMember(t, jcfg, testMeta())
	awaitEvents(t, m, match{kind: EventJoin, name: m.Name()}, match{kind: EventJoin, name: other.Name()})
	if names := memberNames(m.Members()); len(names) != 2 {
		t.Fatalf("Members = %v, want only %s and %s", names, m.Name(), other.Name())
	}
}

// A consumer that never reads Events must not stall memberlist: events are
// dropped and counted, and Members stays current.
func TestFullEventsDropNotBlock(t *testing.T) {
	cfg := unverifiedConfig()
	cfg.EventBufferLen = 1
	seed := startMember(t, cfg, testMeta()) // its own join fills the buffer
	var others []*Membership
	for i := 0; i < 3; i++ {
		c := unverifiedConfig()
		c.JoinAddrs = []string{seed.LocalAddr().String()}
		others = append(others, startMember(t, c, testMeta()))
	}
	want := []match{{kind: EventJoin, name: seed.Name()}}
	for _, o := range others {
		want = append(want, match{kind: EventJoin, name: o.Name()})
	}
	for _, o := range others {
		awaitEvents(t, o, want...)
	}
	if names := memberNames(seed.Members()); len(names) != 4 {
		t.Fatalf("seed Members = %v, want 4", names)
	}
	if st := seed.Stats(); st.EventsDropped < 3 {
		t.Fatalf("seed stats %+v, want at least the 3 joins dropped", st)
	}
}

func TestConfigValidateTrust(t *testing.T) {
	ca := trusttest.New(t)
	node := ca.Authority(t, trust.RoleDecode, "d0", nil)
	secure := DefaultLocalConfig().Secured(node)
	if err := secure.Validate(); err != nil {
		t.Fatalf("Secured: %v", err)
	}
	if secure.NamePrefix != "d0" || len(secure.Keys) != 1 || secure.Insecure || secure.Auth != node {
		t.Fatalf("Secured gave prefix %q, %d keys, insecure %v", secure.NamePrefix, len(secure.Keys), secure.Insecure)
	}
	if c := DefaultLocalConfig().Secured(trust.Insecure(nil)); !c.Insecure || c.Auth != nil || c.Validate() != nil {
		t.Fatalf("Secured(insecure authority) = insecure %v, auth %v, %v", c.Insecure, c.Auth, c.Validate())
	}
	keyed := DefaultLocalConfig()
	keyed.Keys = [][]byte{testGossipKey}
	otherPrefix := secure
	otherPrefix.NamePrefix = "d1"
	insecureAuth := keyed
	insecureAuth.Auth = trust.Insecure(nil)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no key", DefaultLocalConfig(), "no gossip key (Keys, from the credentials' gossip.keys); --insecure gossips in the clear"},
		{"no credentials", keyed, "no credentials to verify members with (Auth); --insecure lists members unverified"},
		{"insecure authority", insecureAuth, "--insecure lists members unverified"},
		{"prefix not the identity's", otherPrefix, `NamePrefix "d1" must be the name of the identity kvwarden://test/decode/d0`},
		{"not a node", DefaultLocalConfig().Secured(ca.Authority(t, trust.RoleTenant, "acme", nil)),
			"identity kvwarden://test/tenant/acme is not a node's (role tenant)"},
	}
	for _, tt := range tests {
		if err := tt.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Validate = %v, want %q", tt.name, err, tt.want)
		}
	}
	meta := testMeta()
	meta.Role, meta.DataAddr = RolePrefill, ""
	if m, err := Start(secure, meta); err == nil || !strings.Contains(err.Error(),
		"role prefill, but the identity kvwarden://test/decode/d0 is of role decode") {
		if err == nil {
			_ = m.Shutdown()
		}
		t.Fatalf("Start(prefill meta, decode identity) = %v", err)
	}
}

// keyedConfig is an unverified member whose gossip is sealed with keys,
// the primary first.
func keyedConfig(keys ...[]byte) Config {
	c := unverifiedConfig()
	c.Keys = keys
	return c
}

func gossipKey(t *testing.T, n int) []byte {
	t.Helper()
	k := make([]byte, n)
	if _, err := crand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// joinRefused starts a member joining through seed that must not get in.
func joinRefused(t *testing.T, what string, cfg Config, seed *Membership) {
	t.Helper()
	cfg.JoinAddrs = []string{seed.LocalAddr().String()}
	cfg.TCPTimeout = time.Second
	m, err := Start(cfg, testMeta())
	if err == nil {
		_ = m.Shutdown()
		t.Fatalf("%s joined through %s", what, seed.Name())
	}
	if !strings.Contains(err.Error(), "joined 0 of 1") {
		t.Fatalf("%s: Start = %v, want the join refused", what, err)
	}
}

func TestGossipSealedMembersConverge(t *testing.T) {
	for _, n := range []int{16, 24, 32} {
		key := gossipKey(t, n)
		a := startMember(t, keyedConfig(key), testMeta())
		cfg := keyedConfig(key)
		cfg.JoinAddrs = []string{a.LocalAddr().String()}
		b := startMember(t, cfg, testMeta())
		for _, m := range []*Membership{a, b} {
			awaitEvents(t, m, match{kind: EventJoin, name: a.Name()}, match{kind: EventJoin, name: b.Name()})
		}
		meta := b.Meta()
		meta.FreePages = 5
		if err := b.UpdateMeta(meta); err != nil {
			t.Fatal(err)
		}
		awaitEvents(t, a, match{kind: EventUpdate, name: b.Name(), ok: func(ev Event) bool { return ev.Member.Meta.FreePages == 5 }})
	}
}

// Without the key, or with another one, a process can neither join a
// sealed cluster nor be joined by it, and no member ever lists it.
func TestGossipWithoutKeyCannotJoin(t *testing.T) {
	key := gossipKey(t, 32)
	seed := startMember(t, keyedConfig(key), testMeta())
	clear := unverifiedConfig()
	clear.Keys = nil
	joinRefused(t, "a member without a key", clear, seed)
	joinRefused(t, "a member with another key", keyedConfig(gossipKey(t, 32)), seed)
	joinRefused(t, "a member with the key as a secondary only", keyedConfig(gossipKey(t, 32), key), seed)

	open := startMember(t, clear, testMeta())
	joinRefused(t, "a sealed member joining an open one", keyedConfig(key), open)

	// A member with the key gets in; nobody else is listed.
	cfg := keyedConfig(key)
	cfg.JoinAddrs = []string{seed.LocalAddr().String()}
	ok := startMember(t, cfg, testMeta())
	awaitEvents(t, seed, match{kind: EventJoin, name: seed.Name()}, match{kind: EventJoin, name: ok.Name()})
	for _, m := range []*Membership{seed, ok} {
		if names := memberNames(m.Members()); len(names) != 2 {
			t.Fatalf("%s lists %v, want only %s and %s", m.Name(), names, seed.Name(), ok.Name())
		}
	}
	if names := memberNames(open.Members()); len(names) != 1 {
		t.Fatalf("the open member lists %v, want only itself", names)
	}
}

// One step of the rotation documented on Config.Keys: a member that
// already sends under the new key and one that still sends under the old
// one both hold both, so they hear each other both ways. Skipping the
// first step (adding the new key everywhere) splits the cluster.
func TestGossipKeyRotationStep(t *testing.T) {
	oldKey, newKey := gossipKey(t, 32), gossipKey(t, 32)
	before := startMember(t, keyedConfig(oldKey, newKey), testMeta())
	cfg := keyedConfig(newKey, oldKey)
	cfg.JoinAddrs = []string{before.LocalAddr().String()}
	after := startMember(t, cfg, testMeta())
	both := []*Membership{before, after}
	for _, m := range both {
		awaitEvents(t, m, match{kind: EventJoin, name: before.Name()}, match{kind: EventJoin, name: after.Name()})
	}
	for i, src := range both {
		dst := both[1-i]
		meta := src.Meta()
		meta.FreePages = uint32(100 + i)
		if err := src.UpdateMeta(meta); err != nil {
			t.Fatal(err)
		}
		awaitEvents(t, dst, match{kind: EventUpdate, name: src.Name(),
			ok: func(ev Event) bool { return ev.Member.Meta.FreePages == meta.FreePages }})
	}

	oldOnly := startMember(t, keyedConfig(oldKey), testMeta())
	joinRefused(t, "a member sending under the new key, to one holding only the old", keyedConfig(newKey, oldKey), oldOnly)
}
