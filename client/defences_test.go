package client

// The client's own checks of what reaches a request's receiver, played
// by a scripted endpoint in the fake network of failover_test.go: the
// remote boundary proves a sender's address, and the node checks what it
// sends, but the client must drop what another sender, another request or
// an out-of-order chunk puts in its receiver.

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/messages"
)

// sent is one message a scripted endpoint sends, as if from the process at
// from.
type sent struct {
	from string
	m    any
}

// scripted is an endpoint at addr that answers each GenerateRequest with
// what script makes of it, in order, from one goroutine.
type scripted struct {
	addr   string
	sys    *actor.ActorSystem
	script func(req *messages.GenerateRequest) []sent
}

func (s *scripted) SendUserMessage(_ *actor.PID, message any) {
	env, ok := message.(*actor.MessageEnvelope)
	if !ok {
		return
	}
	if req, ok := env.Message.(*messages.GenerateRequest); ok {
		go func() {
			for _, x := range s.script(req) {
				s.sys.Root.RequestWithCustomSender(env.Sender, x.m, actor.NewPID(x.from, "relay"))
			}
		}()
	}
}

func (s *scripted) SendSystemMessage(*actor.PID, any) {}
func (s *scripted) Stop(*actor.PID)                   {}

// scriptedNetwork is a client whose one endpoint is s.
func scriptedNetwork(t *testing.T, s *scripted) *Client {
	t.Helper()
	sys := messages.NewActorSystem(nil)
	t.Cleanup(sys.Shutdown)
	s.sys = sys
	sys.ProcessRegistry.RegisterAddressResolver(func(pid *actor.PID) (actor.Process, bool) {
		return s, pid.Address == s.addr
	})
	c := newClient(sys, []*actor.PID{actor.NewPID(s.addr, AdmissionName)}, Options{NoAnswerAfter: time.Minute})
	t.Cleanup(c.Close)
	return c
}

// TestReceiverDropsWhatItsNodeDidNotSend: before its node's honest chunks
// and answer, a request's receiver is sent a chunk and an answer from
// another address, a chunk and an answer naming another request, a chunk
// out of sequence and a repeated one; each is dropped and counted, and the
// caller gets exactly the node's tokens and answer.
func TestReceiverDropsWhatItsNodeDidNotSend(t *testing.T) {
	const node, mallory = "router-a:1", "mallory:1"
	s := &scripted{addr: node, script: func(req *messages.GenerateRequest) []sent {
		id := req.RequestID
		chunk := func(seq uint32, tok uint32) *messages.TokenChunk {
			return &messages.TokenChunk{RequestID: id, Seq: seq, Tokens: []uint32{tok}, Text: letter(tok)}
		}
		forged := &messages.GenerateResult{RequestID: id, Tokens: []uint32{15}, Text: "p", FinishReason: messages.FinishStop}
		other := *forged
		other.RequestID = id + 1
		otherChunk := chunk(1, 15)
		otherChunk.RequestID = id + 1
		return []sent{
			{mallory, chunk(1, 15)}, {mallory, forged}, // another sender
			{node, otherChunk}, {node, &other}, // another request
			{node, chunk(2, 15)},                      // out of sequence
			{node, chunk(1, 7)}, {node, chunk(1, 15)}, // the first, then it again
			{node, chunk(2, 3)},
			{node, &messages.GenerateResult{RequestID: id, Tokens: []uint32{7, 3}, Text: text([]uint32{7, 3}),
				FinishReason: messages.FinishLength}},
		}
	}}
	c := scriptedNetwork(t, s)
	got := &collector{}
	res, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: 2, OnText: got.onText}, got.token)
	if err != nil || res.Text != "hd" || !slices.Equal(got.tokens, []int{7, 3}) || got.text.String() != "hd" {
		t.Fatalf("Generate = %+v, %v, delivered %v %q; want only the node's tokens [7 3] \"hd\"", res, err, got.tokens,
			got.text.String())
	}
	if n := c.Refused(); n != 6 {
		t.Fatalf("%d messages refused, want the 6 the node did not send in order", n)
	}
}
