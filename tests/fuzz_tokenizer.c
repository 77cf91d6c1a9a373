// libFuzzer harness for the tokenizer: any bytes must encode to ids inside the vocabulary and decode
// back to exactly the same bytes. The GPT-2 vocabulary is loaded once from $GPT_DATA_DIR/gpt2.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/tokenizer.h"

static Tokenizer* tokenizer;

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    (void)argc, (void)argv;
    const char* data_dir = getenv("GPT_DATA_DIR");
    if (!data_dir || !data_dir[0])
        fatal("GPT_DATA_DIR is not set: point it at the directory holding gpt2/encoder.json and gpt2/vocab.bpe");
    char vocab_dir[4096];
    snprintf(vocab_dir, sizeof(vocab_dir), "%s/gpt2", data_dir);
    tokenizer = tokenizer_load(vocab_dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    size_t ntokens, decoded_len;
    int* ids = tokenizer_encode(tokenizer, (const char*)data, size, &ntokens);
    if (ntokens > size) abort(); // every token holds at least one byte
    for (size_t i = 0; i < ntokens; i++)
        if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(tokenizer)) abort();
    char* decoded = tokenizer_decode(tokenizer, ids, ntokens, &decoded_len);
    if (decoded_len != size || memcmp(decoded, data, size) != 0) abort();
    free(decoded);
    free(ids);
    return 0;
}
