package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
)

// The range the ports local clusters' nodes keep across restarts (node
// chaos's, node up's) are drawn from: below Linux's default
// ephemeral range (net.ipv4.ip_local_port_range, 32768 up), from which the
// kernel gives ports to outbound connections and to listeners on port 0
// (the proxies, the clients). A port a killed node leaves is then still
// free when it restarts, unless another program took it on purpose.
const (
	fixedPortMin = 20000
	fixedPortMax = 32767
	// fixedPortTries bounds the draws for one free port.
	fixedPortTries = 100
)

// fixedPorts holds the ports drawn until the nodes are about to listen
// on them, so that no two draws, and no proxy, get the same; avoid are
// ports given on the command line, which no draw may take from the node
// that is to listen on them later.
type fixedPorts struct {
	held  []net.Listener
	avoid map[int]bool
}

// take draws a free TCP port of host and holds it.
func (p *fixedPorts) take(host string) (string, error) {
	for range fixedPortTries {
		port := fixedPortMin + rand.IntN(fixedPortMax-fixedPortMin+1)
		if p.avoid[port] {
			continue
		}
		if ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port))); err == nil {
			p.held = append(p.held, ln)
			return net.JoinHostPort(host, strconv.Itoa(port)), nil
		}
	}
	return "", fmt.Errorf("no free port of %s in [%d, %d] in %d draws", host, fixedPortMin, fixedPortMax, fixedPortTries)
}

// release lets the ports go, for the nodes to listen on.
func (p *fixedPorts) release() {
	for _, ln := range p.held {
		ln.Close()
	}
}
