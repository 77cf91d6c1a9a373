// The training state: everything a bit-exact resume needs besides the model file.
//
// Layout (version 3): a header of 64 little-endian int64 (fields at the indices below, the rest
// zero); the divergence guard's history: STEP_HISTORY fp32 losses, then STEP_HISTORY fp32 gradient
// norms (the first history_count of each are used, oldest first, the rest zero); then opt_count fp32
// master weights, opt_count fp32 AdamW m, opt_count fp32 AdamW v; then the checksums of those three
// arrays: 3 x NUM_PARAMETER_TENSORS uint32, the CRC-32C of each parameter tensor's part in
// [opt_offset, opt_offset + opt_count) (of an empty part: 0), master's first. The header field
// H_CHECKSUM holds the CRC-32C of the header (with H_CHECKSUM zero) and the history.
// Version 2 is the same without H_CHECKSUM and the trailing checksums: it is still read, its values
// checked for finiteness only, so that runs saved before checksums existed can be resumed.
// Version 4 adds the dynamic loss scaling's state: H_LOSS_SCALE (the bits of the double, 0 when
// scaling is off), H_SCALE_CLEAN_STEPS and H_OVERFLOW_SKIPS. Versions 2 and 3 read with all three 0,
// which is what a run without loss scaling has.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/crc32c.h"
#include "common/util.h"
#include "checkpoints/checkpoint.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "state files need a little-endian host");

enum {
    H_MAGIC, H_VERSION,
    H_MAX_SEQ_LEN, H_VOCAB, H_PADDED_VOCAB, H_LAYERS, H_HEADS, H_CHANNELS,
    H_STEP, H_SAMPLE_RNG, H_RANK, H_WORLD,
    H_LOADER_EPOCH, H_LOADER_SHARD, H_LOADER_ROUND, H_LOADER_SEED, H_LOADER_SHUFFLE,
    H_LOADER_B, H_LOADER_T, H_LOADER_RANK, H_LOADER_WORLD,
    H_NPARAMS, H_OPT_OFFSET, H_OPT_COUNT,
    H_UPDATES, H_LAST_APPLIED, H_HISTORY_COUNT,
    H_CHECKSUM, // version 3
    H_LOSS_SCALE, H_SCALE_CLEAN_STEPS, H_OVERFLOW_SKIPS, // version 4
    H_FIELDS
};
_Static_assert(H_FIELDS <= TRAIN_STATE_HEADER_INTS, "the state header has room for every field");
#define HEADER_BYTES (TRAIN_STATE_HEADER_INTS * (long long)sizeof(int64_t))
#define HISTORY_BYTES (2 * STEP_HISTORY * (long long)sizeof(float))
#define TRAILER_BYTES (3 * NUM_PARAMETER_TENSORS * (long long)sizeof(uint32_t))
#define OLDEST_VERSION 2 // the oldest version still read (without checksums)

static const char* const array_names[3] = {"weight", "AdamW m", "AdamW v"};

// The CRC-32C of the header (its checksum field taken as zero) and the history as written.
static uint32_t header_crc(const int64_t header[TRAIN_STATE_HEADER_INTS], const StepHistory* history) {
    int64_t h[TRAIN_STATE_HEADER_INTS];
    memcpy(h, header, sizeof(h));
    h[H_CHECKSUM] = 0;
    uint32_t crc = crc32c(0, h, sizeof(h));
    crc = crc32c(crc, history->loss, sizeof(history->loss));
    return crc32c(crc, history->norm, sizeof(history->norm));
}

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
    // Each applied update has a step of its own, the last of them last_applied.
    if (st->last_applied < 0 || st->last_applied > st->step) return "the last applied step is not in 0..step";
    if (st->updates < 0 || st->updates > st->last_applied) return "more updates than steps up to the last applied one";
    if (st->history.count < 0 || st->history.count > STEP_HISTORY || st->history.count > st->updates)
        return "the step history holds more values than its window or than updates were applied";
    // Off (0), or a power of two from the floor 1 to the cap 2^24: halving and doubling keep it one.
    int exponent;
    double fraction = frexp(st->loss_scale, &exponent);
    if (st->loss_scale != 0.0 && !(fraction == 0.5 && exponent >= 1 && exponent <= 25))
        return "the loss scale is neither 0 (off) nor a power of two in [1, 2^24]";
    if (st->scale_clean_steps < 0) return "negative count of steps since the loss scale last changed";
    if (st->overflow_skips < 0 || st->overflow_skips > st->step - st->last_applied)
        return "the overflow skips are not in 0..step - last applied step";
    if (st->loss_scale == 0.0 && (st->scale_clean_steps != 0 || st->overflow_skips != 0))
        return "loss scaling counts without a loss scale";
    if (st->world < 1 || st->rank < 0 || st->rank >= st->world) return "rank is not in 0..world-1";
    const DataLoaderState* l = &st->loader;
    if (l->B < 1 || l->T < 1 || l->world < 1 || l->rank < 0 || l->rank >= l->world)
        return "impossible data loader sizes";
    if (l->epoch < 0 || l->shard_index < 0 || l->round < 0) return "negative data loader position";
    return NULL;
}

