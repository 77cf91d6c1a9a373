// llm.c's evaluation file of multiple-choice tasks such as HellaSwag, so that files made by llm.c's
// dev/data/hellaswag.py and by `prepare_data --hellaswag` work in both programs. The facts come from
// llm.c: dev/data/data_common.py (write_evalfile, which hellaswag.py calls) writes the file and
// llmc/dataloader.h (EvalLoader) reads it.
//   header: 256 little-endian int32: [0] = 20240522 (magic), [1] = 1 (version), [2] = the number of
//           examples, [3] = the longest example's length in bytes; the rest 0.
//   then every example as uint16 values: 65535 (the delimiter, so no token may be 65535), the
//   example's length in bytes (all of its values, this one and the delimiter included; below 2^16),
//   its index (0, 1, ...; fewer than 2^16 examples), the label (the right ending, 0..3), the number
//   of endings (4), the context's token count then its tokens, and for each ending its token count
//   then its tokens.
// hellaswag.py encodes the context as it is and each ending with a space before it (" " + ending),
// as GPT-2's tokenizer needs: the ending continues the context's last word.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HELLASWAG_MAGIC 20240522
#define HELLASWAG_VERSION 1
#define HELLASWAG_HEADER_INTS 256
#define HELLASWAG_HEADER_BYTES (HELLASWAG_HEADER_INTS * 4)
#define HELLASWAG_DELIMITER 65535
#define HELLASWAG_ENDINGS 4              // llm.c's EvalLoader takes exactly 4
#define HELLASWAG_MAX_EXAMPLES 65535     // write_evalfile: fewer than 2^16
#define HELLASWAG_MAX_EXAMPLE_BYTES 65534 // write_evalfile: below 2^16, and even

typedef struct {
    int label;                              // the right ending, 0..3
    int context_len;
    const uint16_t* context;
    int ending_len[HELLASWAG_ENDINGS];
    const uint16_t* ending[HELLASWAG_ENDINGS];
} HellaSwagExample;

typedef struct {
    int count;
    HellaSwagExample* examples; // their tokens point into data
    uint16_t* data;             // the file after the header
} HellaSwagFile;

// The bytes example takes in the file.
size_t hellaswag_example_bytes(const HellaSwagExample* ex);

// The positions of the model that the row of ending j of ex (context, then the ending) takes: every
// token but the ending's last, which is only predicted.
static inline int hellaswag_row_positions(const HellaSwagExample* ex, int j) {
    return ex->context_len + ex->ending_len[j] - 1;
}

// Checks a whole file in memory (n bytes) and, when it is good, fills hs (free it with
// hellaswag_free). Every field is checked: magic, version, the example count and longest length
// against the examples, each example's delimiter, length, index, label (0..3), 4 endings, non-empty
// context and endings, every token below vocab_size, and neither a truncated nor a longer file.
// Returns 0, or -1 with the first problem in err (without the file name), e.g. "example 12 (byte
// 3080): label 7 is not 0..3". Never exits.
int hellaswag_parse(const void* bytes, size_t n, int vocab_size, HellaSwagFile* hs, char* err, size_t errlen);
// Reads and checks path (as hellaswag_parse); exits naming the file and the problem.
void hellaswag_read(const char* path, int vocab_size, HellaSwagFile* hs);
void hellaswag_free(HellaSwagFile* hs);

// Writes count examples (example i gets index i) to path atomically (temporary file, fsync,
// rename). The caller keeps them within the format: at most HELLASWAG_MAX_EXAMPLES examples of at
// most HELLASWAG_MAX_EXAMPLE_BYTES each, 4 endings, tokens below 65535.
void hellaswag_write(const char* path, const HellaSwagExample* examples, int count);

#ifdef __cplusplus
}
#endif
