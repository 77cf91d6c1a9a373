// libFuzzer harness for the JSONL line decoder: any bytes must be decoded or refused with a message,
// never read or write out of bounds (ASan), and a decoded text is never longer than the line.
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
    free(out);
    free(line);
    return 0;
}
