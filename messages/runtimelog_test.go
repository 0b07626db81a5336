package messages

import (
	"log/slog"
	"strings"
	"testing"
)

// TestRuntimeLogFolds: the runtime's records are counted by level and
// reach a node's log only at debug, with their own level kept.
func TestRuntimeLogFolds(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		var out strings.Builder
		rl := NewRuntimeLog(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: level})))
		log := rl.Logger().With("system", "nonhost")
		log.Error("EndpointWriter failed to connect", "address", "10.0.0.9:7070")
		log.Warn("dead letter", "message", "TokenOut")
		log.Info("Started EndpointManager")
		c := rl.Counts()
		if c.Error.Load() != 1 || c.Warn.Load() != 1 || c.Info.Load() != 1 || c.Debug.Load() != 0 {
			t.Fatalf("counts error %d warn %d info %d", c.Error.Load(), c.Warn.Load(), c.Info.Load())
		}
		got := out.String()
		switch level {
		case slog.LevelInfo:
			if got != "" {
				t.Fatalf("a node logging at info got the runtime's records:\n%s", got)
			}
		default:
			if strings.Count(got, "level=DEBUG") != 3 || !strings.Contains(got, "runtime_level=ERROR") ||
				!strings.Contains(got, "system=nonhost") || !strings.Contains(got, "address=10.0.0.9:7070") {
				t.Fatalf("at debug:\n%s", got)
			}
		}
	}
}
