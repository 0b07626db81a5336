package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/bench"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// stubAdmission answers every request at once with its reference answer,
// one token chunk a token as a node streams them, then the result: an
// endpoint that costs nothing, so that a benchmark of it measures the
// generator (and the client and protocol) alone.
type stubAdmission struct {
	answers map[string]reference // by prompt and most tokens
	log     *slog.Logger
}

func stubKey(prompt string, maxTokens int) string { return fmt.Sprintf("%d\x00%s", maxTokens, prompt) }

func (s *stubAdmission) Receive(c actor.Context) {
	m, ok := c.Message().(*messages.GenerateRequest)
	if !ok {
		return
	}
	ref, ok := s.answers[stubKey(m.Prompt, int(m.MaxTokens))]
	if !ok {
		s.respond(c, &messages.GenerateResult{RequestID: m.RequestID, FinishReason: messages.FinishError,
			Err: &messages.WireError{Code: messages.CodeBadRequest, Message: "the stub knows no answer to this request"}})
		return
	}
	tokens := make([]uint32, len(ref.tokens))
	for i, t := range ref.tokens {
		tokens[i] = uint32(t)
		s.respond(c, &messages.TokenChunk{RequestID: m.RequestID, Seq: uint32(i + 1), Tokens: tokens[i : i+1]})
	}
	finish := messages.FinishLength
	if len(tokens) < int(m.MaxTokens) {
		finish = messages.FinishStop
	}
	s.respond(c, &messages.GenerateResult{RequestID: m.RequestID, Tokens: tokens, Text: ref.text, FinishReason: finish})
}

func (s *stubAdmission) respond(c actor.Context, m messages.Message) {
	if err := messages.Respond(c, m); err != nil {
		s.log.Error("the stub's answer refused by its own validation", "err", err)
	}
}

// startStub serves a stub admission actor in this process on loopback,
// insecure, answering each shape with its reference answer in answers;
// it returns the stub's address and how to stop it.
func startStub(log *slog.Logger, shapes []bench.Shape, answers []reference) (string, func(), error) {
	stub := &stubAdmission{answers: map[string]reference{}, log: log}
	for i, s := range shapes {
		stub.answers[stubKey(s.Prompt, s.MaxTokens)] = answers[i]
	}
	sys := messages.NewActorSystem(nil)
	r, err := messages.StartRemote(sys, "127.0.0.1:0", trust.Insecure(nil))
	if err != nil {
		sys.Shutdown()
		return "", nil, fmt.Errorf("bench: the stub: %w", err)
	}
	stop := func() {
		messages.ShutdownRemote(sys, r)
		sys.Shutdown()
	}
	if _, err := sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return stub }), client.AdmissionName); err != nil {
		stop()
		return "", nil, fmt.Errorf("bench: the stub: %w", err)
	}
	return sys.Address(), stop, nil
}

// benchStub benchmarks a stub endpoint through the Go client, as a
// cluster would be benchmarked.
func benchStub(ctx context.Context, stderr io.Writer, o benchOptions, w *workload, rep *benchReport) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	addr, stop, err := startStub(log, w.shapes, w.refs)
	if err != nil {
		return err
	}
	defer stop()
	// The stub is in this process, on loopback: no warning is due.
	s, err := o.dial(ctx, slog.New(slog.DiscardHandler), w, []string{addr}, credFlags{Insecure: true})
	if err != nil {
		return err
	}
	defer s.close()
	return runAll(ctx, stderr, o, w, s, "stub", rep)
}
