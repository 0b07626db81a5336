package dataplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// BenchmarkThroughput moves the same KV bytes over loopback four
// ways, alternating in one run: "raw" writes them on a plain TCP connection
// in 1 MiB writes to a reader that only counts them, "raw-tls" does the same
// over crypto/tls (the most TLS can carry here); "dataplane" sends them
// as full-page frames with a Sender (batches encoded with
// checksums, back-pressure window, acknowledgements) over plain TCP to a
// Server whose handler does nothing (the page writes are the
// pool's cost, not the transport's); "tls" does the same over TLS 1.3 with
// certificates of one test CA. Each round moves RoundBytes of payload and
// waits until the receiver has all of it (raw, raw-tls) or every batch is
// acknowledged (dataplane, tls). It reports payload MB/s of each,
// dataplane/raw ("ratio"), tls/dataplane ("tls-ratio", the price of TLS on
// the data plane) and raw-tls/raw ("tls-ceiling", its price on a bare
// stream), for the default configuration of each geometry and three
// back-pressure windows.
func BenchmarkThroughput(b *testing.B) {
	for _, bg := range []struct {
		name string
		g    kv.Geometry
	}{
		// A 7B-class model: 128 KiB a token, 2 MiB a page.
		{"2MiB-page", kv.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, PageTokens: 16, DType: kv.F16}},
		// A small model: 4 KiB a token, 64 KiB a page.
		{"64KiB-page", kv.Geometry{Layers: 4, KVHeads: 4, HeadDim: 64, PageTokens: 16, DType: kv.F16}},
	} {
		for _, inflight := range []int{2, 4, 8} {
			b.Run(fmt.Sprintf("%s/inflight=%d", bg.name, inflight), func(b *testing.B) { benchDataPlane(b, bg.g, inflight) })
		}
	}
}

const benchRoundBytes = 64 << 20

func benchDataPlane(b *testing.B, g kv.Geometry, inflight int) {
	pages := max(1, benchRoundBytes/g.PageBytes())
	arena := make([]byte, pages*g.PageBytes())
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(arena); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			arena[i+j] = byte(v >> (8 * j))
		}
	}
	frames := make([]kv.Frame, pages)
	for i := range frames {
		frames[i] = kv.Frame{
			Owner:      kv.Owner{Request: 1, Tenant: "bench"},
			Source:     kv.Tag{Incarnation: 1, Index: uint32(i), Generation: 1},
			Dest:       kv.Tag{Incarnation: 2, Index: uint32(i), Generation: 1},
			FirstToken: i * g.PageTokens,
			Tokens:     g.PageTokens,
			Payload:    arena[i*g.PageBytes() : (i+1)*g.PageBytes()],
		}
	}

	ca := trusttest.New(b)
	plain := benchSender(b, g, inflight, trust.Insecure(nil), trust.Insecure(nil))
	secure := benchSender(b, g, inflight, ca.Authority(b, trust.RoleDecode, "d0", nil), ca.Authority(b, trust.RolePrefill, "p0", nil))
	raw, rawDone, stop := rawLoopback(b, len(arena), nil, nil)
	defer stop()
	rawTLS, rawTLSDone, stopTLS := rawLoopback(b, len(arena), ca.Bundle(b, trust.RoleDecode, "d1"), ca.Bundle(b, trust.RolePrefill, "p1"))
	defer stopTLS()
	stream := func(conn net.Conn, done <-chan struct{}) time.Duration {
		s := time.Now()
		for off := 0; off < len(arena); off += 1 << 20 {
			if _, err := conn.Write(arena[off:min(off+1<<20, len(arena))]); err != nil {
				b.Fatal(err)
			}
		}
		<-done
		return time.Since(s)
	}

	ctx := context.Background()
	var tRaw, tRawTLS, tDP, tTLS time.Duration
	for b.Loop() {
		tRaw += stream(raw, rawDone)
		tRawTLS += stream(rawTLS, rawTLSDone)

		s := time.Now()
		if err := plain.Send(ctx, frames); err != nil {
			b.Fatal(err)
		}
		tDP += time.Since(s)

		s = time.Now()
		if err := secure.Send(ctx, frames); err != nil {
			b.Fatal(err)
		}
		tTLS += time.Since(s)
	}
	mb := float64(b.N) * float64(len(arena)) / 1e6
	b.ReportMetric(mb/tRaw.Seconds(), "raw-MB/s")
	b.ReportMetric(mb/tRawTLS.Seconds(), "raw-tls-MB/s")
	b.ReportMetric(mb/tDP.Seconds(), "dataplane-MB/s")
	b.ReportMetric(mb/tTLS.Seconds(), "tls-MB/s")
	b.ReportMetric(tRaw.Seconds()/tDP.Seconds(), "ratio")
	b.ReportMetric(tDP.Seconds()/tTLS.Seconds(), "tls-ratio")
	b.ReportMetric(tRaw.Seconds()/tRawTLS.Seconds(), "tls-ceiling")
}

// benchSender is a sender dialed to a server whose handler does nothing,
// under the given authorities (the receiver's, the sender's); both close
// with the benchmark.
func benchSender(b *testing.B, g kv.Geometry, inflight int, recv, send *trust.Authority) *Sender {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rcfg := DefaultConfig(g, 2)
	rcfg.Logger, rcfg.Auth, rcfg.Model = quiet, recv, testModel
	srv, err := Listen(rcfg, "127.0.0.1:0", func(Batch) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close() })
	scfg := DefaultConfig(g, 1)
	scfg.InFlightMax = inflight
	scfg.Logger, scfg.Auth, scfg.Model = quiet, send, testModel
	snd, err := Dial(scfg, srv.Addr().String(), 2, recv.Self())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { snd.Close() })
	return snd
}

// rawLoopback is a TCP connection on loopback, plain or (with a
// receiver's and a sender's bundle) TLS, whose reader reads into a 1 MiB
// buffer and signals each time another round of bytes has arrived.
func rawLoopback(b *testing.B, round int, recv, send *trust.Bundle) (net.Conn, <-chan struct{}, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{}, 1)
	go func() {
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		if recv != nil {
			c = tls.Server(c, recv.ServerTLS())
		}
		defer c.Close()
		buf := make([]byte, 1<<20)
		got := 0
		for {
			n, err := c.Read(buf)
			got += n
			for got >= round {
				got -= round
				done <- struct{}{}
			}
			if err != nil {
				return
			}
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	if send != nil {
		conn = tls.Client(conn, send.ClientTLS())
	}
	return conn, done, func() { conn.Close() }
}
