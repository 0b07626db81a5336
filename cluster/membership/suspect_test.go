package membership

import (
	"errors"
	"io"
	"log"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvwarden/kvwarden/internal/testwait"
)

// pausable is memberlist's own transport that can be paused: while paused
// it sends nothing, drops what arrives and refuses streams, as the gossip
// of a stopped process looks to the others.
type pausable struct {
	*memberlist.NetTransport
	paused  atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
	quit    chan struct{}
}

var errPaused = errors.New("gossip transport paused")

func newPausable(t *testing.T) *pausable {
	t.Helper()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"},
		Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	p := &pausable{NetTransport: nt, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), quit: make(chan struct{})}
	go forward(p, nt.PacketCh(), p.packets, func(*memberlist.Packet) {})
	go forward(p, nt.StreamCh(), p.streams, func(c net.Conn) { c.Close() })
	return p
}

// forward passes what arrives on in to out, dropping it while paused.
func forward[T any](p *pausable, in <-chan T, out chan<- T, drop func(T)) {
	for {
		select {
		case v := <-in:
			if p.paused.Load() {
				drop(v)
				continue
			}
			select {
			case out <- v:
			case <-p.quit:
				return
			}
		case <-p.quit:
			return
		}
	}
}

func (p *pausable) PacketCh() <-chan *memberlist.Packet { return p.packets }
func (p *pausable) StreamCh() <-chan net.Conn           { return p.streams }

func (p *pausable) WriteTo(b []byte, addr string) (time.Time, error) {
	return p.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (p *pausable) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if p.paused.Load() {
		return time.Now(), nil // lost on the way
	}
	return p.NetTransport.WriteToAddress(b, a)
}

func (p *pausable) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return p.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (p *pausable) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if p.paused.Load() {
		return nil, errPaused
	}
	return p.NetTransport.DialAddressTimeout(a, timeout)
}

func (p *pausable) Shutdown() error {
	close(p.quit)
	return p.NetTransport.Shutdown()
}

// TestSuspectMemberStaysListed: a member whose gossip stops for less than
// the suspicion timeout is suspected, refutes the suspicion once it
// gossips again, and all the while stays in the others' Members, with no
// EventFail: memberlist v0.7.0 keeps suspicion to itself, so a suspect
// keeps its requests and its work (Node.watch only acts on members
// Members no longer lists).
func TestSuspectMemberStaysListed(t *testing.T) {
	aLog, cLog := &testwait.Buffer{}, &testwait.Buffer{}
	cfgA := unverifiedConfig()
	// A suspicion timeout of 20 s or more: the suspect refutes long
	// before it would be declared dead.
	cfgA.SuspicionMult, cfgA.MemberlistLog = 50, aLog
	a := startMember(t, cfgA, testMeta())
	tr := newPausable(t)
	cfgC := unverifiedConfig()
	cfgC.SuspicionMult, cfgC.MemberlistLog, cfgC.Transport = 50, cLog, tr
	cfgC.JoinAddrs = []string{a.LocalAddr().String()}
	c := startMember(t, cfgC, testMeta())
	awaitEvents(t, a, match{kind: EventJoin, name: c.Name()})
	listed := func() bool {
		return slices.ContainsFunc(a.Members(), func(m Member) bool { return m.Name == c.Name() })
	}

	tr.paused.Store(true)
	waitFor(t, "the paused member suspected", eventDeadline, func() bool {
		return strings.Contains(aLog.String(), "Suspect "+c.Name()+" has failed")
	})
	if !listed() {
		t.Fatalf("a suspect member is not listed: %v", a.Members())
	}
	tr.paused.Store(false)
	waitFor(t, "the suspect refutes", eventDeadline, func() bool {
		return strings.Contains(cLog.String(), "Refuting a suspect message")
	})
	if !listed() {
		t.Fatalf("a member that refuted its suspicion is not listed: %v", a.Members())
	}
	for len(a.Events()) > 0 {
		if ev := <-a.Events(); ev.Member.Name == c.Name() && (ev.Kind == EventFail || ev.Kind == EventLeave) {
			t.Fatalf("suspicion reported as %s: %+v", ev.Kind, ev)
		}
	}
}