// Only applied steps enter the history, and a step with a non-finite loss or norm is never applied.
static int history_finite(const StepHistory* h) {
    for (int i = 0; i < h->count; i++)
        if (!isfinite(h->loss[i]) || !isfinite(h->norm[i])) return 0;
    return 1;
}

void train_state_write(const char* path, const TrainState* st) {
    const char* problem = state_problem(st);
    if (!problem && !history_finite(&st->history)) problem = "a non-finite value in the step history";
    if (problem) fatal("cannot write %s: inconsistent training state: %s", path, problem);
    int64_t h[TRAIN_STATE_HEADER_INTS] = {0};
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
    h[H_UPDATES] = st->updates;
    h[H_LAST_APPLIED] = st->last_applied;
    h[H_HISTORY_COUNT] = st->history.count;
    memcpy(&h[H_LOSS_SCALE], &st->loss_scale, sizeof(double)); // the exact bits
    h[H_SCALE_CLEAN_STEPS] = st->scale_clean_steps;
    h[H_OVERFLOW_SKIPS] = st->overflow_skips;
    // the unused part of the window is written as zeros, so equal states give equal files
    StepHistory history = {0};
    memcpy(history.loss, st->history.loss, (size_t)st->history.count * sizeof(float));
    memcpy(history.norm, st->history.norm, (size_t)st->history.count * sizeof(float));
    h[H_CHECKSUM] = header_crc(h, &history);
    uint32_t crc[3][NUM_PARAMETER_TENSORS];
    const float* arrays[3] = {st->master, st->m, st->v};
    for (int a = 0; a < 3; a++) checkpoint_tensor_crcs(&st->config, arrays[a], st->opt_offset, st->opt_count, crc[a]);
    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, h, sizeof(h));
    atomic_write(&af, history.loss, sizeof(history.loss));
    atomic_write(&af, history.norm, sizeof(history.norm));
    atomic_write(&af, st->master, st->opt_count * sizeof(float));
    atomic_write(&af, st->m, st->opt_count * sizeof(float));
    atomic_write(&af, st->v, st->opt_count * sizeof(float));
    atomic_write(&af, crc, sizeof(crc));
    atomic_commit(&af);
}

// The fields that are int32 in memory must fit one; anything else is a damaged or foreign file.
static int int32_field(const int64_t* h, int index, int32_t* out, char* err, size_t errlen) {
    if (h[index] < INT32_MIN || h[index] > INT32_MAX) {
        snprintf(err, errlen, "header field %d holds %lld, which does not fit the training state", index,
                 (long long)h[index]);
        return 0;
    }
    *out = (int32_t)h[index];
    return 1;
}

static int count_field(const int64_t* h, int index, size_t* out, char* err, size_t errlen) {
    if (h[index] < 0) {
        snprintf(err, errlen, "header field %d holds the negative count %lld", index, (long long)h[index]);
        return 0;
    }
    *out = (size_t)h[index];
    return 1;
}

