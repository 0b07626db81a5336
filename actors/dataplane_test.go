package actors

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// TestSendsOffTheWorker: of three transfers from one prefill worker, one to
// a data plane that accepts and never reads and one whose dial never
// returns, the third, to a data plane that reads, is answered at once; the
// other two fail at their PrefillTimeout, cleanly, and every page is free
// afterwards (startNode's cleanup).
func TestSendsOffTheWorker(t *testing.T) {
	cfg := testConfig()
	// Long enough for the healthy transfer on a loaded machine, which must
	// end before the stalled ones fail.
	cfg.PrefillTimeout = 10 * time.Second
	lim := cfg.BatchLimits()
	const hanging = "127.0.0.1:1"
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) })
	p := startPlanner(t, cfg, func(addr string, inc uint64) (FrameSender, error) {
		if addr == hanging {
			<-unblock
			return nil, errors.New("test dialer: released")
		}
		return dialFrames(addr, lim)
	})
	n, send, done := p.n, p.send, p.done
	healthy := serveFrames(t, lim, func([]kv.Frame) error { return nil })
	send(1, blackHole(t))
	send(2, hanging)
	waitFor(t, "both stalled transfers under way", time.Minute, func() bool {
		s, err := ask[WorkerStatusReply](n.Root(), n.prefill[0], WorkerStatus{}, time.Minute)
		return err == nil && s.Sending == 2
	})
	send(3, healthy)
	first := testwait.Recv(t, "the first TransferDone", time.Minute, done)
	if first.RequestID != 3 || first.Err != nil {
		t.Fatalf("first answer beside two stalled transfers: %+v, want request 3 done", first)
	}
	p.ack(3)
	for range 2 {
		select {
		case m := <-done:
			if (m.RequestID != 1 && m.RequestID != 2) || m.Err == nil {
				t.Fatalf("a stalled transfer answered %+v, want its failure", m)
			}
		case <-time.After(time.Minute):
			t.Fatal("a stalled transfer never failed")
		}
	}
}

// TestBusyDataPlaneIsDialedAgain: a receiver that answers busy (its
// connection slots taken, as by connections of this node still closing)
// is dialed again after a pause, within the transfer's deadline, and the
// transfer goes through; a dial that fails otherwise is not repeated.
func TestBusyDataPlaneIsDialedAgain(t *testing.T) {
	cfg := testConfig()
	lim := cfg.BatchLimits()
	healthy := serveFrames(t, lim, func([]kv.Frame) error { return nil })
	const busyDials = 3
	var dials atomic.Int32
	refused := "127.0.0.1:1" // refuses TCP: node lost, not busy
	p := startPlanner(t, cfg, func(addr string, inc uint64) (FrameSender, error) {
		if dials.Add(1) <= busyDials && addr == healthy {
			return nil, &messages.WireError{Code: messages.CodeBusy, Where: "data plane", Message: "test: connection slots taken"}
		}
		return dialFrames(addr, lim)
	})
	send, done := p.send, p.done
	send(1, healthy)
	if m := testwait.Recv(t, "the transfer to a receiver busy thrice", time.Minute, done); m.RequestID != 1 || m.Err != nil {
		t.Fatalf("transfer after %d busy dials: %+v, want it done", busyDials, m)
	}
	if got := dials.Load(); got != busyDials+1 {
		t.Fatalf("%d dials, want %d busy ones and the one that served", got, busyDials+1)
	}
	p.ack(1)
	send(2, refused)
	if m := testwait.Recv(t, "the transfer to a refusing address", time.Minute, done); m.RequestID != 2 || m.Err == nil {
		t.Fatalf("transfer to an address that refuses TCP: %+v, want its failure", m)
	}
	if got := dials.Load(); got != busyDials+2 {
		t.Fatalf("%d dials after a refused one, want it dialed once", got)
	}
}

// cutDial is a dial error of a receiver that took the connection and cut
// it, as dataplane.DialError says of itself.
type cutDial struct{}

func (cutDial) Error() string { return "test: connection cut in the handshake" }
func (cutDial) Cut() bool     { return true }

// TestCutDataPlaneIsDialedAFewTimes: a receiver that cuts the connection
// in its handshake is dialed again, dialCutsMax times, and the transfer
// fails then rather than at its deadline: one that cuts every connection
// (it speaks no data plane, or not with TLS) never takes one. One that cuts
// only the first connections takes the transfer.
func TestCutDataPlaneIsDialedAFewTimes(t *testing.T) {
	cfg := testConfig()
	cfg.PrefillTimeout = 3 * time.Minute // a failure comes from the count of cuts, long before
	lim := cfg.BatchLimits()
	healthy := serveFrames(t, lim, func([]kv.Frame) error { return nil })
	const cutting = "127.0.0.1:1"
	var dials atomic.Int32
	p := startPlanner(t, cfg, func(addr string, inc uint64) (FrameSender, error) {
		if n := dials.Add(1); addr == cutting || n <= 2 {
			return nil, cutDial{}
		}
		return dialFrames(addr, lim)
	})
	p.send(1, healthy)
	if m := testwait.Recv(t, "the transfer to a receiver that cut twice", time.Minute, p.done); m.RequestID != 1 || m.Err != nil {
		t.Fatalf("transfer after 2 cuts: %+v, want it done", m)
	}
	p.ack(1)
	dials.Store(10)
	p.send(2, cutting)
	if m := testwait.Recv(t, "the transfer to a receiver that cuts every connection", time.Minute, p.done); m.RequestID != 2 || m.Err == nil {
		t.Fatalf("transfer to a receiver that cuts every connection: %+v, want its failure", m)
	}
	if got := dials.Load() - 10; got != dialCutsMax+1 {
		t.Fatalf("%d dials of a receiver that cuts every connection, want %d", got, dialCutsMax+1)
	}
}

