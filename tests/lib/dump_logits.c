// dump_logits: the logits of a model file for the first tokens of a token file, for the tests of the
// Hugging Face import and export (tests/e2e/test_hf.sh against a float64 NumPy GPT-2, tests/gpu/test_hf_gpu.sh
// against transformers). Built against either backend like the trainers (tests/dump_logits_cpu like
// train_gpt_cpu, tests/dump_logits like train_gpt).
//
//   dump_logits MODEL TOKENS N OUT
//
// One forward over the first N tokens of TOKENS (B 1, T N); OUT gets the logits of every position,
// N x V fp32 (the real vocabulary, not the padded one), row after row, and nothing else.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "checkpoints/checkpoint.h"
#include "common/util.h"
#include "data/tokenfile.h"
#include "model/gpt2.h"

int main(int argc, char** argv) {
    if (argc != 5) fatal("usage: dump_logits MODEL TOKENS N OUT");
    char* end;
    errno = 0;
    long n = strtol(argv[3], &end, 10);
    if (errno || *end || n < 1) fatal("N: '%s' is not a whole number >= 1", argv[3]);
    GPT2Config cfg;
    size_t nparams, ntokens;
    float* weights = model_file_read(argv[1], &cfg, &nparams);
    uint16_t* file_tokens = tokenfile_read(argv[2], cfg.vocab_size, &ntokens);
    if ((size_t)n > ntokens) fatal("%s: %zu tokens, fewer than N %ld", argv[2], ntokens, n);
    if (n > cfg.max_seq_len) fatal("N %ld is above the model's maximum T %d (%s)", n, cfg.max_seq_len, argv[1]);
    int T = (int)n, V = cfg.vocab_size;
    backend_init(0);
    comm_init(0, 1, NULL, 10.0);
    GPT2 model;
    gpt2_build_forward_only(&model, &cfg, 1, T);
    gpt2_set_weights(&model, weights);
    int* tokens = xmalloc((size_t)T * sizeof(int), "tokens");
    for (int t = 0; t < T; t++) tokens[t] = file_tokens[t];
    gpt2_forward(&model, tokens, NULL, 1, T, 0.0f);
    float* logits = xmalloc((size_t)V * sizeof(float), "logits");
    FILE* f = xfopen(argv[4], "wb");
    for (int t = 0; t < T; t++) {
        gpt2_logits_row(&model, 0, t, T, logits);
        if (fwrite(logits, sizeof(float), (size_t)V, f) != (size_t)V) fatal("%s: write failed", argv[4]);
    }
    if (fclose(f) != 0) fatal("%s: write failed", argv[4]);
    gpt2_free(&model);
    free(logits);
    free(tokens);
    free(file_tokens);
    free(weights);
    comm_free();
    return 0;
}