int train_state_parse_header(const int64_t h[TRAIN_STATE_HEADER_INTS], long long file_bytes,
                             TrainState* st, char* err, size_t errlen) {
    if (file_bytes < HEADER_BYTES) {
        snprintf(err, errlen, "truncated: the file has %lld bytes, too short for the %lld-byte header of a training state",
                 file_bytes, HEADER_BYTES);
        return -1;
    }
    if (h[H_MAGIC] != TRAIN_STATE_MAGIC) {
        int32_t first;
        memcpy(&first, h, sizeof(first));
        snprintf(err, errlen, "wrong magic number (expected %d): not a training state%s", TRAIN_STATE_MAGIC,
                 first == MODEL_FILE_MAGIC ? " but a model file" : "");
        return -1;
    }
    if (h[H_VERSION] < OLDEST_VERSION || h[H_VERSION] > TRAIN_STATE_VERSION) {
        snprintf(err, errlen, "unsupported training state version %lld (expected %d to %d)", (long long)h[H_VERSION],
                 OLDEST_VERSION, TRAIN_STATE_VERSION);
        return -1;
    }
    TrainState s;
    memset(&s, 0, sizeof(s));
    int ok = int32_field(h, H_MAX_SEQ_LEN, &s.config.max_seq_len, err, errlen) &&
             int32_field(h, H_VOCAB, &s.config.vocab_size, err, errlen) &&
             int32_field(h, H_PADDED_VOCAB, &s.config.padded_vocab_size, err, errlen) &&
             int32_field(h, H_LAYERS, &s.config.num_layers, err, errlen) &&
             int32_field(h, H_HEADS, &s.config.num_heads, err, errlen) &&
             int32_field(h, H_CHANNELS, &s.config.channels, err, errlen) &&
             int32_field(h, H_RANK, &s.rank, err, errlen) && int32_field(h, H_WORLD, &s.world, err, errlen) &&
             int32_field(h, H_LOADER_SHUFFLE, &s.loader.shuffle, err, errlen) &&
             int32_field(h, H_LOADER_B, &s.loader.B, err, errlen) &&
             int32_field(h, H_LOADER_T, &s.loader.T, err, errlen) &&
             int32_field(h, H_LOADER_RANK, &s.loader.rank, err, errlen) &&
             int32_field(h, H_LOADER_WORLD, &s.loader.world, err, errlen) &&
             int32_field(h, H_HISTORY_COUNT, &s.history.count, err, errlen) &&
             count_field(h, H_NPARAMS, &s.nparams, err, errlen) &&
             count_field(h, H_OPT_OFFSET, &s.opt_offset, err, errlen) &&
             count_field(h, H_OPT_COUNT, &s.opt_count, err, errlen);
    if (!ok) return -1;
    s.step = h[H_STEP];
    s.updates = h[H_UPDATES];
    s.last_applied = h[H_LAST_APPLIED];
    s.sample_rng = (uint64_t)h[H_SAMPLE_RNG];
    s.loader.epoch = h[H_LOADER_EPOCH];
    s.loader.shard_index = h[H_LOADER_SHARD];
    s.loader.round = h[H_LOADER_ROUND];
    s.loader.seed = (uint64_t)h[H_LOADER_SEED];
    if (h[H_VERSION] >= 4) { // older states had no loss scaling: 0, 0, 0
        memcpy(&s.loss_scale, &h[H_LOSS_SCALE], sizeof(double));
        s.scale_clean_steps = h[H_SCALE_CLEAN_STEPS];
        s.overflow_skips = h[H_OVERFLOW_SKIPS];
    }
    const char* problem = state_problem(&s);
    if (problem) {
        snprintf(err, errlen, "inconsistent training state: %s", problem);
        return -1;
    }
    // opt_count <= nparams < 2^47 now, so the expected size cannot overflow.
    long long expected = HEADER_BYTES + HISTORY_BYTES + 3 * (long long)s.opt_count * (long long)sizeof(float) +
                         (h[H_VERSION] >= 3 ? TRAILER_BYTES : 0);
    if (file_bytes != expected) {
        snprintf(err, errlen, "%s: the header gives 3 x %zu optimizer values (%lld bytes with the header and the step history) but the file has %lld bytes",
                 file_bytes < expected ? "truncated" : "trailing bytes", s.opt_count, expected, file_bytes);
        return -1;
    }
    *st = s;
    return 0;
}

