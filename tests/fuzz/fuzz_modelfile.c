// libFuzzer harness for the header parsers of model files and training states. Input: 8 bytes of
// file size (any value, negative included), then up to 1024 header bytes, zero-padded when shorter;
// the model-file parser reads all 1024, the training-state parser the first 512. A parser may not
// exit or crash, and an accepted header must describe a possible file of exactly that size.
#include <stdint.h>
#include <string.h>

#include "checkpoints/checkpoint.h"

static void check_model_header(const int32_t header[256], int64_t file_bytes) {
    GPT2Config cfg;
    int version = 0;
    char err[512] = "";
    if (model_file_parse_header(header, file_bytes, &cfg, &version, err, sizeof(err)) != 0) {
        if (err[0] == 0) __builtin_trap();
        return;
    }
    if (gpt2_config_problem(&cfg) != NULL) __builtin_trap();
    if (version != MODEL_FILE_VERSION_FP32 && version != MODEL_FILE_VERSION_BF16) __builtin_trap();
    size_t sizes[NUM_PARAMETER_TENSORS];
    size_t nparams = gpt2_parameter_sizes(&cfg, sizes);
    size_t bytes_per_param = version == MODEL_FILE_VERSION_FP32 ? 4 : 2;
    if ((uint64_t)file_bytes != 1024 + nparams * bytes_per_param) __builtin_trap();
}

static void check_state_header(const int64_t header[TRAIN_STATE_HEADER_INTS], int64_t file_bytes) {
    TrainState st;
    char err[512] = "";
    if (train_state_parse_header(header, file_bytes, &st, err, sizeof(err)) != 0) {
        if (err[0] == 0) __builtin_trap();
        return;
    }
    if (gpt2_config_problem(&st.config) != NULL) __builtin_trap();
    size_t sizes[NUM_PARAMETER_TENSORS];
    if (st.nparams != gpt2_parameter_sizes(&st.config, sizes)) __builtin_trap();
    if (st.opt_offset + st.opt_count > st.nparams) __builtin_trap();
    // the divergence guard's fields: updates <= last applied step <= step, a history within its window
    if (st.updates < 0 || st.updates > st.last_applied || st.last_applied > st.step) __builtin_trap();
    if (st.history.count < 0 || st.history.count > STEP_HISTORY || st.history.count > st.updates) __builtin_trap();
    // version 3 ends with the checksums of the three arrays, 4 bytes per parameter tensor
    uint64_t checksums = header[1] >= 3 ? 3 * 4 * NUM_PARAMETER_TENSORS : 0;
    if ((uint64_t)file_bytes != 512 + 2 * STEP_HISTORY * 4 + 3 * 4 * (uint64_t)st.opt_count + checksums)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 8) return 0;
    int64_t file_bytes;
    memcpy(&file_bytes, data, 8);
    int32_t header[256] = {0};
    memcpy(header, data + 8, size - 8 < sizeof(header) ? size - 8 : sizeof(header));
    check_model_header(header, file_bytes);
    int64_t state_header[TRAIN_STATE_HEADER_INTS];
    memcpy(state_header, header, sizeof(state_header));
    check_state_header(state_header, file_bytes);
    return 0;
}
