package kv

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"

	"github.com/kvwarden/kvwarden/internal/mutant"
)

// Checksums are XXH3-64 (zeebo/xxh3). The header is hashed first and its
// hash seeds the hash of the payload, so the sum covers both: a checksum of
// the bytes alone would let a misdirected frame (right bytes, wrong tag or
// owner) through. XXH3 was chosen over CRC32C and xxHash64 because it runs
// faster than a memcpy of the same bytes (see BenchmarkChecksum), so sealing
// and verifying cost less than moving the page.
//
// The checksums are not keyed, and frames carry no MAC: bytes between
// processes are authenticated by the data plane's mutual TLS, and prefill's
// seal checksums reach decode in its TransferDone over authenticated remote,
// against which decode seals what it received (Page.SealFrom). A MAC keyed
// per transfer attempt (sent in the plan) would add protection only against
// a forger inside a peer process, which would hold the key too. And none is
// cheap: BenchmarkFrameMAC measures HMAC-SHA256 at 13 to 21 times XXH3's
// cost, keyed BLAKE2b 16 to 47 times and GMAC 6 to 7 times, on 2 MiB and
// 32 KiB pages; only XXH3 seeded with a key costs the same, and it is no
// MAC.

// pageHeaderBytesMax bounds the encoded page header: tag (20) + request (8)
// + tenant length (1) + tenant + first token (4) + token count (4).
const pageHeaderBytesMax = 20 + 8 + 1 + TenantBytesMax + 4 + 4

// ContentChecksum is the checksum of rows at sequence positions [first,
// first+tokens) whatever page holds them: PageChecksum with no tag and no
// owner, so that two pools can tell they hold the same rows.
func ContentChecksum(first, tokens int, payload []byte) uint64 {
	return PageChecksum(Tag{}, Owner{}, first, tokens, payload)
}

// PageChecksum is the checksum of a page held by owner under tag whose rows
// hold sequence positions [first, first+tokens), with payload those rows'
// bytes.
func PageChecksum(tag Tag, owner Owner, first, tokens int, payload []byte) uint64 {
	var buf [pageHeaderBytesMax]byte
	b := appendTag(buf[:0], tag)
	b = appendOwner(b, owner)
	b = binary.LittleEndian.AppendUint32(b, uint32(first))
	b = binary.LittleEndian.AppendUint32(b, uint32(tokens))
	return xxh3.HashSeed(payload, headerSeed(b))
}

// headerSeed is the hash of an encoded header, which seeds the payload's.
func headerSeed(header []byte) uint64 {
	if mutant.Is(mutant.ChecksumSkipsHeader) {
		return 0 // the planted bug: the sum covers the payload only
	}
	return xxh3.Hash(header)
}

func appendTag(b []byte, t Tag) []byte {
	b = binary.LittleEndian.AppendUint64(b, t.Incarnation)
	b = binary.LittleEndian.AppendUint32(b, t.Index)
	return binary.LittleEndian.AppendUint64(b, t.Generation)
}

func appendOwner(b []byte, o Owner) []byte {
	b = binary.LittleEndian.AppendUint64(b, o.Request)
	b = append(b, byte(len(o.Tenant)))
	return append(b, o.Tenant...)
}
