// Model files in llm.c's format: a header of 256 int32, then every parameter, fp32 or bf16.
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "checkpoints/checkpoint.h"

// Headers and parameters are read and written as raw memory: the file's byte order only on a
// little-endian host.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "model files need a little-endian host");

#define MODEL_HEADER_BYTES (256 * 4)

int model_file_parse_header(const int32_t header[256], long long file_bytes, GPT2Config* cfg,
                            int* version, char* err, size_t errlen) {
    if (file_bytes < MODEL_HEADER_BYTES) {
        snprintf(err, errlen, "the file has %lld bytes, too short for the %d-byte header of a model file",
                 file_bytes, MODEL_HEADER_BYTES);
        return -1;
    }
    if (header[0] != MODEL_FILE_MAGIC) {
        snprintf(err, errlen, "wrong magic number %d (expected %d): not a model file", header[0],
                 MODEL_FILE_MAGIC);
        return -1;
    }
    if (header[1] != MODEL_FILE_VERSION_FP32 && header[1] != MODEL_FILE_VERSION_BF16) {
        snprintf(err, errlen, "unsupported model file version %d (expected %d for fp32 or %d for bf16)",
                 header[1], MODEL_FILE_VERSION_FP32, MODEL_FILE_VERSION_BF16);
        return -1;
    }
    GPT2Config c = {.max_seq_len = header[2], .vocab_size = header[3], .num_layers = header[4],
                    .num_heads = header[5], .channels = header[6], .padded_vocab_size = header[7]};
    const char* problem = gpt2_config_problem(&c);
    if (problem) {
        snprintf(err, errlen, "impossible sizes in the header (maxT %d, V %d, L %d, NH %d, C %d, Vp %d): %s",
                 c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads, c.channels,
                 c.padded_vocab_size, problem);
        return -1;
    }
    // gpt2_config_problem bounds every size, so the count (below 2^47) and bytes cannot overflow.
    size_t sizes[NUM_PARAMETER_TENSORS];
    size_t nparams = gpt2_parameter_sizes(&c, sizes);
    size_t bytes_per_param = header[1] == MODEL_FILE_VERSION_FP32 ? 4 : 2;
    long long expected = MODEL_HEADER_BYTES + (long long)(nparams * bytes_per_param);
    if (file_bytes != expected) {
        snprintf(err, errlen, "%s: the header's sizes give %zu parameters (%lld bytes with the header) but the file has %lld bytes",
                 file_bytes < expected ? "truncated" : "trailing bytes", nparams, expected, file_bytes);
        return -1;
    }
    *cfg = c;
    *version = header[1];
    return 0;
}

float* model_file_read(const char* path, GPT2Config* cfg, size_t* nparams) {
    long long bytes = file_size(path);
    FILE* f = xfopen(path, "rb");
    // A short file still gets a zero-padded header so that the parser reports the real problem.
    int32_t header[256] = {0};
    xfread(header, 1, bytes < MODEL_HEADER_BYTES ? (size_t)bytes : MODEL_HEADER_BYTES, f, path);
    int version;
    char err[512];
    if (model_file_parse_header(header, bytes, cfg, &version, err, sizeof(err)) != 0)
        fatal("%s: %s", path, err);
    size_t sizes[NUM_PARAMETER_TENSORS];
    size_t n = gpt2_parameter_sizes(cfg, sizes);
    float* params = xmalloc(n * sizeof(float), "model parameters");
    if (version == MODEL_FILE_VERSION_FP32) {
        xfread(params, sizeof(float), n, f, path);
    } else {
        // bf16 is the top half of an fp32: widen in pieces to avoid a second full-size buffer.
        enum { PIECE = 1 << 16 };
        uint16_t* piece = xmalloc(PIECE * sizeof(uint16_t), "bf16 read buffer");
        for (size_t start = 0; start < n; start += PIECE) {
            size_t count = n - start < PIECE ? n - start : PIECE;
            xfread(piece, sizeof(uint16_t), count, f, path);
            for (size_t i = 0; i < count; i++) {
                uint32_t bits = (uint32_t)piece[i] << 16;
                memcpy(&params[start + i], &bits, sizeof(float));
            }
        }
        free(piece);
    }
    fclose(f);
    *nparams = n;
    return params;
}

void model_file_write(const char* path, const GPT2Config* cfg, const float* params) {
    const char* problem = gpt2_config_problem(cfg);
    if (problem) fatal("cannot write %s: impossible model configuration: %s", path, problem);
    int32_t header[256] = {MODEL_FILE_MAGIC, MODEL_FILE_VERSION_FP32, cfg->max_seq_len,
                           cfg->vocab_size, cfg->num_layers, cfg->num_heads, cfg->channels,
                           cfg->padded_vocab_size};
    size_t sizes[NUM_PARAMETER_TENSORS];
    size_t n = gpt2_parameter_sizes(cfg, sizes);
    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, header, sizeof(header));
    atomic_write(&af, params, n * sizeof(float));
    atomic_commit(&af);
}
