package kv

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
	"golang.org/x/crypto/blake2b"
)

// The benchmarks report ratios measured side by side in one run, so they
// travel between machines: run with
//
//	go test ./kv -run '^$' -bench . -benchtime 2s

var benchGeoms = []struct {
	name string
	g    Geometry
}{
	// The reference engine's default pages.
	{"small", Geometry{Layers: 4, KVHeads: 2, HeadDim: 32, PageTokens: 16, DType: F32}},
	// A Llama-3-8B-like model: 32 layers, 8 KV heads of 128, f16, 16 tokens.
	{"8b", Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, PageTokens: 16, DType: F16}},
}

func benchPool(b *testing.B, g Geometry, pages int) *Pool {
	b.Helper()
	p, err := NewPool(DefaultConfig(g, pages, 1))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkReserveRelease reserves and releases batches of pages; the
// pages/s metric counts pages through one reserve and one release.
func BenchmarkReserveRelease(b *testing.B) {
	g := benchGeoms[0].g
	for _, n := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			p := benchPool(b, g, 1024)
			o := Owner{Request: 1, Tenant: "t"}
			now := time.Unix(0, 0)
			b.ResetTimer()
			for b.Loop() {
				tags, err := p.Reserve(o, 0, n, now)
				if err != nil {
					b.Fatal(err)
				}
				for _, tag := range tags {
					if _, err := p.Release(tag, o, now); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "pages/s")
		})
	}
}

// sealedPage returns a pool with one full sealed page.
func sealedPage(b *testing.B, g Geometry) (*Pool, Tag, Owner) {
	p := benchPool(b, g, 1)
	o := Owner{Request: 1, Tenant: "t"}
	tags, _ := p.Reserve(o, 0, 1, time.Time{})
	data := make([]byte, g.PageBytes())
	for i := range data {
		data[i] = byte(i)
	}
	if err := p.Write(tags[0], o, 0, data); err != nil {
		b.Fatal(err)
	}
	if _, err := p.Seal(tags[0], o); err != nil {
		b.Fatal(err)
	}
	return p, tags[0], o
}

// sideBySide times base and subject in alternating runs of rounds calls,
// and reports both per-call times and subject/base. Alternating keeps a
// noisy neighbour from favouring one side; runs of many calls keep the
// clock's own cost out of short calls.
func sideBySide(b *testing.B, rounds int, base, subject func()) {
	var tb, ts time.Duration
	for b.Loop() {
		s := time.Now()
		for range rounds {
			base()
		}
		tb += time.Since(s)
		s = time.Now()
		for range rounds {
			subject()
		}
		ts += time.Since(s)
	}
	n := float64(b.N * rounds)
	b.ReportMetric(float64(tb.Nanoseconds())/n, "base-ns/op")
	b.ReportMetric(float64(ts.Nanoseconds())/n, "subject-ns/op")
	b.ReportMetric(float64(ts)/float64(tb), "ratio")
}

// BenchmarkVerifiedRead: base copies one page's bytes out of the arena;
// subjects are the verification a read adds to that copy. "read" is the
// check on every read through a held lease (tag, tenant, request, lease);
// "lease-cycle" also takes and gives back the lease, as a reader that reads
// a page once does. The ratio is verification as a fraction of the copy.
func BenchmarkVerifiedRead(b *testing.B) {
	for _, bg := range benchGeoms {
		p, tag, o := sealedPage(b, bg.g)
		src := p.bytesOf(tag.Index)
		dst := make([]byte, len(src))
		held, err := p.Lease(tag, o)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bg.name+"/read", func(b *testing.B) {
			sideBySide(b, 64, func() { copy(dst, src) }, func() {
				if _, _, err := p.Read(held); err != nil {
					b.Fatal(err)
				}
			})
		})
		b.Run(bg.name+"/lease-cycle", func(b *testing.B) {
			sideBySide(b, 64, func() { copy(dst, src) }, leaseCycle(b, p, func() (Lease, error) { return p.Lease(tag, o) }))
		})
	}
}

