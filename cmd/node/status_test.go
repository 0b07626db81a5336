package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/messages"
)

// TestPrintStatusSeparatesCancelled: node status counts cancelled
// requests apart from failed ones, and failures by code without them; it
// gives the mean of each phase of the first tokens.
func TestPrintStatusSeparatesCancelled(t *testing.T) {
	s := &messages.StatusReply{Node: messages.NodeStatus{Name: "d", Role: messages.RoleDecode, Address: "127.0.0.1:1",
		InFlight: 1, Admitted: 12, Completed: 4, Failed: 5, RejectedTooLong: 1, RejectedBusy: 2,
		RejectedBy: []uint64{1, 0, 0, 0, 0, 3}, FailedByCode: []uint64{0, 0, 2, 0, 1, 2},
		FirstToken: &messages.FirstTokenStatus{Requests: 4, QueueNs: 400e3, PrefillNs: 48e6, TransferNs: 4e6, VerifyNs: 3e6, Decoded: 3, FirstDecodeNs: 450e3},
		MovedOut:   2, MovedIn: 7}}
	var out bytes.Buffer
	printStatus(&out, s)
	for _, want := range []string{
		"requests: 1 in flight, 12 admitted, 4 completed, 2 cancelled, 3 failed, 1 rejected too long, 2 rejected busy, 3 rejected unavailable\n",
		"failed by code: busy 2, node_lost 1\n",
		"first token, mean of 4 requests: queue 100µs, prefill 12ms, transfer 1.00ms, verify 750µs; first decode step 150µs (of 3)\n",
		"moved between decode nodes: 2 requests out, 7 in; 0 streams followed\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
}

// tableWriter hands each Write, one whole table of a watch, to a channel.
type tableWriter chan string

func (w tableWriter) Write(p []byte) (int, error) {
	w <- string(p)
	return len(p), nil
}

// figure reads the number after name in a watch table (0 when the table
// has none, as an error code nobody was told), and what it moved by (""
// on the first table).
func figure(table, name string) (total int, moved string) {
	m := regexp.MustCompile(`\b` + name + `\s+(\d+)(?: \(([+-]\d+))?`).FindStringSubmatch(table)
	if m == nil {
		return 0, ""
	}
	total, _ = strconv.Atoi(m[1])
	return total, m[2]
}

// TestBinaryStatusWatch: a watch of a real node draws a table at once and
// one at the next tick, whose figures moved by exactly the requests sent
// in between; the binary's watch, on a pipe, prints tables one after the
// other without terminal codes and exits 0 on SIGINT.
func TestBinaryStatusWatch(t *testing.T) {
	cfg := actors.DefaultConfig()
	_, addr := startNode(t, "--gossip", "127.0.0.1:0", "--context-tokens", "256", "--max-tokens-max", "64")

	t.Run("moves by the requests", func(t *testing.T) {
		tables, ticks := make(tableWriter, 1), make(chan time.Time)
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			ask := func() (*messages.StatusReply, error) { return statusOf(t, addr) }
			watchStatus(ctx, tables, ask, ticks, watchHead{endpoint: addr, interval: time.Second})
		}()
		defer func() {
			stop()
			<-done
		}()
		next := func() string {
			select {
			case s := <-tables:
				return s
			case <-time.After(commandTimeout):
				t.Fatal("no table drawn")
			}
			return ""
		}
		first := next()

		tokens := 0
		for i, maxTokens := range []int{5, 12, 20} {
			prompt := fmt.Sprintf("request %d between two tables", i)
			want, n := referenceText(t, cfg, prompt, maxTokens)
			code, stdout, stderr := runBinary(t, "", "generate", "--endpoint", addr, "--tenant", "acme", "--prompt", prompt,
				"--max-tokens", strconv.Itoa(maxTokens))
			if code != exitOK || stdout != want+"\n" {
				t.Fatalf("request %d: exit %d, printed %q, want %q; stderr:\n%s", i, code, stdout, want, stderr)
			}
			tokens += n
		}
		if code, _, stderr := runBinary(t, "", "generate", "--endpoint", addr, "--tenant", "acme",
			"--prompt", strings.Repeat("x", 300), "--max-tokens", "4"); code != exitFailed || !strings.Contains(stderr, "prompt_too_long") {
			t.Fatalf("oversize request: exit %d; stderr:\n%s", code, stderr)
		}
		ticks <- time.Now()
		second := next()

		for _, c := range []struct {
			name  string
			moved int
		}{{"completed", 3}, {"cancelled", 0}, {"failed", 0}, {"rejected", 1}, {"tokens", tokens}, {"prompt_too_long", 1}} {
			before, _ := figure(first, c.name)
			after, moved := figure(second, c.name)
			if after != before+c.moved || moved != fmt.Sprintf("%+d", c.moved) {
				t.Errorf("%s went from %d to %d (shown %q), want %+d:\n%s\n%s", c.name, before, after, moved, c.moved, first, second)
			}
		}
		if inFlight, _ := figure(second, "in flight"); !strings.Contains(second, "in flight 0") || inFlight != 0 {
			t.Errorf("%d in flight after every request ended:\n%s", inFlight, second)
		}
		for _, want := range []string{"status of " + addr, "role all", "/s)\n", "\nPOOL ", "\nprefill-0/pool ", "\ndecode-0/pool ",
			"\nMEMBER ", " all ", " alive "} {
			if !strings.Contains(second, want) {
				t.Errorf("the table lacks %q:\n%s", want, second)
			}
		}
		if strings.Contains(first+second, "\x1b") {
			t.Errorf("terminal codes in tables not drawn on a terminal:\n%q", first+second)
		}
	})

	t.Run("binary stops on SIGINT", func(t *testing.T) {
		p := startProcess(t, "status", "--endpoint", addr, "--watch", "--interval", "50ms")
		heads := 0
		for heads < 2 {
			select {
			case line, ok := <-p.stdout:
				if !ok {
					t.Fatalf("stdout closed after %d tables; stderr:\n%s", heads, p.stderr)
				}
				if strings.Contains(line, "\x1b") {
					t.Fatalf("terminal codes on a pipe: %q", line)
				}
				if strings.HasPrefix(line, "status of "+addr+" at ") {
					heads++
				}
			case <-time.After(commandTimeout):
				t.Fatalf("%d tables within %s; stderr:\n%s", heads, commandTimeout, p.stderr)
			}
		}
		if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if code := p.exitCode(t, exitTimeout); code != exitOK {
			t.Fatalf("exit %d after SIGINT, want 0; stderr:\n%s", code, p.stderr)
		}
	})
}

