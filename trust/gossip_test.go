package trust_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/trust"
)

func TestGossipKeysRoundTrip(t *testing.T) {
	var keys [][]byte
	for range 3 {
		k, err := trust.NewGossipKey()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if bytes.Equal(keys[0], keys[1]) {
		t.Fatal("two fresh gossip keys are equal")
	}
	file := append([]byte("# primary first\n\n"), trust.EncodeGossipKeys(keys)...)
	got, err := trust.DecodeGossipKeys(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(keys) {
		t.Fatalf("decoded %d keys, want %d", len(got), len(keys))
	}
	for i := range keys {
		if !bytes.Equal(got[i], keys[i]) {
			t.Fatalf("key %d changed in the round trip", i)
		}
	}
}

func TestGossipKeysRefusals(t *testing.T) {
	key := base64.StdEncoding.EncodeToString(make([]byte, trust.GossipKeyBytes))
	short := base64.StdEncoding.EncodeToString(make([]byte, 16))
	tests := []struct {
		name, file, want string
	}{
		{"none", "", "no gossip key"},
		{"only comments", "# rotated out\n\n", "no gossip key"},
		{"wrong length", key + "\n" + short + "\n", "gossip key on line 2 is 16 bytes, want 32"},
		{"not base64", "%%%\n", "gossip key on line 1"},
		{"too many", strings.Repeat(key+"\n", trust.GossipKeysMax+1), fmt.Sprintf("more than %d gossip keys", trust.GossipKeysMax)},
	}
	for _, tt := range tests {
		if keys, err := trust.DecodeGossipKeys([]byte(tt.file)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: DecodeGossipKeys = %d keys, %v; want %q", tt.name, len(keys), err, tt.want)
		}
	}
	if _, err := trust.LoadGossipKeys(t.TempDir()); err == nil || !strings.Contains(err.Error(), "gossip keys") {
		t.Errorf("LoadGossipKeys(empty dir) = %v", err)
	}
}