// BenchmarkChecksum: base is a memcpy of one page; subjects are the page
// checksum (XXH3 over header and payload, what Seal and Verify compute) and,
// for the choice of function, CRC32C over the same bytes.
func BenchmarkChecksum(b *testing.B) {
	for _, bg := range benchGeoms {
		p, tag, o := sealedPage(b, bg.g)
		src := p.bytesOf(tag.Index)
		dst := make([]byte, len(src))
		castagnoli := crc32.MakeTable(crc32.Castagnoli)
		var sink uint64
		for _, sub := range []struct {
			name string
			f    func()
		}{
			{"xxh3-page", func() { sink += PageChecksum(tag, o, 0, bg.g.PageTokens, src) }},
			{"xxh3-bytes", func() { sink += xxh3.Hash(src) }},
			{"crc32c-bytes", func() { sink += uint64(crc32.Checksum(src, castagnoli)) }},
		} {
			b.Run(bg.name+"/"+sub.name, func(b *testing.B) {
				sideBySide(b, 16, func() { copy(dst, src) }, sub.f)
			})
		}
		_ = sink
	}
}

// BenchmarkSealVerify: base is a memcpy of one page; subject is what
// integrity costs a page in its life: the seal's checksum plus a manifest
// verify (handshake and checksum recomputed).
func BenchmarkSealVerify(b *testing.B) {
	for _, bg := range benchGeoms {
		b.Run(bg.name, func(b *testing.B) {
			p, tag, o := sealedPage(b, bg.g)
			src := p.bytesOf(tag.Index)
			dst := make([]byte, len(src))
			m, _ := NewManifest(o, bg.g.PageTokens, bg.g.PageTokens, []Tag{tag})
			m.Pages[0].Checksum = p.Inspect(tag.Index).Checksum
			sideBySide(b, 16, func() { copy(dst, src) }, func() {
				PageChecksum(tag, o, 0, bg.g.PageTokens, src)
				if err := m.Verify(p); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// BenchmarkFrameCodec: base is a memcpy of one page; subject encodes it as
// a frame and decodes it (checksum computed and verified).
func BenchmarkFrameCodec(b *testing.B) {
	for _, bg := range benchGeoms {
		b.Run(bg.name, func(b *testing.B) {
			p, tag, o := sealedPage(b, bg.g)
			src := p.bytesOf(tag.Index)
			dst := make([]byte, len(src))
			lim := bg.g.Limits()
			buf := make([]byte, 0, lim.FrameBytesMax())
			f := Frame{Owner: o, Source: tag, Dest: tag, Tokens: bg.g.PageTokens, Payload: src}
			sideBySide(b, 16, func() { copy(dst, src) }, func() {
				enc, _, err := AppendFrame(buf[:0], &f, lim)
				if err != nil {
					b.Fatal(err)
				}
				if _, _, err := DecodeFrame(enc, lim); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// BenchmarkFrameMAC answers whether frames should also carry a MAC keyed
// by a random per-attempt key sent in the plan. Base is XXH3 over one page
// (the frame checksum today); subjects are a memcpy of the page, for scale,
// and the candidates: XXH3 seeded with a 64-bit key (cheap, but XXH3 is no
// PRF, so a seed is no MAC key), HMAC-SHA256, keyed BLAKE2b-256 and GMAC
// (AES-128-GCM over the page as additional data, what TLS 1.3 does to the
// same bytes on the data plane). Pages of 32 KiB (small) and 2 MiB (8b).
// The ratio is each subject's time over XXH3's.
func BenchmarkFrameMAC(b *testing.B) {
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i * 7)
	}
	for _, bg := range benchGeoms {
		p, tag, _ := sealedPage(b, bg.g)
		src := p.bytesOf(tag.Index)
		dst := make([]byte, len(src))
		mac := hmac.New(sha256.New, key)
		blake, err := blake2b.New256(key)
		if err != nil {
			b.Fatal(err)
		}
		block, err := aes.NewCipher(key[:16])
		if err != nil {
			b.Fatal(err)
		}
		gcm, err := cipher.NewGCM(block)
		if err != nil {
			b.Fatal(err)
		}
		nonce, tagBuf := make([]byte, gcm.NonceSize()), make([]byte, 0, gcm.Overhead())
		seed := binary.LittleEndian.Uint64(key)
		var sink uint64
		sum := make([]byte, 0, 64)
		rounds := max(1, (1<<20)/len(src))
		for _, sub := range []struct {
			name string
			f    func()
		}{
			{"memcpy", func() { copy(dst, src) }},
			{"xxh3-keyed", func() { sink += xxh3.HashSeed(src, seed) }},
			{"hmac-sha256", func() {
				mac.Reset()
				mac.Write(src)
				sum = mac.Sum(sum[:0])
			}},
			{"blake2b-keyed", func() {
				blake.Reset()
				blake.Write(src)
				sum = blake.Sum(sum[:0])
			}},
			{"gmac-aes128", func() { tagBuf = gcm.Seal(tagBuf[:0], nonce, nil, src) }},
		} {
			b.Run(bg.name+"/"+sub.name, func(b *testing.B) {
				sideBySide(b, rounds, func() { sink += xxh3.Hash(src) }, sub.f)
			})
		}
		_ = sink
	}
}

// BenchmarkSharedLease: base copies one page's bytes out of the arena, as
// a prefill that hits copies a cached page into the request's own; the
// subject is what a hit adds to that copy: a shared lease (which hashes
// the whole page afresh), a read and an unlease. The ratio is the
// verification as a fraction of the copy.
func BenchmarkSharedLease(b *testing.B) {
	for _, bg := range benchGeoms {
		p, tag, o := sealedPage(b, bg.g)
		scope := TenantScope(o.Tenant)
		c, err := p.Publish(tag, o, scope)
		if err != nil {
			b.Fatal(err)
		}
		src := p.bytesOf(tag.Index)
		dst := make([]byte, len(src))
		b.Run(bg.name, func(b *testing.B) {
			sideBySide(b, 16, func() { copy(dst, src) }, leaseCycle(b, p, func() (Lease, error) { return p.LeaseShared(c, o, scope) }))
		})
	}
}

// BenchmarkPrefixMiss: what the prefix cache adds to a prompt that hits
// nothing. Base checksums the prompt's full pages, as sealing them does
// anyway; the subject computes the prompt's keys and looks them up in an
// index full of other prompts' pages. The prompt is 512 + 32 tokens.
func BenchmarkPrefixMiss(b *testing.B) {
	for _, bg := range benchGeoms {
		g := bg.g
		root, err := PrefixRoot(TenantScope("t"), "bench", g)
		if err != nil {
			b.Fatal(err)
		}
		x, err := NewPrefixIndex(1024)
		if err != nil {
			b.Fatal(err)
		}
		for i := range uint32(1024) {
			c := CachedPage{Tag: Tag{Incarnation: 1, Index: i, Generation: 1}, First: int(i%32) * g.PageTokens, Tokens: g.PageTokens}
			if err := x.Add(root.Next([]int{-int(i)}), c); err != nil {
				b.Fatal(err)
			}
		}
		prompt := make([]int, 512+32)
		for i := range prompt {
			prompt[i] = i
		}
		page := make([]byte, g.PageBytes())
		o := Owner{Request: 1, Tenant: "t"}
		tag := Tag{Incarnation: 1, Generation: 1}
		pages := len(prompt) / g.PageTokens
		b.Run(bg.name, func(b *testing.B) {
			sideBySide(b, 4, func() {
				for i := range pages {
					PageChecksum(tag, o, i*g.PageTokens, g.PageTokens, page)
				}
			}, func() {
				if hit := x.Match(PrefixKeys(root, prompt, g.PageTokens)); len(hit) != 0 {
					b.Fatalf("%d pages hit", len(hit))
				}
			})
		})
	}
}

// leaseCycle is a lease taken by lease, a read through it and its
// unlease.
func leaseCycle(b *testing.B, p *Pool, lease func() (Lease, error)) func() {
	return func() {
		l, err := lease()
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := p.Read(l); err != nil {
			b.Fatal(err)
		}
		if err := p.Unlease(l); err != nil {
			b.Fatal(err)
		}
	}
}