// TestDrawWatchRestarted: a node that answers as another run is shown as
// restarted, with no figure moved against the old run's.
func TestDrawWatchRestarted(t *testing.T) {
	at := time.Unix(1_000_000, 0)
	old := &reading{s: &messages.StatusReply{Node: messages.NodeStatus{Name: "d", Role: messages.RoleDecode, Incarnation: 1, Completed: 9}}, at: at}
	now := reading{s: &messages.StatusReply{Node: messages.NodeStatus{Name: "d", Role: messages.RoleDecode, Incarnation: 2, Completed: 1,
		RejectedBusy: 2, RejectedBy: []uint64{0, 0, 0, 0, 0, 1}}}, at: at.Add(time.Second)}
	var out bytes.Buffer
	drawWatch(&out, watchHead{endpoint: "e:1", interval: time.Second}, now, old)
	for _, want := range []string{"incarnation 0000000000000002 (restarted: was incarnation 0000000000000001)", "completed 1  ",
		"errors    busy 2, unavailable 1\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	drawWatch(&out, watchHead{endpoint: "e:1", interval: time.Second}, reading{err: errors.New("no answer within 2s"), at: at}, old)
	if !strings.Contains(out.String(), "no answer: no answer within 2s") {
		t.Errorf("a failed look drawn as:\n%s", out.String())
	}
}
