// Model files in llm.c's format: a header of 256 int32, then every parameter, fp32 or bf16.
//
// Checksums live in header slots that llm.c leaves zero and never reads (it reads [0..7], then the
// parameters by their sizes), so llm.c reads our files as they are: [8] MODEL_FILE_CRC_MARK,
// [9] the CRC-32C of the 1024 header bytes with [9] zero, [10 + i] the CRC-32C of parameter tensor
// i's bytes as stored. A file whose [8] is zero (llm.c's, or a converter's) has no checksums.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/util.h"
#include "checkpoints/checkpoint.h"

// Headers and parameters are read and written as raw memory: the file's byte order only on a
// little-endian host.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "model files need a little-endian host");

#define MODEL_HEADER_BYTES (256 * 4)
enum { H_CRC_MARK = 8, H_HEADER_CRC = 9, H_TENSOR_CRC = 10 };
_Static_assert(H_TENSOR_CRC + NUM_PARAMETER_TENSORS <= 256, "the header has room for the checksums");

// The CRC-32C of a header, taken with its own checksum slot zero.
static uint32_t header_crc(const int32_t header[256]) {
    int32_t h[256];
    memcpy(h, header, sizeof(h));
    h[H_HEADER_CRC] = 0;
    return crc32c(0, h, sizeof(h));
}

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
    if (header[H_CRC_MARK] != 0 && header[H_CRC_MARK] != MODEL_FILE_CRC_MARK) {
        snprintf(err, errlen, "header slot 8 holds %d: neither 0 (no checksums) nor %d (checksums)",
                 header[H_CRC_MARK], MODEL_FILE_CRC_MARK);
        return -1;
    }
    if (header[H_CRC_MARK] == MODEL_FILE_CRC_MARK && (uint32_t)header[H_HEADER_CRC] != header_crc(header)) {
        snprintf(err, errlen, "checksum mismatch in the header: the file is damaged");
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

void checkpoint_tensor_crcs(const GPT2Config* cfg, const float* values, size_t offset, size_t count,
                            uint32_t crc[NUM_PARAMETER_TENSORS]) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(cfg, sizes);
    const size_t end_all = offset + count;
    // One thread: a child forked after an OpenMP region of its parent hangs in its own (libgomp), and
    // the tests fork writers. At about 5 GB/s that is a tenth of a checkpoint's save time.
    for (size_t t = 0, start = 0; t < NUM_PARAMETER_TENSORS; start += sizes[t++]) {
        const size_t end = start + sizes[t];
        const size_t lo = start > offset ? start : offset, hi = end < end_all ? end : end_all;
        crc[t] = lo < hi ? crc32c(0, values + (lo - offset), (hi - lo) * sizeof(float)) : 0;
    }
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
    uint32_t crc[NUM_PARAMETER_TENSORS]; // of each tensor's bytes as stored
    if (version == MODEL_FILE_VERSION_FP32) {
        xfread(params, sizeof(float), n, f, path);
        checkpoint_tensor_crcs(cfg, params, 0, n, crc);
    } else {
        // bf16 is the top half of an fp32: widen in pieces to avoid a second full-size buffer.
        enum { PIECE = 1 << 16 };
        uint16_t* piece = xmalloc(PIECE * sizeof(uint16_t), "bf16 read buffer");
        for (size_t t = 0, start = 0; t < NUM_PARAMETER_TENSORS; t++) {
            crc[t] = 0;
            for (size_t end = start + sizes[t]; start < end;) {
                size_t count = end - start < PIECE ? end - start : PIECE;
                xfread(piece, sizeof(uint16_t), count, f, path);
                crc[t] = crc32c(crc[t], piece, count * sizeof(uint16_t));
                for (size_t i = 0; i < count; i++) {
                    uint32_t bits = (uint32_t)piece[i] << 16;
                    memcpy(&params[start + i], &bits, sizeof(float));
                }
                start += count;
            }
        }
        free(piece);
    }
    fclose(f);
    char problem[256] = "";
    int tensor;
    size_t index;
    for (int t = 0; t < NUM_PARAMETER_TENSORS && header[H_CRC_MARK] != 0 && !problem[0]; t++)
        if (crc[t] != (uint32_t)header[H_TENSOR_CRC + t])
            snprintf(problem, sizeof problem, "checksum mismatch in tensor %s: the file is damaged",
                     parameter_tensor_names[t]);
    if (!problem[0] && gpt2_find_nonfinite(cfg, params, 0, n, &tensor, &index))
        snprintf(problem, sizeof problem, "a non-finite value in tensor %s at index %zu",
                 parameter_tensor_names[tensor], index);
    if (problem[0]) {
        free(params); // LeakSanitizer checks at the exit
        fatal("%s: %s", path, problem);
    }
    *nparams = n;
    return params;
}

void model_file_write(const char* path, const GPT2Config* cfg, const float* params) {
    const char* problem = gpt2_config_problem(cfg);
    if (problem) fatal("cannot write %s: impossible model configuration: %s", path, problem);
    int32_t header[256] = {MODEL_FILE_MAGIC, MODEL_FILE_VERSION_FP32, cfg->max_seq_len,
                           cfg->vocab_size, cfg->num_layers, cfg->num_heads, cfg->channels,
                           cfg->padded_vocab_size, MODEL_FILE_CRC_MARK};
    size_t sizes[NUM_PARAMETER_TENSORS];
    size_t n = gpt2_parameter_sizes(cfg, sizes);
    uint32_t crc[NUM_PARAMETER_TENSORS];
    checkpoint_tensor_crcs(cfg, params, 0, n, crc);
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) header[H_TENSOR_CRC + t] = (int32_t)crc[t];
    header[H_HEADER_CRC] = (int32_t)header_crc(header);
    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, header, sizeof(header));
    atomic_write(&af, params, n * sizeof(float));
    atomic_commit(&af);
}
