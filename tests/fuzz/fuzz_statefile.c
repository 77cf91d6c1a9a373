// libFuzzer harness for the whole training-state reader (train_state_load_stream: header, history,
// arrays, checksums, finiteness) on any bytes. Input: the first byte chooses how the rest is used.
// Odd: the rest is the file. Even: the rest is a list of 3-byte edits (16-bit offset, new byte) of a
// valid state of a tiny model (with a ZeRO shard that starts and ends inside tensors), and the file
// is cut to the last edit's offset when the first byte is a multiple of 4, so that the fuzzer reaches
// the checksums and values behind the header that random bytes never pass. The reader may not exit
// or crash; a state it accepts must be consistent and finite; and an edited file whose changed bytes
// lie within 4 of each other must be refused (CRC-32C detects every burst of up to 32 bits).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoints/checkpoint.h"
#include "common/util.h"

static unsigned char* valid;
static size_t valid_size;

// Writes a valid state once with the writer itself, and keeps its bytes.
static void make_valid(void) {
    GPT2Config cfg = {.max_seq_len = 2, .vocab_size = 3, .padded_vocab_size = 4, .num_layers = 1,
                      .num_heads = 1, .channels = 2};
    size_t sizes[NUM_PARAMETER_TENSORS];
    size_t n = gpt2_parameter_sizes(&cfg, sizes);
    TrainState st = {.config = cfg, .step = 9, .updates = 7, .last_applied = 8, .sample_rng = 42, .rank = 0,
                     .world = 1, .nparams = n, .opt_offset = 5, .opt_count = n - 9,
                     .loss_scale = 1024.0, .scale_clean_steps = 3, .overflow_skips = 1};
    st.history.count = 3;
    for (int i = 0; i < 3; i++) st.history.loss[i] = st.history.norm[i] = 1.0f + (float)i;
    st.loader = (DataLoaderState){.B = 1, .T = 2, .world = 1};
    float* values = xmalloc(3 * n * sizeof(float), "values");
    for (size_t i = 0; i < 3 * n; i++) values[i] = 0.01f * (float)i;
    st.master = values, st.m = values + n, st.v = values + 2 * n;
    char path[] = "/tmp/fuzz_statefile_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) __builtin_trap();
    close(fd);
    train_state_write(path, &st);
    FILE* f = fopen(path, "rb");
    valid_size = (size_t)file_size(path);
    valid = xmalloc(valid_size, "valid state");
    if (!f || fread(valid, 1, valid_size, f) != valid_size) __builtin_trap();
    fclose(f);
    unlink(path);
    free(values);
}

static void check_accepted(const TrainState* st) {
    if (gpt2_config_problem(&st->config) != NULL) __builtin_trap();
    size_t sizes[NUM_PARAMETER_TENSORS];
    if (st->nparams != gpt2_parameter_sizes(&st->config, sizes)) __builtin_trap();
    if (st->opt_offset + st->opt_count > st->nparams) __builtin_trap();
    if (st->updates < 0 || st->updates > st->last_applied || st->last_applied > st->step) __builtin_trap();
    if (st->history.count < 0 || st->history.count > STEP_HISTORY || st->history.count > st->updates) __builtin_trap();
    if (st->loss_scale != 0.0 && !(st->loss_scale >= 1.0 && st->loss_scale <= 16777216.0)) __builtin_trap();
    if (st->scale_clean_steps < 0 || st->overflow_skips < 0 || st->overflow_skips > st->step - st->last_applied)
        __builtin_trap();
    for (size_t i = 0; i < st->opt_count; i++)
        if (!isfinite(st->master[i]) || !isfinite(st->m[i]) || !isfinite(st->v[i])) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (!valid) make_valid();
    if (size < 1) return 0;
    unsigned char* file;
    size_t file_size_ = size - 1;
    size_t first_change = SIZE_MAX, last_change = 0;
    if (data[0] & 1) {
        file = xmalloc(file_size_ + 1, "file");
        memcpy(file, data + 1, file_size_);
    } else {
        file = xmalloc(valid_size + 1, "file");
        memcpy(file, valid, valid_size);
        file_size_ = valid_size;
        for (size_t i = 1; i + 3 <= size; i += 3) {
            size_t at = ((size_t)data[i] | (size_t)data[i + 1] << 8) % valid_size;
            file[at] = data[i + 2];
            if (data[0] % 4 == 0) file_size_ = at;
        }
        for (size_t i = 0; i < valid_size; i++)
            if (i >= file_size_ || file[i] != valid[i]) {
                if (first_change == SIZE_MAX) first_change = i;
                last_change = i;
            }
    }
    FILE* f = fmemopen(file, file_size_ ? file_size_ : 1, "rb");
    if (!f) __builtin_trap();
    TrainState st;
    char err[512] = "";
    int rc = train_state_load_stream(f, (long long)file_size_, &st, err, sizeof(err));
    fclose(f);
    if (rc != 0) {
        if (err[0] == 0) __builtin_trap();
    } else {
        check_accepted(&st);
        if (first_change != SIZE_MAX && last_change - first_change < 4) __builtin_trap();
        train_state_free(&st);
    }
    free(file);
    return 0;
}
