//go:build mutant_checksum_skips_header

package mutant

// Active is the mutant this build carries.
const Active = ChecksumSkipsHeader
