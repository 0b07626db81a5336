package trust

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
)

// GossipKeyBytes is the size of a gossip key: AES-256-GCM, as memberlist
// takes it.
const GossipKeyBytes = 32

// GossipKeysMax bounds the keys of one keyring file.
const GossipKeysMax = 8

// NewGossipKey draws a random gossip key.
func NewGossipKey() ([]byte, error) {
	k := make([]byte, GossipKeyBytes)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("trust: gossip key: %w", err)
	}
	return k, nil
}

// EncodeGossipKeys is a keyring file: one base64 key a line, the first
// the one gossip is encrypted with, the others accepted on receipt (for
// rotation).
func EncodeGossipKeys(keys [][]byte) []byte {
	var b bytes.Buffer
	for _, k := range keys {
		b.WriteString(base64.StdEncoding.EncodeToString(k))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// DecodeGossipKeys reads a keyring file: 1 to GossipKeysMax keys of
// GossipKeyBytes each; blank lines and lines starting with # are skipped.
func DecodeGossipKeys(data []byte) ([][]byte, error) {
	var keys [][]byte
	for i, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(string(line))
		if err != nil {
			return nil, fmt.Errorf("trust: gossip key on line %d: %w", i+1, err)
		}
		if len(k) != GossipKeyBytes {
			return nil, fmt.Errorf("trust: gossip key on line %d is %d bytes, want %d", i+1, len(k), GossipKeyBytes)
		}
		if len(keys) == GossipKeysMax {
			return nil, fmt.Errorf("trust: more than %d gossip keys", GossipKeysMax)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("trust: no gossip key")
	}
	return keys, nil
}

// LoadGossipKeys reads dir's keyring file.
func LoadGossipKeys(dir string) ([][]byte, error) {
	data, err := os.ReadFile(filepath.Join(dir, GossipFile))
	if err != nil {
		return nil, fmt.Errorf("trust: gossip keys: %w", err)
	}
	return DecodeGossipKeys(data)
}
