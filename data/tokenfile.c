#include "data/tokenfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic_file.h"
#include "common/util.h"

// The header and the tokens are read and written as raw memory, which is the file's byte order
// only on a little-endian host.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files need a little-endian host");

int tokenfile_parse_header(const void* header, size_t file_bytes, long long* ntokens, char* err,
                           size_t errlen) {
    if (file_bytes < TOKENFILE_HEADER_BYTES) {
        snprintf(err, errlen, "the file has %zu bytes, too short for the %d-byte header of a token file",
                 file_bytes, TOKENFILE_HEADER_BYTES);
        return -1;
    }
    int32_t h[3];
    memcpy(h, header, sizeof(h)); // the header may not be aligned
    if (h[0] != TOKENFILE_MAGIC) {
        snprintf(err, errlen, "wrong magic number %d (expected %d): not a token file", h[0],
                 TOKENFILE_MAGIC);
        return -1;
    }
    if (h[1] != TOKENFILE_VERSION) {
        snprintf(err, errlen, "unsupported token file version %d (expected %d)", h[1],
                 TOKENFILE_VERSION);
        return -1;
    }
    if (h[2] < 0) {
        snprintf(err, errlen, "negative token count %d in the header", h[2]);
        return -1;
    }
    // h[2] < 2^31, so the expected size fits easily in 64 bits.
    unsigned long long expected = TOKENFILE_HEADER_BYTES + 2ull * (unsigned long long)h[2];
    if ((unsigned long long)file_bytes != expected) {
        snprintf(err, errlen, "%s: the header says %d tokens (%llu bytes with the header) but the file has %zu bytes",
                 file_bytes < expected ? "truncated" : "trailing bytes", h[2], expected, file_bytes);
        return -1;
    }
    *ntokens = h[2];
    return 0;
}

long long tokenfile_first_bad_token(const uint16_t* tokens, size_t n, int vocab_size) {
    for (size_t i = 0; i < n; i++)
        if ((int)tokens[i] >= vocab_size) return (long long)i;
    return -1;
}

uint16_t* tokenfile_read(const char* path, int vocab_size, size_t* ntokens) {
    long long bytes = file_size(path);
    FILE* f = xfopen(path, "rb");
    // A short file still gets a zero-padded header so that the parser reports the real problem.
    unsigned char header[TOKENFILE_HEADER_BYTES] = {0};
    size_t header_bytes = bytes < TOKENFILE_HEADER_BYTES ? (size_t)bytes : TOKENFILE_HEADER_BYTES;
    xfread(header, 1, header_bytes, f, path);
    long long n;
    char err[256];
    if (tokenfile_parse_header(header, (size_t)bytes, &n, err, sizeof(err)) != 0)
        fatal("%s: %s", path, err);
    uint16_t* tokens = xmalloc((size_t)n * sizeof(uint16_t), path);
    xfread(tokens, sizeof(uint16_t), (size_t)n, f, path);
    fclose(f);
    long long bad = tokenfile_first_bad_token(tokens, (size_t)n, vocab_size);
    if (bad >= 0)
        fatal("%s: token %d at index %lld (byte offset %lld) is outside the vocabulary of %d", path,
              tokens[bad], bad, TOKENFILE_HEADER_BYTES + 2 * bad, vocab_size);
    *ntokens = (size_t)n;
    return tokens;
}

struct TokenFileWriter {
    AtomicFile af;
    size_t ntokens;
};

TokenFileWriter* tokenfile_begin(const char* path) {
    TokenFileWriter* w = xcalloc(1, sizeof(TokenFileWriter), path);
    atomic_open(&w->af, path);
    int32_t placeholder[TOKENFILE_HEADER_INTS] = {0}; // overwritten by tokenfile_finish
    atomic_write(&w->af, placeholder, sizeof(placeholder));
    return w;
}

void tokenfile_append(TokenFileWriter* w, const uint16_t* tokens, size_t n) {
    if (n > (size_t)INT32_MAX - w->ntokens) {
        const char* path = w->af.final_path;
        atomic_discard(&w->af);
        fatal("%s: more than %d tokens do not fit in one token file; split them into shards", path,
              INT32_MAX);
    }
    atomic_write(&w->af, tokens, n * sizeof(uint16_t));
    w->ntokens += n;
}

size_t tokenfile_count(const TokenFileWriter* w) { return w->ntokens; }

void tokenfile_finish(TokenFileWriter* w) {
    int32_t header[TOKENFILE_HEADER_INTS] = {TOKENFILE_MAGIC, TOKENFILE_VERSION, (int32_t)w->ntokens};
    atomic_seek(&w->af, 0);
    atomic_write(&w->af, header, sizeof(header));
    atomic_commit(&w->af);
    free(w);
}

void tokenfile_discard(TokenFileWriter* w) {
    atomic_discard(&w->af);
    free(w);
}

void tokenfile_write(const char* path, const uint16_t* tokens, size_t ntokens) {
    TokenFileWriter* w = tokenfile_begin(path);
    tokenfile_append(w, tokens, ntokens);
    tokenfile_finish(w);
}
