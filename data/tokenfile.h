// The token file (llm.c's format): a header of 256 little-endian int32 — [0] = 20240520 (magic),
// [1] = 1 (version), [2] = number of tokens — then the tokens as uint16.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TOKENFILE_MAGIC 20240520
#define TOKENFILE_VERSION 1
#define TOKENFILE_HEADER_INTS 256
#define TOKENFILE_HEADER_BYTES (TOKENFILE_HEADER_INTS * 4)

// Checks a header against the size of the whole file. Returns 0 and sets *ntokens, or returns -1 and
// writes a message (without the file name) into err, e.g. "wrong magic number 12345 (expected
// 20240520): not a token file". Never exits: the fuzz harness calls it.
int tokenfile_parse_header(const void* header, size_t file_bytes, long long* ntokens, char* err,
                           size_t errlen);
// Returns the index of the first token >= vocab_size, or -1 if all are valid.
long long tokenfile_first_bad_token(const uint16_t* tokens, size_t n, int vocab_size);

// Reads and validates a whole token file (header, size, every token < vocab_size). Exits with a
// message naming the file (and for a bad token its index and byte offset) on any problem.
uint16_t* tokenfile_read(const char* path, int vocab_size, size_t* ntokens);

// Writes a token file atomically (temporary file in the same directory, flush, fsync, rename).
// Exits naming the path if it cannot, leaving any previous file at path untouched.
void tokenfile_write(const char* path, const uint16_t* tokens, size_t ntokens);

// The same, written piece by piece, so that a file larger than memory can be written: the tokens
// go to the temporary file as they are appended and the header is filled in by tokenfile_finish.
// Appending beyond the format's limit of 2^31 - 1 tokens exits naming the path.
typedef struct TokenFileWriter TokenFileWriter;
TokenFileWriter* tokenfile_begin(const char* path);
void tokenfile_append(TokenFileWriter* w, const uint16_t* tokens, size_t n);
size_t tokenfile_count(const TokenFileWriter* w); // tokens appended so far
void tokenfile_finish(TokenFileWriter* w);         // header, commit (rename), free
void tokenfile_discard(TokenFileWriter* w);        // removes the temporary file, frees

#ifdef __cplusplus
}
#endif