// planner is a node whose prefill workers dial with a test's dialer, and
// a stand-in decoder that plans three-token transfers on it, one page
// each, and hands their TransferDones to done.
type planner struct {
	n       *Node
	cfg     Config
	decoder *actor.PID
	done    chan *messages.TransferDone
}

func startPlanner(t *testing.T, cfg Config, dial Dialer) *planner {
	t.Helper()
	n, err := Start(cfg, withModel(t, cfg, Options{Dial: dial}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		quiesce(t, n)
		n.Stop()
	})
	p := &planner{n: n, cfg: cfg, done: make(chan *messages.TransferDone, 4)}
	p.decoder = n.Root().Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*messages.TransferDone); ok {
			p.done <- m
		}
	}))
	return p
}

// send plans transfer id to the data plane at dataPlane.
func (p *planner) send(id uint64, dataPlane string) {
	p.n.Root().RequestWithCustomSender(p.n.dispatcher, &messages.TransferPlan{RequestID: id, Tenant: "acme", TokenCount: 3,
		PromptTokens: []uint32{'a', 'b', 'c'}, PageTokens: uint32(p.cfg.PageTokens),
		DestTags: []kv.Tag{{Incarnation: 9, Index: uint32(id), Generation: 1}}, DataPlane: dataPlane,
		Model: p.n.Model().Fingerprint().String()}, p.decoder)
}

// ack acknowledges transfer id, which lets its source pages go.
func (p *planner) ack(id uint64) {
	p.n.Root().RequestWithCustomSender(p.n.dispatcher, &messages.TransferAck{RequestID: id, Tenant: "acme", TokenCount: 3, Pages: 1},
		p.decoder)
}

// The data plane of these tests: each batch (kv.AppendBatch) after its
// length in 4 bytes, answered by one byte, 0 when the receiver's handler
// took it. The cluster package has the real one, over TLS; it imports this
// package, so these tests cannot use it.

// frameConn is a FrameSender over one such connection.
type frameConn struct {
	conn net.Conn
	lim  kv.BatchLimits
	mu   sync.Mutex // one batch at a time on the connection
	once sync.Once
	dead chan struct{}
}

func dialFrames(addr string, lim kv.BatchLimits) (FrameSender, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &frameConn{conn: conn, lim: lim, dead: make(chan struct{})}, nil
}

func (s *frameConn) Send(ctx context.Context, frames []kv.Frame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := ctx.Deadline(); ok {
		// A moment past the transfer's deadline, which fails it as the
		// real data plane does (node lost); at the same instant a test's
		// i/o timeout could win that race and be told as internal.
		s.conn.SetDeadline(d.Add(time.Second))
	}
	b, err := kv.AppendBatch(make([]byte, 4), frames, s.lim)
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)-4))
	var ack [1]byte
	if _, err = s.conn.Write(b); err == nil {
		_, err = io.ReadFull(s.conn, ack[:])
	}
	switch {
	case err != nil:
		s.Close()
		return err
	case ack[0] != 0:
		return errors.New("test data plane: batch refused")
	}
	return nil
}

func (s *frameConn) Done() <-chan struct{} { return s.dead }

func (s *frameConn) Close() error {
	s.once.Do(func() {
		close(s.dead)
		s.conn.Close()
	})
	return nil
}

// serveFrames serves the test data plane, handing every batch to handle,
// and returns its address.
func serveFrames(t *testing.T, lim kv.BatchLimits, handle func([]kv.Frame) error) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	serve := func(conn net.Conn) {
		defer conn.Close()
		var n [4]byte
		for {
			if _, err := io.ReadFull(conn, n[:]); err != nil {
				return
			}
			size := binary.LittleEndian.Uint32(n[:])
			if size > uint32(lim.BytesMax+lim.PagesMax*lim.Frame.FrameBytesMax()) {
				return
			}
			b := make([]byte, size)
			if _, err := io.ReadFull(conn, b); err != nil {
				return
			}
			ack := []byte{0}
			frames, _, err := kv.DecodeBatch(b, lim)
			if err == nil {
				err = handle(frames)
			}
			if err != nil {
				ack[0] = 1
			}
			if _, err := conn.Write(ack); err != nil {
				return
			}
		}
	}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go serve(conn)
		}
	}()
	return l.Addr().String()
}

// blackHole listens, accepts and never reads or answers; it returns its
// address.
func blackHole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	return l.Addr().String()
}
