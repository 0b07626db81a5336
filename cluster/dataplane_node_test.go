package cluster

import (
	"errors"
	"net"
	"testing"

	"github.com/kvwarden/kvwarden/cluster/dataplane"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// A node's dialer fails with a nil FrameSender, never a nil
// *dataplane.Sender inside a non-nil one, whose methods would panic in the
// worker; a secure node dials only a data plane that a verified member of
// the plan's incarnation advertises.
func TestDataPlaneNodeDialFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	ca := trusttest.New(t)
	for _, auth := range []*trust.Authority{trust.Insecure(nil), ca.Authority(t, trust.RolePrefill, "p0", nil)} {
		n := &Node{cfg: NodeConfig{Auth: auth}}
		dp := dataplane.DefaultLocalConfig(kv.Geometry{PageTokens: 1}, 1)
		dp.Auth, dp.Model = auth, testModel
		s, err := n.dialPlanned(dp, closed, 2)
		if s != nil || err == nil {
			t.Fatalf("insecure=%t: dial of a closed port = %#v, %v; want a nil FrameSender and an error", auth.Insecure(), s, err)
		}
		var unplanned *DataPlaneUnplannedError
		if !auth.Insecure() && (!errors.As(err, &unplanned) || unplanned.Incarnation != 2) {
			t.Fatalf("secure dial with no member known = %v, want a *DataPlaneUnplannedError", err)
		}
		t.Log(err)
	}
}
