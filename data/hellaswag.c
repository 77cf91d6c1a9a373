// llm.c's evaluation file (see hellaswag.h for the layout and where its facts come from).
#include "data/hellaswag.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic_file.h"
#include "common/util.h"

// The header and the values are read and written as raw memory: the file's byte order only on a
// little-endian host.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "HellaSwag files need a little-endian host");

// The fixed values at an example's start: delimiter, length, index, label, number of endings.
#define EXAMPLE_FIELDS 5

size_t hellaswag_example_bytes(const HellaSwagExample* ex) {
    size_t values = EXAMPLE_FIELDS + 1 + (size_t)ex->context_len;
    for (int j = 0; j < HELLASWAG_ENDINGS; j++) values += 1 + (size_t)ex->ending_len[j];
    return 2 * values;
}

static int problem(char* err, size_t errlen, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static int problem(char* err, size_t errlen, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

// Reads a count and that many tokens of example i (what names them in messages) from data[*at],
// within the example's end; checks the tokens against the vocabulary.
static int read_tokens(const uint16_t* data, size_t* at, size_t end, int i, const char* what, int vocab_size,
                       int* len, const uint16_t** tokens, char* err, size_t errlen) {
    size_t byte = HELLASWAG_HEADER_BYTES + 2 * *at;
    if (*at >= end)
        return problem(err, errlen, "example %d (byte %zu): its length ends before the token count of %s", i, byte, what);
    *len = data[(*at)++];
    if (*len == 0) return problem(err, errlen, "example %d (byte %zu): %s has no tokens", i, byte, what);
    if ((size_t)*len > end - *at)
        return problem(err, errlen, "example %d (byte %zu): %s has %d tokens, more than the example's length leaves",
                       i, byte, what, *len);
    *tokens = data + *at;
    for (int t = 0; t < *len; t++)
        if ((*tokens)[t] >= vocab_size)
            return problem(err, errlen, "example %d: token %d of %s (byte %zu) is %u, outside the vocabulary of %d tokens",
                           i, t, what, HELLASWAG_HEADER_BYTES + 2 * (*at + (size_t)t), (*tokens)[t], vocab_size);
    *at += (size_t)*len;
    return 0;
}

// Checks example i at data[*at] (of n values) and moves *at past it.
static int parse_example(const uint16_t* data, size_t n, size_t* at, int i, int vocab_size, int longest,
                         HellaSwagExample* ex, char* err, size_t errlen) {
    size_t start = *at, byte = HELLASWAG_HEADER_BYTES + 2 * start;
    if (n - start < EXAMPLE_FIELDS)
        return problem(err, errlen, "truncated: the file ends at byte %zu, in example %d (byte %zu)",
                       HELLASWAG_HEADER_BYTES + 2 * n, i, byte);
    const uint16_t* f = data + start;
    if (f[0] != HELLASWAG_DELIMITER)
        return problem(err, errlen, "example %d (byte %zu): %u where the delimiter %d starts an example",
                       i, byte, f[0], HELLASWAG_DELIMITER);
    if (f[1] % 2 != 0 || f[1] < 2 * (EXAMPLE_FIELDS + 1))
        return problem(err, errlen, "example %d (byte %zu): length %u bytes is impossible", i, byte, f[1]);
    if (f[1] > longest)
        return problem(err, errlen, "example %d (byte %zu): %u bytes, more than the header's longest example of %d",
                       i, byte, f[1], longest);
    size_t end = start + f[1] / 2;
    if (end > n)
        return problem(err, errlen, "truncated: example %d (byte %zu) is %u bytes, but the file ends at byte %zu",
                       i, byte, f[1], HELLASWAG_HEADER_BYTES + 2 * n);
    if (f[2] != i) return problem(err, errlen, "example %d (byte %zu): index %u, expected %d", i, byte, f[2], i);
    if (f[3] >= HELLASWAG_ENDINGS)
        return problem(err, errlen, "example %d (byte %zu): label %u is not 0..%d", i, byte, f[3], HELLASWAG_ENDINGS - 1);
    if (f[4] != HELLASWAG_ENDINGS)
        return problem(err, errlen, "example %d (byte %zu): %u endings, but llm.c's format has %d", i, byte, f[4],
                       HELLASWAG_ENDINGS);
    ex->label = f[3];
    *at = start + EXAMPLE_FIELDS;
    if (read_tokens(data, at, end, i, "the context", vocab_size, &ex->context_len, &ex->context, err, errlen)) return -1;
    for (int j = 0; j < HELLASWAG_ENDINGS; j++) {
        char what[32];
        snprintf(what, sizeof what, "ending %d", j);
        if (read_tokens(data, at, end, i, what, vocab_size, &ex->ending_len[j], &ex->ending[j], err, errlen)) return -1;
    }
    if (*at != end)
        return problem(err, errlen, "example %d (byte %zu): its length says %u bytes, its context and endings take %zu",
                       i, byte, f[1], 2 * (*at - start));
    return 0;
}

int hellaswag_parse(const void* bytes, size_t n, int vocab_size, HellaSwagFile* hs, char* err, size_t errlen) {
    memset(hs, 0, sizeof *hs);
    if (n < HELLASWAG_HEADER_BYTES)
        return problem(err, errlen, "the file has %zu bytes, too short for the %d-byte header of a HellaSwag file",
                       n, HELLASWAG_HEADER_BYTES);
    int32_t h[4];
    memcpy(h, bytes, sizeof h); // bytes may not be aligned
    if (h[0] != HELLASWAG_MAGIC)
        return problem(err, errlen, "wrong magic number %d (expected %d): not a HellaSwag file (llm.c's evaluation format)",
                       h[0], HELLASWAG_MAGIC);
    if (h[1] != HELLASWAG_VERSION)
        return problem(err, errlen, "unsupported HellaSwag file version %d (expected %d)", h[1], HELLASWAG_VERSION);
    if (h[2] < 1 || h[2] > HELLASWAG_MAX_EXAMPLES)
        return problem(err, errlen, "the header says %d examples (1 to %d)", h[2], HELLASWAG_MAX_EXAMPLES);
    if (h[3] < 1 || h[3] > HELLASWAG_MAX_EXAMPLE_BYTES)
        return problem(err, errlen, "the header says the longest example is %d bytes (1 to %d)", h[3],
                       HELLASWAG_MAX_EXAMPLE_BYTES);
    size_t values = (n - HELLASWAG_HEADER_BYTES) / 2;
    // An aligned copy that the examples point into.
    uint16_t* data = malloc(values ? values * sizeof(uint16_t) : 1);
    HellaSwagExample* examples = malloc((size_t)h[2] * sizeof(HellaSwagExample));
    if (!data || !examples) {
        free(data);
        free(examples);
        return problem(err, errlen, "out of host memory for a file of %zu bytes", n);
    }
    memcpy(data, (const char*)bytes + HELLASWAG_HEADER_BYTES, values * sizeof(uint16_t));
    size_t at = 0;
    int longest = 0, rc = 0;
    for (int i = 0; i < h[2] && rc == 0; i++) {
        rc = parse_example(data, values, &at, i, vocab_size, h[3], &examples[i], err, errlen);
        if (rc == 0 && (int)hellaswag_example_bytes(&examples[i]) > longest)
            longest = (int)hellaswag_example_bytes(&examples[i]);
    }
    if (rc == 0 && (at != values || (n - HELLASWAG_HEADER_BYTES) % 2 != 0))
        rc = problem(err, errlen, "%zu bytes after the last of the header's %d examples (byte %zu)",
                     n - HELLASWAG_HEADER_BYTES - 2 * at, h[2], HELLASWAG_HEADER_BYTES + 2 * at);
    if (rc == 0 && longest != h[3])
        rc = problem(err, errlen, "the header says the longest example is %d bytes, but it is %d", h[3], longest);
    if (rc != 0) {
        free(data);
        free(examples);
        return -1;
    }
    hs->count = h[2];
    hs->examples = examples;
    hs->data = data;
    return 0;
}

void hellaswag_read(const char* path, int vocab_size, HellaSwagFile* hs) {
    size_t n;
    char* bytes = read_whole_file(path, &n);
    char err[512];
    int rc = hellaswag_parse(bytes, n, vocab_size, hs, err, sizeof err);
    free(bytes);
    if (rc != 0) fatal("%s: %s", path, err);
}

void hellaswag_free(HellaSwagFile* hs) {
    free(hs->examples);
    free(hs->data);
    memset(hs, 0, sizeof *hs);
}

void hellaswag_write(const char* path, const HellaSwagExample* examples, int count) {
    int32_t header[HELLASWAG_HEADER_INTS] = {HELLASWAG_MAGIC, HELLASWAG_VERSION, count, 0};
    for (int i = 0; i < count; i++) {
        int bytes = (int)hellaswag_example_bytes(&examples[i]);
        if (bytes > header[3]) header[3] = bytes;
    }
    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, header, sizeof header);
    for (int i = 0; i < count; i++) {
        const HellaSwagExample* ex = &examples[i];
        uint16_t fields[EXAMPLE_FIELDS + 1] = {HELLASWAG_DELIMITER, (uint16_t)hellaswag_example_bytes(ex),
                                               (uint16_t)i, (uint16_t)ex->label, HELLASWAG_ENDINGS,
                                               (uint16_t)ex->context_len};
        atomic_write(&af, fields, sizeof fields);
        atomic_write(&af, ex->context, (size_t)ex->context_len * sizeof(uint16_t));
        for (int j = 0; j < HELLASWAG_ENDINGS; j++) {
            uint16_t len = (uint16_t)ex->ending_len[j];
            atomic_write(&af, &len, sizeof len);
            atomic_write(&af, ex->ending[j], (size_t)len * sizeof(uint16_t));
        }
    }
    atomic_commit(&af);
}
