// The training state: everything a bit-exact resume needs besides the model file.
//
// Layout: a header of 64 little-endian int64 (fields at the indices below, the rest zero), then
// opt_count fp32 master weights, opt_count fp32 AdamW m, opt_count fp32 AdamW v.
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "checkpoint.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "state files need a little-endian host");

enum {
    H_MAGIC, H_VERSION,
    H_MAX_SEQ_LEN, H_VOCAB, H_PADDED_VOCAB, H_LAYERS, H_HEADS, H_CHANNELS,
    H_STEP, H_SAMPLE_RNG, H_RANK, H_WORLD,
    H_LOADER_EPOCH, H_LOADER_SHARD, H_LOADER_ROUND, H_LOADER_SEED, H_LOADER_SHUFFLE,
    H_LOADER_B, H_LOADER_T, H_LOADER_RANK, H_LOADER_WORLD,
    H_NPARAMS, H_OPT_OFFSET, H_OPT_COUNT,
    H_FIELDS,
    HEADER_INTS = 64
};
_Static_assert(H_FIELDS <= HEADER_INTS, "the state header has room for every field");

// A reason the state cannot be right, or NULL; checked before writing and after reading.
static const char* state_problem(const TrainState* st) {
    const char* problem = gpt2_config_problem(&st->config);
    if (problem) return problem;
    size_t sizes[NUM_PARAMETER_TENSORS];
    if (st->nparams != gpt2_parameter_sizes(&st->config, sizes))
        return "the parameter count does not match the model configuration";
    if (st->opt_count > st->nparams || st->opt_offset > st->nparams - st->opt_count)
        return "the optimizer range [opt_offset, opt_offset + opt_count) exceeds the parameters";
    if (st->step < 0) return "negative step";
    if (st->world < 1 || st->rank < 0 || st->rank >= st->world) return "rank is not in 0..world-1";
    const DataLoaderState* l = &st->loader;
    if (l->B < 1 || l->T < 1 || l->world < 1 || l->rank < 0 || l->rank >= l->world)
        return "impossible data loader sizes";
    if (l->epoch < 0 || l->shard_index < 0 || l->round < 0) return "negative data loader position";
    return NULL;
}

void train_state_write(const char* path, const TrainState* st) {
    const char* problem = state_problem(st);
    if (problem) fatal("cannot write %s: inconsistent training state: %s", path, problem);
    int64_t h[HEADER_INTS] = {0};
    h[H_MAGIC] = TRAIN_STATE_MAGIC;
    h[H_VERSION] = TRAIN_STATE_VERSION;
    h[H_MAX_SEQ_LEN] = st->config.max_seq_len;
    h[H_VOCAB] = st->config.vocab_size;
    h[H_PADDED_VOCAB] = st->config.padded_vocab_size;
    h[H_LAYERS] = st->config.num_layers;
    h[H_HEADS] = st->config.num_heads;
    h[H_CHANNELS] = st->config.channels;
    h[H_STEP] = st->step;
    h[H_SAMPLE_RNG] = (int64_t)st->sample_rng;
    h[H_RANK] = st->rank;
    h[H_WORLD] = st->world;
    h[H_LOADER_EPOCH] = st->loader.epoch;
    h[H_LOADER_SHARD] = st->loader.shard_index;
    h[H_LOADER_ROUND] = st->loader.round;
    h[H_LOADER_SEED] = (int64_t)st->loader.seed;
    h[H_LOADER_SHUFFLE] = st->loader.shuffle;
    h[H_LOADER_B] = st->loader.B;
    h[H_LOADER_T] = st->loader.T;
    h[H_LOADER_RANK] = st->loader.rank;
    h[H_LOADER_WORLD] = st->loader.world;
    h[H_NPARAMS] = (int64_t)st->nparams;
    h[H_OPT_OFFSET] = (int64_t)st->opt_offset;
    h[H_OPT_COUNT] = (int64_t)st->opt_count;
    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, h, sizeof(h));
    atomic_write(&af, st->master, st->opt_count * sizeof(float));
    atomic_write(&af, st->m, st->opt_count * sizeof(float));
    atomic_write(&af, st->v, st->opt_count * sizeof(float));
    atomic_commit(&af);
}

