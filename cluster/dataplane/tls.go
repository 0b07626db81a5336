package dataplane

import (
	"net"
	"sync"
)

// dpCoalesceBytes is the most a sender gathers of one batch's TLS records
// before a socket write.
const dpCoalesceBytes = 256 << 10

// dpCoalescer sits between a sender's TLS connection and its socket and,
// while a batch is written (between hold and flush), gathers the records
// crypto/tls writes one syscall each (at most 16 KiB, and one more for
// every frame header) into writes of up to dpCoalesceBytes. Outside a
// batch, writes (the handshake, an alert, a key update answered by the
// reading goroutine) go straight through. Its lock orders a record
// written from another goroutine inside a batch among the batch's records,
// in the order crypto/tls sealed them.
//
// Measured side by side on a 2-CPU loopback, with and without it in one
// run, this raised TLS throughput by 4–33% (most runs about a quarter) for
// 2 MiB and 64 KiB pages alike, at the price of one copy of the
// ciphertext; 64 KiB and 1 MiB instead of 256 KiB made no difference that
// outlasted the noise. What remains is crypto/tls's: AES-128-GCM seals
// about 3.4 GB/s and opens about 4.2 GB/s on one core here, and both ends
// share the two cores, so TLS carries 0.35–0.5 of what plain TCP does
// (a bare crypto/tls stream 0.26–0.33 of a bare TCP one).
type dpCoalescer struct {
	net.Conn
	mu      sync.Mutex
	holding bool
	buf     []byte
}

func newDPCoalescer(conn net.Conn) *dpCoalescer {
	return &dpCoalescer{Conn: conn, buf: make([]byte, 0, dpCoalesceBytes)}
}

func (c *dpCoalescer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.holding {
		return c.Conn.Write(p)
	}
	if len(c.buf)+len(p) > cap(c.buf) {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) > cap(c.buf) {
			return c.Conn.Write(p)
		}
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

// hold starts gathering writes.
func (c *dpCoalescer) hold() {
	c.mu.Lock()
	c.holding = true
	c.mu.Unlock()
}

// flush writes what was gathered and stops gathering.
func (c *dpCoalescer) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holding = false
	return c.flushLocked()
}

func (c *dpCoalescer) flushLocked() error {
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	return err
}
