package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Network is a toxiproxy proxy in front of each TCP port of each node
// (its protoactor remote port and, on a node that decodes, its data-plane
// port), which the nodes advertise to their peers instead of their own:
// every byte between nodes, and between clients and nodes, passes a
// proxy, and a network fault is toxics on a node's proxies. Toxiproxy
// runs embedded in this process, needs no privileges and runs wherever
// the campaign runs (CI included), where network namespaces need root or
// user namespaces. Its limits: it proxies TCP only, so gossip (UDP, and
// memberlist's TCP push-pull on the same port) is not faulted and
// membership sees a cut-off node alive; and a proxy cannot tell the
// sources of its connections apart, so a cut is of everything inbound to
// a node, not between chosen pairs. Safe for concurrent use.
type Network struct {
	server *toxiproxy.ApiServer

	mu      sync.Mutex
	proxies map[string][]*toxiproxy.Proxy // by node
}

// NewNetwork starts no proxy yet. It silences zerolog for the whole
// process: some toxics log through zerolog's global logger at trace
// level, one line per chunk, and nothing else here uses zerolog.
func NewNetwork() *Network {
	zerolog.SetGlobalLevel(zerolog.Disabled)
	return &Network{server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		proxies: map[string][]*toxiproxy.Proxy{}}
}

// Proxy starts a proxy for node's port named port ("remote", "data"),
// listening on listen (host:port; port 0 picks one) and forwarding to
// upstream, and returns the address it listens on: the one the node
// advertises.
func (n *Network) Proxy(node, port, listen, upstream string) (string, error) {
	p := toxiproxy.NewProxy(n.server, node+"/"+port, listen, upstream)
	if err := p.Start(); err != nil {
		return "", fmt.Errorf("live: proxy for %s's %s port on %s: %w", node, port, listen, err)
	}
	n.mu.Lock()
	n.proxies[node] = append(n.proxies[node], p)
	n.mu.Unlock()
	return p.Listen, nil
}

// Close stops every proxy and closes the connections through them.
func (n *Network) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ps := range n.proxies {
		for _, p := range ps {
			p.Stop()
		}
	}
	n.proxies = map[string][]*toxiproxy.Proxy{}
}

// toxic is one toxic as toxiproxy reads it.
type toxic struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Stream     string         `json:"stream"`
	Toxicity   float32        `json:"toxicity"`
	Attributes map[string]any `json:"attributes"`
}

// toxicsOf are the toxics of a network fault, for both directions of
// every connection: requests to the node and what it sends back on them.
func toxicsOf(f Fault) ([]toxic, error) {
	var typ string
	attrs := map[string]any{}
	switch f.Kind {
	case Latency:
		typ, attrs["latency"], attrs["jitter"] = "latency", f.Latency.Milliseconds(), 0
	case Bandwidth:
		typ, attrs["rate"] = "bandwidth", f.BandwidthKiBps
	case Reset:
		typ, attrs["timeout"] = "reset_peer", 0
	case Partition:
		// A timeout of 0 drops every byte and keeps the connection open
		// until the toxic is removed, which closes it: a cut that heals
		// with the connections across it broken, as TCP's would be.
		typ, attrs["timeout"] = "timeout", 0
	default:
		return nil, fmt.Errorf("live: %s is not a network fault", f.Kind)
	}
	var out []toxic
	for _, stream := range []string{"upstream", "downstream"} {
		out = append(out, toxic{Name: fmt.Sprintf("fault-%d-%s", f.Seq, stream), Type: typ, Stream: stream, Toxicity: 1,
			Attributes: attrs})
	}
	return out, nil
}

// Apply puts the toxics of f on every proxy of f.Target and returns what
// removes them.
func (n *Network) Apply(f Fault) (heal func() error, err error) {
	ts, err := toxicsOf(f)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	ps := append([]*toxiproxy.Proxy(nil), n.proxies[f.Target]...)
	n.mu.Unlock()
	if len(ps) == 0 {
		return nil, fmt.Errorf("live: %s has no proxy", f.Target)
	}
	var added []func() error
	heal = func() error {
		var errs []error
		for _, remove := range added {
			errs = append(errs, remove())
		}
		return errors.Join(errs...)
	}
	for _, p := range ps {
		for _, t := range ts {
			b, _ := json.Marshal(t)
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(string(b))); err != nil {
				return nil, errors.Join(fmt.Errorf("live: %s toxic on %s: %w", t.Type, p.Name, err), heal())
			}
			added = append(added, func() error { return p.Toxics.RemoveToxic(context.Background(), t.Name) })
		}
	}
	return heal, nil
}
