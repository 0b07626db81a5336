package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
)

// Fingerprint is a hash of a model's config, weights and tokenizer: two
// nodes compute the same function exactly when their fingerprints are
// equal. Its string is hexadecimal.
type Fingerprint [16]byte

// String is the fingerprint in hexadecimal.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// Short is the first 12 hexadecimal digits, for tables and logs.
func (f Fingerprint) Short() string { return f.String()[:12] }

// IsZero says the fingerprint is unset.
func (f Fingerprint) IsZero() bool { return f == Fingerprint{} }

// ParseFingerprint reads a fingerprint's String.
func ParseFingerprint(s string) (Fingerprint, error) {
	var f Fingerprint
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(f) {
		return f, fmt.Errorf("engine: fingerprint %q is not %d hexadecimal digits", s, 2*len(f))
	}
	copy(f[:], b)
	return f, nil
}

// FingerprintError: a peer computes another model.
type FingerprintError struct {
	Ours, Theirs Fingerprint
}

func (e *FingerprintError) Error() string {
	return fmt.Sprintf("engine: model fingerprint %s is not this node's %s: the peer runs other weights, another tokenizer or another KV type (--dtype)", e.Theirs, e.Ours)
}

// fingerprint hashes everything the model's output depends on, in a fixed
// order and encoding: the config's fields, every weight's bits and every
// token's id, piece and the specials. The first 16 bytes of SHA-256 are
// kept.
func fingerprint(cfg ModelConfig, w *Weights, tok Tokenizer) Fingerprint {
	h := sha256.New()
	var b [8]byte
	word := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	floats := func(v []float32) {
		word(uint64(len(v)))
		buf := make([]byte, 0, 4096)
		for _, f := range v {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(f))
			if len(buf) == cap(buf) {
				h.Write(buf)
				buf = buf[:0]
			}
		}
		h.Write(buf)
	}
	tied := uint64(0)
	if cfg.TiedEmbeddings {
		tied = 1
	}
	for _, v := range []uint64{uint64(cfg.Vocab), uint64(cfg.Dim), uint64(cfg.Layers), uint64(cfg.Heads),
		uint64(cfg.KVHeads), uint64(cfg.HeadDim), uint64(cfg.HiddenDim), uint64(cfg.ContextTokens),
		math.Float64bits(cfg.RoPETheta), math.Float64bits(cfg.NormEps), tied, uint64(cfg.kvDType())} {
		word(v)
	}
	// matrix hashes a float32 matrix as its floats (as before matrices had
	// other types, so that those fingerprints stay), any other as its type
	// and bytes: a model quantized otherwise is another model.
	matrix := func(m *Matrix) {
		if m.Type == WeightF32 {
			floats(m.F32)
			return
		}
		word(uint64(m.Type) | 1<<63)
		word(uint64(len(m.Raw)))
		h.Write(m.Raw)
	}
	matrix(&w.Embed)
	for i := range w.Layers {
		l := &w.Layers[i]
		floats(l.AttnNorm)
		for _, m := range []*Matrix{&l.WQ, &l.WK, &l.WV, &l.WO} {
			matrix(m)
		}
		floats(l.MLPNorm)
		for _, m := range []*Matrix{&l.W1, &l.W2, &l.W3} {
			matrix(m)
		}
	}
	floats(w.Norm)
	matrix(&w.Out)
	word(uint64(tok.BOS()))
	word(uint64(tok.Stop()))
	switch t := tok.(type) {
	case *BPETokenizer:
		floats(t.scores) // merge scores decide how text encodes
	case *spmTokenizer:
		h.Write(t.fingerprintData()) // pieces, scores, types and flags
	}
	for id := range tok.Vocab() {
		for _, prev := range []int{tok.BOS(), id} {
			p := tok.Piece(prev, id)
			word(uint64(len(p)))
			h.Write(p)
		}
	}
	var f Fingerprint
	copy(f[:], h.Sum(nil))
	return f
}
