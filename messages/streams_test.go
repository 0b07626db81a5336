package messages

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/internal/testwait"
)

func chunkTo(to string, seq uint32, text string) StreamItem {
	return StreamItem{To: to, Chunk: &TokenChunk{RequestID: 1, Seq: seq, Tokens: []uint32{seq}, Text: text}}
}

// TestBatchesByDestination: queued items go as one batch a destination,
// in the order each destination first appears, each batch in queue order,
// split where it would pass StreamItemsMax or StreamBatchBytesMax, and
// every batch valid.
func TestBatchesByDestination(t *testing.T) {
	var out []streamOut
	for i := range 5 {
		out = append(out, streamOut{addr: []string{"a", "b"}[i%2], item: chunkTo(fmt.Sprintf("to-%d", i), uint32(i+1), "")})
	}
	type sent struct {
		addr string
		seqs []uint32
	}
	var got []sent
	collect := func(addr string, b *TokenBatch) {
		if err := b.Validate(); err != nil {
			t.Fatalf("batch to %s: %v", addr, err)
		}
		s := sent{addr: addr}
		for _, it := range b.Items {
			s.seqs = append(s.seqs, it.Chunk.Seq)
		}
		got = append(got, s)
	}
	batches(out, collect)
	if fmt.Sprint(got) != "[{a [1 3 5]} {b [2 4]}]" {
		t.Fatalf("batches %v, want a's 1 3 5 then b's 2 4", got)
	}

	got, out = nil, nil
	for i := range StreamItemsMax + 3 {
		out = append(out, streamOut{addr: "a", item: chunkTo("to", uint32(i+1), "")})
	}
	batches(out, collect)
	if len(got) != 2 || len(got[0].seqs) != StreamItemsMax || len(got[1].seqs) != 3 || got[1].seqs[0] != StreamItemsMax+1 {
		t.Fatalf("%d items made %d batches; want %d then 3", StreamItemsMax+3, len(got), StreamItemsMax)
	}

	got, out = nil, nil
	text := strings.Repeat("x", TextBytesMax)
	for i := range 5 { // 5 × 256 KiB of text: more than one batch's bytes
		out = append(out, streamOut{addr: "a", item: chunkTo("to", uint32(i+1), text)})
	}
	batches(out, collect)
	if len(got) != 2 || len(got[0].seqs) != 3 || len(got[1].seqs) != 2 {
		t.Fatalf("five chunks of 256 KiB made batches %v; want 3 then 2", got)
	}
}

// TestStreamsDeliverInOrder: what one sender sends through Streams reaches
// the handler registered for its receiver in order, with the Inbox as its
// sender; items for an id no handler holds are counted as unknown.
func TestStreamsDeliverInOrder(t *testing.T) {
	sys := NewActorSystem(nil)
	defer sys.Shutdown()
	s, err := NewStreams(sys)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	got := make(chan uint32, n)
	from := make(chan *actor.PID, 1)
	rx := actor.NewPID(sys.Address(), BatchedName("rx"))
	if !WantsBatches(rx) || WantsBatches(actor.NewPID(sys.Address(), "rx")) || WantsBatches(nil) {
		t.Fatal("WantsBatches does not tell a batched name from another")
	}
	s.Register(rx.Id, func(sender *actor.PID, it *StreamItem) {
		select {
		case from <- sender:
		default:
		}
		got <- it.Chunk.Seq
	})
	for i := range n {
		if err := s.Send(rx, &TokenChunk{RequestID: 1, Seq: uint32(i + 1), Tokens: []uint32{1}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Send(actor.NewPID(sys.Address(), "gone"), &GenerateResult{RequestID: 1, FinishReason: FinishLength}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if seq := testwait.Recv(t, fmt.Sprintf("item %d", i+1), time.Minute, got); seq != uint32(i+1) {
			t.Fatalf("item %d is seq %d", i+1, seq)
		}
	}
	if sender := testwait.Recv(t, "the first item's sender", time.Minute, from); sender.Id != InboxName {
		t.Errorf("items came from %s, want the Inbox", sender)
	}
	testwait.For(t, "the item for no one counted", time.Minute, func() bool { return s.Unknown.Load() == 1 })
	if s.Items.Load() != n+1 || s.Batches.Load() == 0 || s.Batches.Load() > n+1 {
		t.Errorf("%d items in %d batches, want %d items", s.Items.Load(), s.Batches.Load(), n+1)
	}
	if err := s.Send(rx, &TransferAck{RequestID: 1, Tenant: "a"}); err == nil {
		t.Error("Send took a message that is neither a chunk nor a result")
	}
	if err := s.Send(rx, &TokenChunk{RequestID: 1}); err == nil {
		t.Error("Send took an invalid chunk")
	}
}