// The fields that are int32 in memory must fit one; anything else is a damaged or foreign file.
static int32_t int32_field(const int64_t* h, int index, const char* path) {
    if (h[index] < INT32_MIN || h[index] > INT32_MAX)
        fatal("%s: header field %d holds %lld, which does not fit the training state", path, index,
              (long long)h[index]);
    return (int32_t)h[index];
}

static size_t count_field(const int64_t* h, int index, const char* path) {
    if (h[index] < 0) fatal("%s: header field %d holds the negative count %lld", path, index, (long long)h[index]);
    return (size_t)h[index];
}

void train_state_read(const char* path, TrainState* st) {
    long long bytes = file_size(path);
    long long header_bytes = HEADER_INTS * (long long)sizeof(int64_t);
    if (bytes < header_bytes)
        fatal("%s: truncated: the file has %lld bytes, too short for the %lld-byte header of a training state",
              path, bytes, header_bytes);
    FILE* f = xfopen(path, "rb");
    int64_t h[HEADER_INTS];
    xfread(h, sizeof(int64_t), HEADER_INTS, f, path);
    if (h[H_MAGIC] != TRAIN_STATE_MAGIC) {
        int32_t first;
        memcpy(&first, h, sizeof(first));
        fatal("%s: wrong magic number (expected %d): not a training state%s", path, TRAIN_STATE_MAGIC,
              first == MODEL_FILE_MAGIC ? " but a model file" : "");
    }
    if (h[H_VERSION] != TRAIN_STATE_VERSION)
        fatal("%s: unsupported training state version %lld (expected %d)", path,
              (long long)h[H_VERSION], TRAIN_STATE_VERSION);

    memset(st, 0, sizeof(*st));
    st->config.max_seq_len = int32_field(h, H_MAX_SEQ_LEN, path);
    st->config.vocab_size = int32_field(h, H_VOCAB, path);
    st->config.padded_vocab_size = int32_field(h, H_PADDED_VOCAB, path);
    st->config.num_layers = int32_field(h, H_LAYERS, path);
    st->config.num_heads = int32_field(h, H_HEADS, path);
    st->config.channels = int32_field(h, H_CHANNELS, path);
    st->step = h[H_STEP];
    st->sample_rng = (uint64_t)h[H_SAMPLE_RNG];
    st->rank = int32_field(h, H_RANK, path);
    st->world = int32_field(h, H_WORLD, path);
    st->loader.epoch = h[H_LOADER_EPOCH];
    st->loader.shard_index = h[H_LOADER_SHARD];
    st->loader.round = h[H_LOADER_ROUND];
    st->loader.seed = (uint64_t)h[H_LOADER_SEED];
    st->loader.shuffle = int32_field(h, H_LOADER_SHUFFLE, path);
    st->loader.B = int32_field(h, H_LOADER_B, path);
    st->loader.T = int32_field(h, H_LOADER_T, path);
    st->loader.rank = int32_field(h, H_LOADER_RANK, path);
    st->loader.world = int32_field(h, H_LOADER_WORLD, path);
    st->nparams = count_field(h, H_NPARAMS, path);
    st->opt_offset = count_field(h, H_OPT_OFFSET, path);
    st->opt_count = count_field(h, H_OPT_COUNT, path);
    const char* problem = state_problem(st);
    if (problem) fatal("%s: inconsistent training state: %s", path, problem);
    // opt_count <= nparams < 2^47 now, so the expected size cannot overflow.
    long long expected = header_bytes + 3 * (long long)st->opt_count * (long long)sizeof(float);
    if (bytes != expected)
        fatal("%s: %s: the header gives 3 x %zu optimizer values (%lld bytes with the header) but the file has %lld bytes",
              path, bytes < expected ? "truncated" : "trailing bytes", st->opt_count, expected, bytes);

    st->master = xmalloc(st->opt_count * sizeof(float), "master weights");
    st->m = xmalloc(st->opt_count * sizeof(float), "AdamW m");
    st->v = xmalloc(st->opt_count * sizeof(float), "AdamW v");
    xfread(st->master, sizeof(float), st->opt_count, f, path);
    xfread(st->m, sizeof(float), st->opt_count, f, path);
    xfread(st->v, sizeof(float), st->opt_count, f, path);
    fclose(f);
}

void train_state_free(TrainState* st) {
    free(st->master);
    free(st->m);
    free(st->v);
    st->master = st->m = st->v = NULL;
}
