// libFuzzer harness for the JSONL line decoder: any bytes must be decoded or refused with a message,
// never read or write out of bounds (ASan), and a decoded text is never longer than the line; the
// same for an array of strings and an integer field.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/jsonl.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // An exact-size copy so that ASan catches a read one byte past the line.
    char* line = malloc(size ? size : 1);
    char* out = malloc(size ? size : 1);
    memcpy(line, data, size);
    size_t out_len = 0;
    char err[128] = "";
    int rc = jsonl_string_field(line, size, "text", out, &out_len, err, sizeof(err));
    if (rc == 0 ? out_len > size || err[0] != '\0' : rc != -1 || strncmp(err, "column ", 7) != 0) abort();
    // HellaSwag's fields: an array of strings whose decoded strings fit the line, and an integer.
    size_t lens[4], total = 0;
    int count = -1;
    err[0] = '\0';
    rc = jsonl_string_array_field(line, size, "endings", out, lens, 4, &count, err, sizeof(err));
    for (int i = 0; rc == 0 && i < count; i++) total += lens[i];
    if (rc == 0 ? count < 0 || count > 4 || total > size || err[0] != '\0'
                : rc != -1 || strncmp(err, "column ", 7) != 0) abort();
    char* scratch = malloc(5); // strlen("label") bytes exactly
    long long label;
    err[0] = '\0';
    rc = jsonl_integer_field(line, size, "label", scratch, &label, err, sizeof(err));
    if (rc == 0 ? err[0] != '\0' : rc != -1 || strncmp(err, "column ", 7) != 0) abort();
    free(scratch);
    free(out);
    free(line);
    return 0;
}
