// libFuzzer harness for the tokenizer: any bytes must encode to ids inside the vocabulary and decode
// back to exactly the same bytes. The GPT-2 vocabulary is loaded once from $FUZZ_VOCAB_DIR (an
// environment variable, as libFuzzer owns the command line; tests/run_cpu_tests.sh sets it).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/tokenizer.h"

static Tokenizer* tokenizer;

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    (void)argc, (void)argv;
    const char* vocab_dir = getenv("FUZZ_VOCAB_DIR");
    if (!vocab_dir || !vocab_dir[0])
        fatal("FUZZ_VOCAB_DIR is not set: point it at the directory holding encoder.json and vocab.bpe (data/gpt2)");
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
