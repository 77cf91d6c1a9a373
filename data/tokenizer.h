// GPT-2 byte-level BPE tokenizer: loads encoder.json and vocab.bpe (the files OpenAI published),
// pre-tokenises as GPT-2's regex does ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+
// |\s+(?!\S)|\s+), and encodes and decodes. Vocabulary and merge ranks live in stb_ds hash maps.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Tokenizer Tokenizer;
// Memoised pieces of encoding (a speed-up only: the tokens never depend on it). One per thread.
typedef struct TokenizerCache TokenizerCache;

// Loads DIR/encoder.json and DIR/vocab.bpe. Exits with a message naming the file on any problem.
Tokenizer* tokenizer_load(const char* dir);
void tokenizer_free(Tokenizer* tok);
int tokenizer_vocab_size(const Tokenizer* tok); // 50257 for GPT-2

// Encodes len bytes of text (any bytes, valid UTF-8 or not). Returns a malloc'd array of *ntokens
// token ids. "<|endoftext|>" in the text is encoded as ordinary text, never as the special token.
// Uses the tokenizer's own cache, so two threads must not call it at once on one Tokenizer.
int* tokenizer_encode(const Tokenizer* tok, const char* text, size_t len, size_t* ntokens);
// The same with a cache of the caller's: threads may encode with one Tokenizer at once, each with
// its own cache (the Tokenizer itself is only read).
TokenizerCache* tokenizer_cache_new(void);
void tokenizer_cache_free(TokenizerCache* cache);
int* tokenizer_encode_cached(const Tokenizer* tok, TokenizerCache* cache, const char* text,
                             size_t len, size_t* ntokens);

// The raw bytes of one token (not NUL-terminated; *len set). NULL for an id outside the vocabulary.
const char* tokenizer_token_bytes(const Tokenizer* tok, int id, size_t* len);
// Decodes tokens into a malloc'd, NUL-terminated buffer of *len bytes (ids outside the vocabulary
// are skipped).
char* tokenizer_decode(const Tokenizer* tok, const int* ids, size_t n, size_t* len);

#ifdef __cplusplus
}
#endif
