// Package messagestest gives tests what they need to play another process
// over protoactor remote: an actor system serving remote under an
// authority of its own (a node, a client, or someone pretending to be
// one), and an inbox actor that hands over what it receives.
package messagestest

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// Peer is an actor system serving remote on a free loopback port.
type Peer struct {
	Sys  *actor.ActorSystem
	Auth *trust.Authority
	Addr string
}

// Start starts a peer under auth, stopped when the test ends.
func Start(t testing.TB, auth *trust.Authority) *Peer {
	t.Helper()
	return start(t, auth, messages.StartRemote)
}

// StartAwaiting is Start for a peer that waits on answers in futures
// (messages.StartRemoteAwaiting), as an operator's command does.
func StartAwaiting(t testing.TB, auth *trust.Authority) *Peer {
	t.Helper()
	return start(t, auth, messages.StartRemoteAwaiting)
}

func start(t testing.TB, auth *trust.Authority,
	serve func(*actor.ActorSystem, string, *trust.Authority) (*remote.Remote, error)) *Peer {
	t.Helper()
	sys := messages.NewActorSystem(nil)
	r, err := serve(sys, "127.0.0.1:0", auth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		messages.ShutdownRemote(sys, r)
		sys.Shutdown()
	})
	return &Peer{Sys: sys, Auth: auth, Addr: sys.Address()}
}

// Inbox spawns an actor named name on p that puts every wire message it
// gets, with its sender, on the returned channel.
func (p *Peer) Inbox(t testing.TB, name string) (*actor.PID, <-chan actor.MessageEnvelope) {
	t.Helper()
	got := make(chan actor.MessageEnvelope, 64)
	pid, err := p.Sys.Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(messages.Message); ok {
			got <- actor.MessageEnvelope{Message: m, Sender: c.Sender()}
		}
	}), name)
	if err != nil {
		t.Fatal(err)
	}
	return pid, got
}

// Next is the next message of an inbox, or fails the test after within.
func Next(t testing.TB, what string, inbox <-chan actor.MessageEnvelope, within time.Duration) actor.MessageEnvelope {
	t.Helper()
	select {
	case e := <-inbox:
		return e
	case <-time.After(within):
		t.Fatalf("%s: nothing within %s", what, within)
	}
	return actor.MessageEnvelope{}
}

// PID is a fresh copy of pid for another actor system: a PID caches the
// process (for a remote one, the endpoint) of the first system that used
// it, so one PID value sent from two systems in one process would leave
// through the first system's remote.
func PID(pid *actor.PID) *actor.PID { return actor.NewPID(pid.Address, pid.Id) }
