package main

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/kvwarden/kvwarden/cluster"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// controlClient talks to nodes' control actors (cluster.ControlName): the
// status and drain commands, up while it waits for its cluster, and chaos
// for pool pressure. It is
// its own actor system with a protoactor remote endpoint, because a node
// answers a request by sending to the requester's address; one client can
// ask any number of nodes.
type controlClient struct {
	sys    *actor.ActorSystem
	remote *remote.Remote
}

// dialControl starts a client whose remote endpoint listens on a free port
// of host, which must be an address the nodes it asks can reach it at.
func dialControl(host string, auth *trust.Authority) (*controlClient, error) {
	// remote.Start panics when it cannot listen, so the address is tried
	// first, as client.Dial does.
	sys := messages.NewActorSystem(nil)
	r, err := messages.StartRemoteAwaiting(sys, net.JoinHostPort(host, "0"), auth)
	if err != nil {
		sys.Shutdown()
		return nil, fmt.Errorf("listening for the node's answers: %w", err)
	}
	return &controlClient{sys: sys, remote: r}, nil
}

// dialControlFor reaches endpoint over TCP first, so that an address where
// nothing listens fails at once rather than after the request's timeout,
// and starts a client on the local address that connection used: the
// address the node can answer to.
func dialControlFor(endpoint string, auth *trust.Authority) (*controlClient, error) {
	if err := checkEndpoint(endpoint); err != nil {
		return nil, usageError{err}
	}
	conn, err := net.DialTimeout("tcp", endpoint, reachTimeout)
	if err != nil {
		return nil, fmt.Errorf("no node reachable at %s: %w", endpoint, err)
	}
	local := conn.LocalAddr().(*net.TCPAddr).IP.String()
	conn.Close()
	if !auth.Insecure() {
		// A refused certificate, either way, fails here with why, not as
		// a request that times out.
		if _, _, err := auth.Peers().Probe(endpoint); err != nil {
			return nil, fmt.Errorf("TLS with %s: %w", endpoint, err)
		}
	}
	return dialControl(local, auth)
}

// close stops the client at once. A graceful remote shutdown would wait,
// up to protoactor's 10 s, for endpoint writers still trying to connect to
// nodes that have gone (a drained node, a node that failed), and nothing is
// left to deliver once the client has its answers.
func (c *controlClient) close() {
	c.remote.Shutdown(false)
	c.sys.Shutdown()
}

// status asks the node serving protoactor remote on endpoint for its
// StatusReply.
func (c *controlClient) status(endpoint string, timeout time.Duration) (*messages.StatusReply, error) {
	rep, err := messages.Request(c.sys.Root, actor.NewPID(endpoint, cluster.ControlName), &messages.StatusRequest{}, timeout)
	if err != nil {
		return nil, fmt.Errorf("status of %s: %w", endpoint, err)
	}
	s, ok := rep.(*messages.StatusReply)
	if !ok {
		return nil, fmt.Errorf("status of %s: the answer is a %T, not a StatusReply", endpoint, rep)
	}
	return s, nil
}

// drainFuture sends a DrainRequest to the node on endpoint; the future
// holds its DrainReply.
func (c *controlClient) drainFuture(endpoint string, m *messages.DrainRequest, timeout time.Duration) (*actor.Future, error) {
	return messages.RequestFuture(c.sys.Root, actor.NewPID(endpoint, cluster.ControlName), m, timeout)
}

// migrate asks the node serving protoactor remote on endpoint to move
// request id (zero: every one) to other decode nodes.
func (c *controlClient) migrate(endpoint string, id inFlightID, timeout time.Duration) (*messages.MigrateReply, error) {
	rep, err := messages.Request(c.sys.Root, actor.NewPID(endpoint, cluster.ControlName),
		&messages.MigrateRequest{Number: id.number, Incarnation: id.incarnation}, timeout)
	if err != nil {
		return nil, fmt.Errorf("migrate on %s: %w", endpoint, err)
	}
	m, ok := rep.(*messages.MigrateReply)
	if !ok {
		return nil, fmt.Errorf("migrate on %s: answered %T", endpoint, rep)
	}
	return m, nil
}

// drainReply reads a drainFuture's answer.
func drainReply(endpoint string, f *actor.Future) (*messages.DrainReply, error) {
	res, err := f.Result()
	if err != nil {
		return nil, fmt.Errorf("drain of %s: %w", endpoint, err)
	}
	switch r := res.(type) {
	case *messages.DrainReply:
		return r, nil
	case *messages.Undecodable:
		return nil, fmt.Errorf("drain of %s: %w", endpoint, r)
	}
	return nil, fmt.Errorf("drain of %s: the answer is a %T, not a DrainReply", endpoint, res)
}

// pressure asks the node serving protoactor remote on endpoint to hold
// pages of each of its KV pools for d, through its pools' own
// reservations, and then release them (pool pressure): each pool holds
// pages pages, or its free pages when it has fewer. Only a chaos build of
// the node holds any; another answers with an error, returned with the
// reply. d is in whole milliseconds, as the message carries it.
func (c *controlClient) pressure(endpoint string, pages int, d, timeout time.Duration) (*messages.PressureReply, error) {
	if pages < 1 || pages > messages.PressurePagesMax {
		return nil, fmt.Errorf("pressure on %s: %d pages, want 1 to %d", endpoint, pages, messages.PressurePagesMax)
	}
	if longest := messages.PressureDurationMsMax * time.Millisecond; d < time.Millisecond || d > longest {
		return nil, fmt.Errorf("pressure on %s: a hold of %s, want 1ms to %s", endpoint, d, longest)
	}
	m := &messages.PressureRequest{Pages: uint32(pages), DurationMs: uint32(d / time.Millisecond)}
	rep, err := messages.Request(c.sys.Root, actor.NewPID(endpoint, cluster.ControlName), m, timeout)
	if err != nil {
		return nil, fmt.Errorf("pressure on %s: %w", endpoint, err)
	}
	r, ok := rep.(*messages.PressureReply)
	switch {
	case !ok:
		return nil, fmt.Errorf("pressure on %s: the answer is a %T, not a PressureReply", endpoint, rep)
	case r.Err != nil:
		return r, fmt.Errorf("pressure on %s: %w", endpoint, r.Err)
	}
	return r, nil
}

// checkEndpoint refuses a malformed host:port before anything is sent.
func checkEndpoint(endpoint string) error {
	_, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return fmt.Errorf("--endpoint %q: %w", endpoint, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("--endpoint %q: port %q must be 1 to 65535", endpoint, port)
	}
	return nil
}
