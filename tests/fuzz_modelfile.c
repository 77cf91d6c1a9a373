// libFuzzer harness for the model-file header parser. Input: 8 bytes of file size (any value,
// negative included), then up to 1024 header bytes, zero-padded when shorter. The parser may not
// exit or crash, and an accepted header must describe a possible model of exactly that file size.
#include <stdint.h>
#include <string.h>

#include "../checkpoints/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 8) return 0;
    int64_t file_bytes;
    memcpy(&file_bytes, data, 8);
    int32_t header[256] = {0};
    memcpy(header, data + 8, size - 8 < sizeof(header) ? size - 8 : sizeof(header));

    GPT2Config cfg;
    int version = 0;
    char err[512] = "";
    if (model_file_parse_header(header, file_bytes, &cfg, &version, err, sizeof(err)) != 0) {
        if (err[0] == 0) __builtin_trap();
        return 0;
    }
    if (gpt2_config_problem(&cfg) != NULL) __builtin_trap();
    if (version != MODEL_FILE_VERSION_FP32 && version != MODEL_FILE_VERSION_BF16) __builtin_trap();
    size_t sizes[NUM_PARAMETER_TENSORS];
    size_t nparams = gpt2_parameter_sizes(&cfg, sizes);
    size_t bytes_per_param = version == MODEL_FILE_VERSION_FP32 ? 4 : 2;
    if ((uint64_t)file_bytes != 1024 + nparams * bytes_per_param) __builtin_trap();
    return 0;
}
