package sim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvwarden/kvwarden/messages"
)

// delivery is one control message (encoded by package messages) on the
// simulated network, from one node run to the run of another node the
// sender means.
type delivery struct {
	from  *node
	inc   uint64 // the sender's run
	to    *node
	toInc uint64
	body  []byte
	// other: the decode node hands the message to another request than
	// the one it names.
	other bool
}

func (d *delivery) what() string {
	if len(d.body) < 2 {
		return "message"
	}
	return messages.TypeCode(uint16(d.body[0])<<8 | uint16(d.body[1])).String()
}

// partition cuts the link between two nodes from from to until.
type partition struct {
	a, b        *node
	from, until time.Time
}

func (w *world) partitioned(a, b *node) bool {
	for _, p := range w.parts {
		if (p.a == a && p.b == b || p.a == b && p.b == a) && !w.now.Before(p.from) && w.now.Before(p.until) {
			return true
		}
	}
	return false
}

// sendMessage encodes m for the run inc of node to and sends it.
func (n *node) sendMessage(to *node, inc uint64, m messages.Message) error {
	body, err := messages.Encode(m)
	if err != nil {
		return err
	}
	n.w.send(&delivery{from: n, inc: n.inc, to: to, toInc: inc, body: body})
	return nil
}

// errBadAddress: a message names an address no node has.
var errBadAddress = errors.New("sim: no node at that address")

func (w *world) node(addr string) (*node, error) {
	i := slices.IndexFunc(w.nodes, func(n *node) bool { return n.addr == addr })
	if i < 0 {
		return nil, fmt.Errorf("%w: %q", errBadAddress, addr)
	}
	return w.nodes[i], nil
}

// send puts a control message on the network, drawing its faults: a
// partition or a drop loses it, a misdirect sends it to another node of the
// receiver's role or has the decode node hand it to another request, a
// delay or reorder holds it back, a duplicate sends it twice.
func (w *world) send(d *delivery) {
	switch {
	case w.partitioned(d.from, d.to):
		w.count[PartitionCut]++
		w.trace.line(fmt.Sprintf("  net: %s %s -> %s cut by a partition", d.what(), d.from.addr, d.to.addr))
		return
	case w.chance(Drop):
		w.count[ControlDropped]++
		w.trace.line(fmt.Sprintf("  net: %s %s -> %s dropped", d.what(), d.from.addr, d.to.addr))
		return
	}
	if w.chance(Misdirect) {
		w.misdirect(d)
	}
	copies := 1
	if w.chance(Duplicate) {
		w.count[Duplicated]++
		w.trace.line("  net: " + d.what() + " duplicated")
		copies = 2
	}
	for range copies {
		lat := w.latency(d.what())
		w.after(lat, fmt.Sprintf("deliver %s %s/%x -> %s", d.what(), d.from.addr, d.inc, d.to.addr), func() { w.arrive(d) })
	}
}

// misdirect sends d to another node of the same role, or has its decode
// node hand it to another request.
func (w *world) misdirect(d *delivery) {
	peers := w.prefill
	if d.to.role == roleDecode {
		peers = w.decode
	}
	others := slices.DeleteFunc(slices.Clone(peers), func(n *node) bool { return n == d.to })
	switch {
	case d.to.role == roleDecode && (len(others) == 0 || w.rng.IntN(2) == 0):
		d.other = true
		w.trace.line("  net: " + d.what() + " misdirected to another request")
	case len(others) == 0:
		return
	default:
		d.to = others[w.rng.IntN(len(others))]
		d.toInc = d.to.inc
		w.trace.line("  net: " + d.what() + " misdirected to " + d.to.addr)
	}
	w.count[Misdirected]++
}

// delay draws the Delay fault for what: a delay past the prefill timeout.
func (w *world) delay(what string) (time.Duration, bool) {
	if !w.chance(Delay) {
		return 0, false
	}
	t := w.opt.Timing
	w.count[Delayed]++
	w.trace.line("  " + what + " delayed")
	return w.between(t.PrefillTimeout/2, 2*t.PrefillTimeout), true
}

// latency is a message's one-way delay: the network's, plus a delay past
// the prefill timeout or a smaller one that lets later messages overtake.
func (w *world) latency(what string) time.Duration {
	t := w.opt.Timing
	lat := w.between(t.Latency, t.Latency+t.Jitter)
	switch d, delayed := w.delay("net: " + what); {
	case delayed:
		lat += d
	case w.chance(Reorder):
		lat += w.between(t.Jitter, 10*(t.Latency+t.Jitter))
		w.count[Reordered]++
		w.trace.line("  net: " + what + " held back")
	}
	return lat
}

func (w *world) arrive(d *delivery) {
	n := d.to
	if n.inc == 0 || d.toInc != n.inc {
		w.count[DeadRunDropped]++
		w.trace.line(fmt.Sprintf("  dropped: %s has no run %x", n.addr, d.toInc))
		return
	}
	m, err := messages.Decode(d.body)
	if err != nil {
		w.fail("messages", "%s could not decode a %s it was sent: %v", n.addr, d.what(), err)
		return
	}
	n.messageIn(d, m)
}
