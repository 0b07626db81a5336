package testnet

import (
	"io"
	"net"
	"testing"
)

// Echo serves, on a free loopback port until the test ends, every
// connection by sending back what it reads, and returns its address.
func Echo(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return Serve(t, ln, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// Serve accepts on ln until the test ends, handing each connection to
// handle on a goroutine of its own and closing it when handle returns, and
// returns ln's address.
func Serve(t testing.TB, ln net.Listener, handle func(net.Conn)) string {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}
