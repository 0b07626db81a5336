package live

import (
	"fmt"
	"strings"
)

// Kind is a kind of fault a campaign injects.
type Kind uint8

const (
	// Kill is kill -9 of a node's process, and after the window a restart
	// on the same addresses: a new incarnation.
	Kill Kind = iota
	// Pause is SIGSTOP of a node's process for the window, then SIGCONT.
	Pause
	// Latency delays every byte to and from a node's remote and
	// data-plane ports (toxiproxy's latency toxic, both directions).
	Latency
	// Bandwidth limits the rate of those ports (toxiproxy's bandwidth
	// toxic, both directions).
	Bandwidth
	// Reset resets every connection to those ports that carries a byte in
	// the window (toxiproxy's reset_peer toxic).
	Reset
	// Partition cuts a node's inbound remote and data-plane ports off:
	// bytes to and from them are dropped for the window, and the
	// connections that carried them are closed when it ends (toxiproxy's
	// timeout toxic). Gossip is UDP and is not cut.
	Partition
	// Pressure has a node hold pages of its pools for the window, so that
	// requests meet exhausted pools.
	Pressure
	// Rogue is a round of attacks by a peer holding certificates of the
	// cluster's CA: forged frames and forged messages, each of which must
	// be refused, counted and change no answer.
	Rogue
	// Drain is an operator's drain of a decode node (a
	// messages.DrainRequest without Stay): the node moves its running
	// requests to the other decode nodes, KV and all, finishes those that
	// cannot move, leaves the cluster and exits, which must be exit 0;
	// after the window it is restarted on the same addresses, a new
	// incarnation. It needs two decode nodes: one to drain and one to
	// take its requests.
	Drain
	// Frames are the in-node faults of a chaos build (dropped, duplicated,
	// reordered, corrupted and misdirected frames, dropped acks), on for
	// the whole campaign at the rates given: never scheduled.
	Frames
	kinds
)

var kindNames = [kinds]string{"kill", "pause", "latency", "bandwidth", "reset", "partition", "pressure", "rogue", "drain", "frames"}

func (k Kind) String() string {
	if k < kinds {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// MarshalText spells a kind by its name, in reports.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// ParseKind reads one kind's name.
func ParseKind(s string) (Kind, error) {
	for k, name := range kindNames {
		if s == name {
			return Kind(k), nil
		}
	}
	return 0, fmt.Errorf("fault kind %q: want one of %s", s, strings.Join(kindNames[:], ", "))
}

// AllKinds are every kind, in order.
func AllKinds() []Kind {
	out := make([]Kind, kinds)
	for k := range out {
		out[k] = Kind(k)
	}
	return out
}

// Need is what a campaign must control to inject a kind.
type Need uint8

const (
	// NeedProcesses: the node processes (the campaign started them), and
	// for a drain its operator's DrainRequest.
	NeedProcesses Need = iota
	// NeedNetwork: a proxy in front of each node's ports, which the
	// nodes advertise to their peers.
	NeedNetwork
	// NeedPressure: the operator command that has a node hold pages.
	NeedPressure
	// NeedRogue: the cluster CA's key, to issue the rogue's certificates.
	NeedRogue
	// NeedChaosBuild: node processes of a chaos build (go build -tags
	// chaos), which have in-node fault points.
	NeedChaosBuild
)

var needNames = []string{"control of the node processes", "a proxy in front of every node's ports",
	"the operator's pool pressure command", "the cluster CA's key", "a chaos build of the node (go build -tags chaos)"}

func (n Need) String() string { return needNames[n] }

// Needs says what injecting k takes.
func (k Kind) Needs() Need {
	switch k {
	case Kill, Pause, Drain:
		return NeedProcesses
	case Latency, Bandwidth, Reset, Partition:
		return NeedNetwork
	case Pressure:
		return NeedPressure
	case Rogue:
		return NeedRogue
	}
	return NeedChaosBuild
}

// scheduled says whether the schedule draws k: frame faults are on for
// the whole campaign instead.
func (k Kind) scheduled() bool { return k != Frames }

// disrupts says whether k takes its target out of service for the
// window, so that a schedule keeps another node of the role serving: for
// a drain, the decode node its requests move to.
func (k Kind) disrupts() bool { return k == Kill || k == Pause || k == Partition || k == Drain }
