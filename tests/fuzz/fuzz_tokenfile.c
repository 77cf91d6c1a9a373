// libFuzzer harness for the token-file header parser and the token check. Input: 8 bytes of file
// size, then up to 1024 header bytes (zero-padded when shorter), then tokens; 2 bytes of the size
// field double as the vocabulary size. Neither function may exit, crash or give an answer that
// contradicts the file size.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenfile.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 8) return 0;
    uint64_t file_bytes;
    memcpy(&file_bytes, data, 8);
    data += 8;
    size -= 8;
    unsigned char header[TOKENFILE_HEADER_BYTES] = {0};
    size_t header_part = size < sizeof(header) ? size : sizeof(header);
    memcpy(header, data, header_part);

    long long ntokens = -1;
    char err[256] = "";
    int rc = tokenfile_parse_header(header, (size_t)file_bytes, &ntokens, err, sizeof(err));
    if (rc == 0 && (ntokens < 0 || (uint64_t)ntokens * 2 + TOKENFILE_HEADER_BYTES != file_bytes)) __builtin_trap();
    if (rc != 0 && (rc != -1 || err[0] == 0)) __builtin_trap();

    size_t ntok = (size - header_part) / 2;
    uint16_t* tokens = (uint16_t*)malloc(ntok * sizeof(uint16_t) + 1);
    memcpy(tokens, data + header_part, ntok * sizeof(uint16_t));
    int vocab = (int)(file_bytes >> 48);
    long long bad = tokenfile_first_bad_token(tokens, ntok, vocab);
    if (bad >= (long long)ntok || (bad >= 0 && tokens[bad] < vocab)) __builtin_trap();
    for (long long i = 0; i < (bad < 0 ? (long long)ntok : bad); i++)
        if (tokens[i] >= vocab) __builtin_trap();
    free(tokens);
    return 0;
}
