package engine

// GGUFVocab is the tokenizer a GGUF file's metadata describes (the
// tokenizer.ggml.* keys and tokenizer.chat_template), as the GGUF reader
// found it: every array already bounded and of the file's vocabulary
// length, every id already inside the vocabulary. NewGGUFTokenizer makes
// its tokenizer, DetectChatTemplate its chat template.
type GGUFVocab struct {
	// Model is tokenizer.ggml.model: "llama" (SentencePiece), "gpt2"
	// (byte-level BPE), or another the file names.
	Model string
	// Pre is tokenizer.ggml.pre, the pre-tokenizer of a gpt2 vocabulary;
	// "" when absent.
	Pre string
	// Tokens are the pieces, one per id (tokenizer.ggml.tokens).
	Tokens []string
	// Scores are the merge scores (tokenizer.ggml.scores); nil when absent
	// (every score 0, as llama.cpp takes it).
	Scores []float32
	// Types are the token types (tokenizer.ggml.token_type: 0 undefined,
	// 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte);
	// nil when absent (every token normal, as llama.cpp takes it).
	Types []int32
	// BOS, EOS, Unknown, Padding are the special ids
	// (tokenizer.ggml.bos_token_id …); -1 when absent. NewGGUFTokenizer
	// gives an absent one of a llama vocabulary llama.cpp's default:
	// unknown 0, BOS 1, EOS 2.
	BOS, EOS, Unknown, Padding int
	// AddBOS, AddEOS and AddSpacePrefix are tokenizer.ggml.add_bos_token,
	// add_eos_token and add_space_prefix (defaults true, false, true).
	// Prompts here always start with BOS, whatever AddBOS says.
	AddBOS, AddEOS, AddSpacePrefix bool
	// ChatTemplate is tokenizer.chat_template; "" when absent.
	ChatTemplate string
}

// ggufVocab is GGUFVocab, by the name the GGUF reader knows it.
type ggufVocab = GGUFVocab