// Reads count floats, or says how the file ended.
static int read_floats(FILE* f, float* dst, size_t count, char* err, size_t errlen) {
    if (fread(dst, sizeof(float), count, f) == count) return 1;
    snprintf(err, errlen, "%s", ferror(f) ? strerror(errno) : "truncated while reading");
    return 0;
}

int train_state_load_stream(FILE* f, long long bytes, TrainState* st, char* err, size_t errlen) {
    // A short file still gets a zero-padded header so that the parser reports the real problem.
    int64_t h[TRAIN_STATE_HEADER_INTS] = {0};
    size_t want = bytes < HEADER_BYTES ? (size_t)(bytes > 0 ? bytes : 0) : (size_t)HEADER_BYTES;
    if (fread(h, 1, want, f) != want) {
        snprintf(err, errlen, "truncated while reading the header");
        return -1;
    }
    if (train_state_parse_header(h, bytes, st, err, errlen) != 0) return -1;
    int checksummed = h[H_VERSION] >= 3;
    if (!read_floats(f, st->history.loss, STEP_HISTORY, err, errlen) ||
        !read_floats(f, st->history.norm, STEP_HISTORY, err, errlen))
        return -1;
    if (checksummed && h[H_CHECKSUM] != (int64_t)header_crc(h, &st->history)) {
        snprintf(err, errlen, "checksum mismatch in the header or the step history: the file is damaged");
        return -1;
    }
    if (!history_finite(&st->history)) {
        snprintf(err, errlen, "inconsistent training state: a non-finite value in the step history");
        return -1;
    }
    float** arrays[3] = {&st->master, &st->m, &st->v};
    for (int a = 0; a < 3; a++) *arrays[a] = xmalloc(st->opt_count * sizeof(float) + 1, array_names[a]);
    uint32_t stored[3][NUM_PARAMETER_TENSORS];
    int ok = 1;
    for (int a = 0; a < 3 && ok; a++) ok = read_floats(f, *arrays[a], st->opt_count, err, errlen);
    if (ok && checksummed && fread(stored, sizeof(stored), 1, f) != 1) {
        snprintf(err, errlen, "truncated while reading the checksums");
        ok = 0;
    }
    for (int a = 0; a < 3 && ok; a++) {
        int tensor;
        size_t index;
        uint32_t crc[NUM_PARAMETER_TENSORS];
        if (checksummed) checkpoint_tensor_crcs(&st->config, *arrays[a], st->opt_offset, st->opt_count, crc);
        for (tensor = 0; checksummed && tensor < NUM_PARAMETER_TENSORS && ok; tensor++)
            if (crc[tensor] != stored[a][tensor]) {
                snprintf(err, errlen, "checksum mismatch in %s of tensor %s: the file is damaged", array_names[a],
                         parameter_tensor_names[tensor]);
                ok = 0;
            }
        if (ok && gpt2_find_nonfinite(&st->config, *arrays[a], st->opt_offset, st->opt_count, &tensor, &index)) {
            snprintf(err, errlen, "a non-finite value in %s of tensor %s at index %zu", array_names[a],
                     parameter_tensor_names[tensor], index);
            ok = 0;
        }
    }
    if (!ok) {
        train_state_free(st);
        return -1;
    }
    return 0;
}

int train_state_load(const char* path, TrainState* st, char* err, size_t errlen) {
    FILE* f = fopen(path, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0) {
        snprintf(err, errlen, "cannot open: %s", strerror(errno));
        if (f) fclose(f);
        return -1;
    }
    int rc = train_state_load_stream(f, (long long)sb.st_size, st, err, errlen);
    fclose(f);
    return rc;
}

void train_state_read(const char* path, TrainState* st) {
    char err[512];
    if (train_state_load(path, st, err, sizeof(err)) != 0) fatal("%s: %s", path, err);
}

void train_state_free(TrainState* st) {
    free(st->master);
    free(st->m);
    free(st->v);
    st->master = st->m = st->v = NULL;
}
