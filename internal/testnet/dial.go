package testnet

import (
	"net"
	"testing"
	"time"
)

// DialFrom connects to addr from the loopback address ip (any of
// 127.0.0.0/8 on Linux), as a peer on another host of the network would
// look to the server, and closes the connection when the test ends.
func DialFrom(t testing.TB, ip, addr string) (net.Conn, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return c, nil
}
