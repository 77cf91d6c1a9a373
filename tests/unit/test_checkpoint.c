// Model files, training state, atomic writes and the checkpoint directory. Files are checked
// against their raw bytes and hand-made files (the bf16 values are built from sign, exponent and
// mantissa in double), errors in forked children, crashes by SIGKILL and a full disk by
// RLIMIT_FSIZE.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "checkpoints/checkpoint.h"
#include "common/crc32c.h"
#include "common/util.h"
#include "tests/lib/testutil.h"

// ---- helpers -----------------------------------------------------------------------------

static unsigned char* read_all(const char* path, size_t* bytes) { return (unsigned char*)read_whole_file(path, bytes); }

static void write_all(const char* path, const void* bytes, size_t n) {
    FILE* f = xfopen(path, "wb");
    xfwrite(bytes, 1, n, f, path);
    fclose(f);
}

static int32_t get_i32(const unsigned char* b, size_t index) {
    return (int32_t)(b[4 * index] | b[4 * index + 1] << 8 | b[4 * index + 2] << 16 | (uint32_t)b[4 * index + 3] << 24);
}

static void put_i32(unsigned char* b, size_t index, int32_t v) {
    for (int i = 0; i < 4; i++) b[4 * index + i] = (unsigned char)((uint32_t)v >> (8 * i));
}

// Parameter count of a GPT-2 written out from the layout in DESIGN.md.
static size_t count_params(const GPT2Config* c) {
    size_t C = (size_t)c->channels, L = (size_t)c->num_layers;
    size_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
    return (size_t)c->padded_vocab_size * C + (size_t)c->max_seq_len * C + L * per_layer + 2 * C;
}

static int same_config(const GPT2Config* a, const GPT2Config* b) {
    return a->max_seq_len == b->max_seq_len && a->vocab_size == b->vocab_size &&
           a->padded_vocab_size == b->padded_vocab_size && a->num_layers == b->num_layers &&
           a->num_heads == b->num_heads && a->channels == b->channels;
}

static int count_tmp_files(const char* dir) {
    int n = 0;
    DIR* d = opendir(dir);
    for (struct dirent* e; (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

static const GPT2Config tiny = {.max_seq_len = 16, .vocab_size = 100, .padded_vocab_size = 128,
                                .num_layers = 2, .num_heads = 2, .channels = 8};
// Over 65536 parameters, so the bf16 reader goes through more than one piece.
static const GPT2Config small = {.max_seq_len = 64, .vocab_size = 100, .padded_vocab_size = 128,
                                 .num_layers = 2, .num_heads = 4, .channels = 64};

// ---- child actions -----------------------------------------------------------------------
static void child_read_model(const void* path) {
    GPT2Config cfg;
    size_t n;
    model_file_read(path, &cfg, &n);
}

static void child_read_state(const void* path) {
    TrainState st;
    train_state_read(path, &st);
}

// Writes a `small` model (about 450 KB) with the file size limited to 64 KB: a disk that fills up.
static void child_write_on_full_disk(const void* path) {
    struct rlimit limit = {64 << 10, 64 << 10};
    setrlimit(RLIMIT_FSIZE, &limit);
    signal(SIGXFSZ, SIG_IGN); // so that write() fails with EFBIG instead of killing the process
    size_t n = count_params(&small);
    float* params = xcalloc(n, sizeof(float), "params");
    model_file_write(path, &small, params);
}

// Root writes anywhere, so the child drops to "nobody" before writing into a read-only directory.
static void child_write_as_nobody(const void* path) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) fatal("test: cannot drop root privileges");
    float params[4096] = {0};
    model_file_write(path, &tiny, params);
}

static void child_write_model(const void* path) {
    float params[4096] = {0};
    model_file_write(path, &tiny, params);
}

// ---- model files -------------------------------------------------------------------------
static void test_model_round_trip(void) {
    size_t n = count_params(&tiny);
    float* params = xmalloc(n * sizeof(float), "params");
    TestRng rng = test_rng(1);
    test_fill_normal(params, n, 0.02f, &rng);
    params[0] = -0.0f;
    params[1] = 1e-40f; // subnormal
    params[n - 1] = 3e38f;
    char* p = test_tmp_path("model_fp32.bin");
    model_file_write(p, &tiny, params);

    size_t bytes;
    unsigned char* raw = read_all(p, &bytes);
    int header_ok = get_i32(raw, 0) == 20240326 && get_i32(raw, 1) == 3 && get_i32(raw, 2) == 16 &&
                    get_i32(raw, 3) == 100 && get_i32(raw, 4) == 2 && get_i32(raw, 5) == 2 &&
                    get_i32(raw, 6) == 8 && get_i32(raw, 7) == 128 && get_i32(raw, 255) == 0;
    // the checksums in slots llm.c leaves zero: [8] the mark, [9] the header's, [10 + i] tensor i's
    header_ok &= get_i32(raw, 8) == 0x43435243 && (uint32_t)get_i32(raw, 10) == crc32c(0, params, 4 * 128 * 8) &&
                 get_i32(raw, 26) == 0;
    test_check(header_ok && bytes == 1024 + 4 * n && memcmp(raw + 1024, params, 4 * n) == 0,
               "model file bytes", "header %s, %zu bytes (want %zu)", header_ok ? "right" : "wrong", bytes, 1024 + 4 * n);
    free(raw);

    GPT2Config cfg;
    size_t got_n = 0;
    float* got = model_file_read(p, &cfg, &got_n);
    test_check(got_n == n && same_config(&cfg, &tiny) && memcmp(got, params, 4 * n) == 0,
               "model file round trip bit-identical", "%zu parameters (want %zu)", got_n, n);
    free(got);
    free(params);
}

static void test_model_bf16(void) {
    size_t n = count_params(&small);
    double* want = xmalloc(n * sizeof(double), "expected values");
    unsigned char* file = xcalloc(1024 + 2 * n, 1, "bf16 file");
    int32_t header[8] = {20240326, 5, small.max_seq_len, small.vocab_size, small.num_layers,
                         small.num_heads, small.channels, small.padded_vocab_size};
    for (int i = 0; i < 8; i++) put_i32(file, (size_t)i, header[i]);
    for (size_t i = 0; i < n; i++) {
        // bf16: 1 sign bit, 8 exponent bits, 7 mantissa bits; exponent 0 with mantissa 0 is zero.
        unsigned sign = i & 1, exponent = i % 7 == 0 ? 0 : 100 + (unsigned)(i % 50), mantissa = i % 7 == 0 ? 0 : (unsigned)(i * 13 % 128);
        uint16_t bits = (uint16_t)(sign << 15 | exponent << 7 | mantissa);
        want[i] = exponent == 0 ? 0.0 : (sign ? -1 : 1) * ldexp(1.0 + mantissa / 128.0, (int)exponent - 127);
        file[1024 + 2 * i] = (unsigned char)(bits & 0xFF);
        file[1024 + 2 * i + 1] = (unsigned char)(bits >> 8);
    }
    char* p = test_tmp_path("model_bf16.bin");
    write_all(p, file, 1024 + 2 * n);
    GPT2Config cfg;
    size_t got_n = 0;
    float* got = model_file_read(p, &cfg, &got_n);
    test_check(got_n == n && same_config(&cfg, &small), "bf16 model file sizes", "%zu parameters (want %zu)", got_n, n);
    test_close("bf16 model file values", got, want, n, 0, 0);
    free(got);
    free(want);
    free(file);
}

static void test_model_errors(void) {
    size_t n = count_params(&tiny);
    size_t bytes = 1024 + 4 * n;
    unsigned char* good = xcalloc(bytes + 8, 1, "model file");
    int32_t header[8] = {20240326, 3, tiny.max_seq_len, tiny.vocab_size, tiny.num_layers,
                         tiny.num_heads, tiny.channels, tiny.padded_vocab_size};
    for (int i = 0; i < 8; i++) put_i32(good, (size_t)i, header[i]);
    unsigned char* bad = xmalloc(bytes + 8, "bad model file");
    struct { const char* name; int field; int32_t value; long long size_change; const char* want; } cases[] = {
        {"model wrong magic", 0, 20240520, 0, "wrong magic number 20240520 (expected 20240326): not a model file"},
        {"model wrong version", 1, 4, 0, "unsupported model file version 4"},
        {"model truncated", -1, 0, -4, "truncated"},
        {"model trailing bytes", -1, 0, 8, "trailing bytes"},
        {"model bf16 header on fp32 data", 1, 5, 0, "trailing bytes"},
        {"model zero layers", 4, 0, 0, "number of layers"},
        {"model heads not dividing channels", 5, 3, 0, "heads must divide the channels"},
        {"model Vp < V", 7, 64, 0, "padded vocabulary is smaller"},
        {"model huge channels", 6, INT32_MAX, 0, "channels must be"},
        {"model negative max T", 2, -16, 0, "max sequence length"},
        {"model shorter than header", -1, 0, -(long long)bytes + 100, "too short"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        memcpy(bad, good, bytes + 8);
        if (cases[c].field >= 0) put_i32(bad, (size_t)cases[c].field, cases[c].value);
        char name[64];
        snprintf(name, sizeof(name), "bad_model_%zu.bin", c);
        char* p = test_tmp_path(name);
        write_all(p, bad, (size_t)((long long)bytes + cases[c].size_change));
        test_expect_fatal(cases[c].name, child_read_model, p, p, cases[c].want);
    }
    test_expect_fatal("model missing", child_read_model, test_tmp_path("no_model.bin"), "no_model.bin", "No such file");

    // The largest sizes the checks allow, against absurd file sizes: no overflow, a clear answer.
    int32_t huge[256] = {20240326, 3, 1 << 20, 65536, 1024, 1, 65536, 1 << 20};
    GPT2Config cfg;
    int version;
    char err[512] = "";
    int rc_small = model_file_parse_header(huge, 1 << 20, &cfg, &version, err, sizeof(err));
    int small_ok = rc_small == -1 && strstr(err, "truncated") != NULL;
    int rc_big = model_file_parse_header(huge, 0x7fffffffffffffffLL, &cfg, &version, err, sizeof(err));
    int big_ok = rc_big == -1 && strstr(err, "trailing bytes") != NULL;
    int rc_neg = model_file_parse_header(huge, -5, &cfg, &version, err, sizeof(err));
    test_check(small_ok && big_ok && rc_neg == -1, "model header extreme sizes", "rc %d %d %d, last \"%s\"",
               rc_small, rc_big, rc_neg, err);
    free(good);
    free(bad);
}

// The first non-finite value is named by its tensor and its index in it, also in a shard that
// starts inside a tensor (ZeRO). Offsets from the layout in DESIGN.md.
static void test_find_nonfinite(void) {
    size_t n = count_params(&tiny), C = (size_t)tiny.channels, L = (size_t)tiny.num_layers;
    size_t qkvw = (size_t)tiny.padded_vocab_size * C + (size_t)tiny.max_seq_len * C + 2 * L * C;
    float* v = xcalloc(n, sizeof(float), "values");
    int tensor = -1;
    size_t index = 0;
    int none = !gpt2_find_nonfinite(&tiny, v, 0, n, &tensor, &index);
    v[qkvw + 4] = INFINITY;
    v[n - 1] = NAN;
    int whole = gpt2_find_nonfinite(&tiny, v, 0, n, &tensor, &index) && tensor == P_QKVW && index == 4;
    int shard = gpt2_find_nonfinite(&tiny, v + qkvw + 2, qkvw + 2, 10, &tensor, &index) && tensor == P_QKVW && index == 4;
    int last = gpt2_find_nonfinite(&tiny, v + qkvw + 5, qkvw + 5, n - qkvw - 5, &tensor, &index) &&
               tensor == P_LNFB && index == C - 1;
    test_check(none && whole && shard && last, "first non-finite value named by tensor and index",
               "all finite %s, whole model %s, shard %s, last value %s", none ? "right" : "wrong",
               whole ? "right" : "wrong", shard ? "right" : "wrong", last ? "right" : "wrong");
    // gpt2_find_beyond (the FP16 build's range check of loaded weights, 65504): magnitudes up to the
    // limit pass, the first above it (either sign) or NaN is named.
    memset(v, 0, n * sizeof(float));
    v[5] = 65504.0f, v[6] = -65504.0f;
    int within = !gpt2_find_beyond(&tiny, v, 0, n, 65504.0f, &tensor, &index);
    v[qkvw + 7] = -65505.0f;
    v[qkvw + 9] = 1e6f;
    int beyond = gpt2_find_beyond(&tiny, v, 0, n, 65504.0f, &tensor, &index) && tensor == P_QKVW && index == 7;
    v[qkvw + 7] = NAN;
    int nan = gpt2_find_beyond(&tiny, v, 0, n, 65504.0f, &tensor, &index) && tensor == P_QKVW && index == 7;
    test_check(within && beyond && nan, "first value beyond a limit named by tensor and index",
               "+-65504 within %s, -65505 named %s, NaN named %s", within ? "right" : "wrong",
               beyond ? "right" : "wrong", nan ? "right" : "wrong");
    free(v);
}

// ---- training state ----------------------------------------------------------------------
static TrainState make_state(const GPT2Config* cfg, size_t offset, size_t count, uint64_t seed) {
    TrainState st = {.config = *cfg, .step = 123456789012LL, .updates = 123456789000LL,
                     .last_applied = 123456789010LL, .sample_rng = 0xF123456789ABCDEFull,
                     .rank = 1, .world = 3, .nparams = count_params(cfg), .opt_offset = offset,
                     .opt_count = count, .loss_scale = 32768.0, .scale_clean_steps = 1999, .overflow_skips = 2};
    st.history.count = 100; // part of the window: the rest must be written as zeros
    for (int i = 0; i < st.history.count; i++) {
        st.history.loss[i] = 3.0f + 0.01f * (float)i;
        st.history.norm[i] = 0.5f - 0.001f * (float)i;
    }
    st.loader = (DataLoaderState){.epoch = 7, .shard_index = 2, .round = 41, .seed = 0x8000000000000001ull,
                                  .shuffle = 1, .B = 4, .T = 64, .rank = 1, .world = 3};
    st.master = xmalloc(count * sizeof(float), "master");
    st.m = xmalloc(count * sizeof(float), "m");
    st.v = xmalloc(count * sizeof(float), "v");
    TestRng rng = test_rng(seed);
    test_fill_normal(st.master, count, 0.02f, &rng);
    test_fill_normal(st.m, count, 1e-3f, &rng);
    test_fill_uniform(st.v, count, 0, 1e-6f, &rng);
    return st;
}

static void test_state_round_trip(void) {
    size_t n = count_params(&tiny);
    TrainState st = make_state(&tiny, 100, n - 150, 2);
    char* p = test_tmp_path("state.bin");
    train_state_write(p, &st);
    long long bytes = file_size(p);
    TrainState got;
    train_state_read(p, &got);
    const DataLoaderState *a = &st.loader, *b = &got.loader;
    int fields = same_config(&got.config, &tiny) && got.step == st.step && got.sample_rng == st.sample_rng &&
                 got.rank == 1 && got.world == 3 && got.nparams == n && got.opt_offset == 100 && got.opt_count == n - 150 &&
                 got.updates == st.updates && got.last_applied == st.last_applied &&
                 got.loss_scale == 32768.0 && got.scale_clean_steps == 1999 && got.overflow_skips == 2;
    size_t h = (size_t)st.history.count * sizeof(float);
    int history = got.history.count == st.history.count && memcmp(got.history.loss, st.history.loss, h) == 0 &&
                  memcmp(got.history.norm, st.history.norm, h) == 0;
    // the window's unused part is zero in the file: header (512 bytes), 128 losses, 128 norms
    size_t raw_bytes;
    unsigned char* raw = read_all(p, &raw_bytes);
    for (size_t i = 0; i < 2 * STEP_HISTORY * sizeof(float) && history; i++) {
        size_t in_window = i % (STEP_HISTORY * sizeof(float));
        if (in_window >= h && raw[512 + i] != 0) history = 0;
    }
    free(raw);
    int loader = a->epoch == b->epoch && a->shard_index == b->shard_index && a->round == b->round &&
                 a->seed == b->seed && a->shuffle == b->shuffle && a->B == b->B && a->T == b->T &&
                 a->rank == b->rank && a->world == b->world;
    size_t k = st.opt_count * sizeof(float);
    int arrays = memcmp(got.master, st.master, k) == 0 && memcmp(got.m, st.m, k) == 0 && memcmp(got.v, st.v, k) == 0;
    long long want_bytes = 512 + 2 * STEP_HISTORY * 4 + 3 * (long long)k + 3 * NUM_PARAMETER_TENSORS * 4;
    test_check(fields && loader && arrays && history && bytes == want_bytes, "train state round trip bit-identical",
               "fields %s, loader %s, history %s, arrays %s, %lld bytes (want %lld)", fields ? "same" : "differ",
               loader ? "same" : "differs", history ? "same" : "differs", arrays ? "same" : "differ", bytes,
               want_bytes);
    train_state_free(&got);
    train_state_free(&st);
}

// Writes the state file at `path` with one int64 header field replaced and `size_change` bytes
// appended (positive) or cut (negative).
static void write_bad_state(const char* good, const char* path, int field, int64_t value, long long size_change) {
    size_t bytes;
    unsigned char* b = read_all(good, &bytes);
    b = realloc(b, bytes + 16);
    memset(b + bytes, 0, 16);
    if (field >= 0) memcpy(b + 8 * field, &value, 8);
    write_all(path, b, (size_t)((long long)bytes + size_change));
    free(b);
}

static void test_state_errors(void) {
    // Header indices from the layout documented in checkpoints/train_state.c.
    enum { VERSION = 1, LAYERS = 5, HEADS = 6, STEP = 8, NPARAMS = 21, OPT_OFFSET = 22, OPT_COUNT = 23,
           UPDATES = 24, LAST_APPLIED = 25, HISTORY_COUNT = 26, LOSS_SCALE = 28, SCALE_CLEAN_STEPS = 29,
           OVERFLOW_SKIPS = 30, FIRST_LOSS = 64 };
    // loss scales as the header holds them: the bits of a double
    double three = 3.0, above_cap = 33554432.0, half = 0.5, nan = NAN;
    int64_t scale_three, scale_above_cap, scale_half, scale_nan;
    memcpy(&scale_three, &three, 8);
    memcpy(&scale_above_cap, &above_cap, 8);
    memcpy(&scale_half, &half, 8);
    memcpy(&scale_nan, &nan, 8);
    const int64_t nan_loss = 0x7fc00000; // the first history loss NaN, the second 0
    size_t n = count_params(&tiny);
    TrainState st = make_state(&tiny, 0, n, 3);
    char good[512];
    snprintf(good, sizeof(good), "%s", test_tmp_path("good_state.bin"));
    train_state_write(good, &st);
    train_state_free(&st);
    struct { const char* name; int field; int64_t value; long long size_change; const char* want; } cases[] = {
        {"state wrong version", VERSION, 1, 0, "unsupported training state version 1 (expected 2 to 4)"},
        {"state newer version", VERSION, 5, 0, "unsupported training state version 5 (expected 2 to 4)"},
        {"state loss scale not a power of two", LOSS_SCALE, scale_three, 0, "the loss scale is neither 0"},
        {"state loss scale above 2^24", LOSS_SCALE, scale_above_cap, 0, "the loss scale is neither 0"},
        {"state loss scale below 1", LOSS_SCALE, scale_half, 0, "the loss scale is neither 0"},
        {"state loss scale NaN", LOSS_SCALE, scale_nan, 0, "the loss scale is neither 0"},
        {"state loss scale off with counts", LOSS_SCALE, 0, 0, "loss scaling counts without a loss scale"},
        {"state negative clean steps", SCALE_CLEAN_STEPS, -1, 0, "negative count of steps since the loss scale"},
        {"state overflow skips beyond the skips", OVERFLOW_SKIPS, 3, 0, "overflow skips are not in 0..step"},
        {"state negative overflow skips", OVERFLOW_SKIPS, -1, 0, "overflow skips are not in 0..step"},
        {"state history beyond its window", HISTORY_COUNT, 129, 0, "more values than its window"},
        {"state history longer than the updates", UPDATES, 99, 0, "more values than its window or than updates"},
        {"state negative history", HISTORY_COUNT, -1, 0, "more values than its window"},
        {"state updates after the last applied step", LAST_APPLIED, 123456788999LL, 0, "more updates than steps"},
        {"state last applied step after the step", STEP, 123456789009LL, 0, "last applied step is not in 0..step"},
        {"state changed history", FIRST_LOSS, nan_loss, 0, "checksum mismatch in the header or the step history"},
        {"state truncated", -1, 0, -4, "truncated"},
        {"state trailing bytes", -1, 0, 12, "trailing bytes"},
        {"state optimizer range", OPT_OFFSET, 1, 0, "optimizer range"},
        {"state huge optimizer count", OPT_COUNT, 1LL << 62, 0, "optimizer range"},
        {"state negative count", NPARAMS, -1, 0, "negative count"},
        {"state nparams mismatch", NPARAMS, 1000, 0, "does not match the model"},
        {"state impossible config", HEADS, 3, 0, "heads must divide"},
        {"state field out of range", LAYERS, 1LL << 40, 0, "does not fit"},
        {"state shorter than header", -1, 0, -(long long)(512 + 8 * STEP_HISTORY + 12 * n) + 10, "too short"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char name[64];
        snprintf(name, sizeof(name), "bad_state_%zu.bin", c);
        char* p = test_tmp_path(name);
        write_bad_state(good, p, cases[c].field, cases[c].value, cases[c].size_change);
        test_expect_fatal(cases[c].name, child_read_state, p, p, cases[c].want);
    }
    char* model = test_tmp_path("model_fp32.bin");
    test_expect_fatal("state given a model file", child_read_state, model, model, "not a training state but a model file");
    test_expect_fatal("state missing", child_read_state, test_tmp_path("no_state.bin"), "no_state.bin", "No such file");
}

// ---- checksums ---------------------------------------------------------------------------

// Writes src's bytes to dst with the float at byte offset `at` replaced by value (flip: its lowest
// bit flipped instead), and returns dst.
static char* patched(const char* src, const char* dst_name, size_t at, float value, int flip) {
    size_t bytes;
    unsigned char* b = read_all(src, &bytes);
    if (flip) b[at] ^= 1;
    else memcpy(b + at, &value, 4);
    char* dst = test_tmp_path(dst_name);
    write_all(dst, b, bytes);
    free(b);
    return dst;
}

// Each damaged file is refused naming the tensor; a file without checksums (llm.c's, a version 2
// state) still loads, and a non-finite value in it is refused naming the tensor and the index.
static void test_checksums(void) {
    test_check(crc32c(0, "123456789", 9) == 0xE3069283u, "CRC-32C of the standard test vector", "0x%08X",
               crc32c(0, "123456789", 9));
    size_t n = count_params(&tiny), C = (size_t)tiny.channels, L = (size_t)tiny.num_layers;
    size_t qkvw = (size_t)tiny.padded_vocab_size * C + (size_t)tiny.max_seq_len * C + 2 * L * C; // its offset
    float* params = xcalloc(n, sizeof(float), "params");
    for (size_t i = 0; i < n; i++) params[i] = 0.001f * (float)(i % 1000);
    char* good = test_tmp_path("model_crc.bin");
    model_file_write(good, &tiny, params);
    char* p = patched(good, "model_flip.bin", 1024 + 4 * (qkvw + 5), 0, 1);
    test_expect_fatal("model one flipped bit", child_read_model, p, p, "checksum mismatch in tensor qkvw");
    p = patched(good, "model_flip_header.bin", 4 * 200, 0, 1);
    test_expect_fatal("model flipped bit in the header", child_read_model, p, p, "checksum mismatch in the header");
    // llm.c's layout: no checksums (slots 8..25 zero), then an inf in the last tensor
    size_t bytes;
    unsigned char* raw = read_all(good, &bytes);
    memset(raw + 4 * 8, 0, 4 * 18);
    float inf = INFINITY;
    memcpy(raw + 1024 + 4 * (n - 3), &inf, 4);
    p = test_tmp_path("model_llmc_inf.bin");
    write_all(p, raw, bytes);
    test_expect_fatal("model non-finite value", child_read_model, p, p, "non-finite value in tensor lnfb at index 5");
    free(raw);
    free(params);

    TrainState st = make_state(&tiny, 100, n - 150, 9);
    good = test_tmp_path("state_crc.bin");
    train_state_write(good, &st);
    size_t arrays = 512 + 2 * STEP_HISTORY * 4, k = st.opt_count;
    p = patched(good, "state_flip_m.bin", arrays + 4 * (k + qkvw - 100 + 3), 0, 1);
    test_expect_fatal("state one flipped bit in m", child_read_state, p, p,
                      "checksum mismatch in AdamW m of tensor qkvw");
    p = patched(good, "state_flip_trailer.bin", arrays + 12 * k + 4 * (2 * NUM_PARAMETER_TENSORS + 15), 0, 1);
    test_expect_fatal("state flipped bit in a checksum", child_read_state, p, p, "in AdamW v of tensor lnfb");
    char err[512] = "";
    TrainState got;
    int rc = train_state_load(p, &got, err, sizeof(err));
    test_check(rc == -1 && strstr(err, "checksum mismatch") != NULL, "state load returns the problem", "rc %d, \"%s\"",
               rc, err);

    // Version 2: the same file without the header checksum and the trailing checksums.
    raw = read_all(good, &bytes);
    int64_t two = 2, zero = 0;
    memcpy(raw + 8, &two, 8);
    memcpy(raw + 8 * 27, &zero, 8);
    char* v2 = test_tmp_path("state_v2.bin");
    write_all(v2, raw, bytes - 3 * NUM_PARAMETER_TENSORS * 4);
    rc = train_state_load(v2, &got, err, sizeof(err));
    int same = rc == 0 && got.step == st.step && memcmp(got.v, st.v, 4 * k) == 0;
    test_check(same, "a version 2 state still loads", "rc %d, \"%s\"", rc, rc ? err : "");
    if (rc == 0) {
        test_check(got.loss_scale == 0.0 && got.scale_clean_steps == 0 && got.overflow_skips == 0,
                   "a version 2 state reads without loss scaling", "scale %g, %lld, %lld", got.loss_scale,
                   (long long)got.scale_clean_steps, (long long)got.overflow_skips);
        train_state_free(&got);
    }
    float nan = NAN;
    memcpy(raw + arrays + 8 * k + 4 * (k - 1), &nan, 4);
    write_all(v2, raw, bytes - 3 * NUM_PARAMETER_TENSORS * 4);
    test_expect_fatal("state non-finite AdamW v", child_read_state, v2, v2,
                      "non-finite value in AdamW v of tensor fcprojw at index 493");
    free(raw);

    // Version 3: the version 4 file with the loss scaling's fields zero (as version 3 wrote them) and
    // its header checksum recomputed: reads with scaling off.
    raw = read_all(good, &bytes);
    int64_t three = 3;
    memcpy(raw + 8, &three, 8);
    memset(raw + 8 * 27, 0, 8 * 4); // the checksum and the three new fields
    int64_t crc = crc32c(0, raw, 512 + 2 * STEP_HISTORY * 4);
    memcpy(raw + 8 * 27, &crc, 8);
    char* v3 = test_tmp_path("state_v3.bin");
    write_all(v3, raw, bytes);
    rc = train_state_load(v3, &got, err, sizeof(err));
    same = rc == 0 && got.step == st.step && got.loss_scale == 0.0 && got.scale_clean_steps == 0 &&
           got.overflow_skips == 0 && memcmp(got.m, st.m, 4 * k) == 0;
    test_check(same, "a version 3 state still loads, without loss scaling", "rc %d, \"%s\"", rc, rc ? err : "");
    if (rc == 0) train_state_free(&got);
    free(raw);
    train_state_free(&st);
}

// ---- atomic writes -----------------------------------------------------------------------

// Checks the model file at path without exiting: a valid header for cfg and every value equal to
// one value; returns that value, or NAN if the file is broken.
static float uniform_model_value(const char* path, const GPT2Config* cfg) {
    size_t bytes, n = count_params(cfg);
    unsigned char* raw = read_all(path, &bytes);
    float first = NAN;
    int ok = bytes == 1024 + 4 * n && get_i32(raw, 0) == 20240326 && get_i32(raw, 1) == 3 &&
             get_i32(raw, 6) == cfg->channels && get_i32(raw, 4) == cfg->num_layers;
    if (ok) {
        memcpy(&first, raw + 1024, 4);
        for (size_t i = 1; i < n && ok; i++) ok = memcmp(raw + 1024 + 4 * i, &first, 4) == 0;
    }
    free(raw);
    return ok ? first : NAN;
}

// A child rewrites a 16 MB model file over and over (all values = the iteration number) and is
// killed at a random moment. The file must then be the old one or a complete new one; the
// temporary file left behind shows that the kill landed in the middle of a write.
static void test_kill_during_write(void) {
    const GPT2Config big = {.max_seq_len = 64, .vocab_size = 100, .padded_vocab_size = 128,
                            .num_layers = 5, .num_heads = 4, .channels = 256};
    size_t n = count_params(&big);
    float* params = xmalloc(n * sizeof(float), "params");
    for (size_t i = 0; i < n; i++) params[i] = -1.0f;
    char* p = test_tmp_path("model_big.bin");
    model_file_write(p, &big, params);
    srand((unsigned)time(NULL));
    // Kills that land between two writes prove nothing, so go on until four landed inside one.
    int trials = 0, broken = 0, interrupted = 0, replaced = 0;
    for (; trials < 40 && interrupted < 4; trials++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            for (int i = 1;; i++) {
                for (size_t j = 0; j < n; j++) params[j] = (float)i;
                model_file_write(p, &big, params);
            }
        }
        int tmp_before = count_tmp_files(test_tmpdir);
        usleep((useconds_t)(2000 + rand() % 80000));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        float v = uniform_model_value(p, &big);
        broken += isnan(v);
        replaced += v >= 1.0f;
        int leftover = count_tmp_files(test_tmpdir) - tmp_before;
        interrupted += leftover > 0;
        // The killed writer's temporary file stays behind; clean it for the next trial.
        char tmp[600];
        snprintf(tmp, sizeof(tmp), "%s.tmp.%d", p, (int)pid);
        unlink(tmp);
    }
    test_check(broken == 0 && interrupted == 4, "SIGKILL during write leaves a complete file",
               "%d of %d trials broke the file; %d were killed mid-write, %d had replaced the old file",
               broken, trials, interrupted, replaced);
    // Resume after such a crash: the leftover temporary state file is not a checkpoint.
    char* dir = test_tmp_path("killed_run");
    mkdir(dir, 0755);
    char state_path[600], tmp[700];
    checkpoint_state_path(state_path, sizeof(state_path), dir, 5, 0);
    TrainState st = make_state(&tiny, 0, count_params(&tiny), 4);
    train_state_write(state_path, &st);
    checkpoint_state_path(state_path, sizeof(state_path), dir, 6, 0);
    snprintf(tmp, sizeof(tmp), "%s.tmp.999", state_path);
    write_all(tmp, params, 100);
    long long latest = checkpoint_latest_step(dir, 0);
    test_check(latest == 5, "latest step ignores an interrupted write", "latest %lld (want 5)", latest);
    train_state_free(&st);
    free(params);
}

static void test_failed_writes(void) {
    // Full disk: the write fails with EFBIG part way; the old file stays, no temporary file remains.
    char* p = test_tmp_path("model_full.bin");
    float params[4096];
    TestRng rng = test_rng(5);
    test_fill_normal(params, 4096, 1, &rng);
    model_file_write(p, &tiny, params);
    size_t before_n, after_n;
    unsigned char* before = read_all(p, &before_n);
    int tmp_before = count_tmp_files(test_tmpdir);
    test_expect_fatal("full disk error", child_write_on_full_disk, p, p, "File too large");
    unsigned char* after = read_all(p, &after_n);
    int tmp_left = count_tmp_files(test_tmpdir) - tmp_before;
    test_check(before_n == after_n && memcmp(before, after, before_n) == 0 && tmp_left == 0,
               "full disk keeps the old file", "old file %s, %d temporary files left",
               before_n == after_n && memcmp(before, after, before_n) == 0 ? "intact" : "changed", tmp_left);
    free(before);
    free(after);

    // A directory nobody may write to, and one that does not exist.
    chmod(test_tmpdir, 0755);
    char* ro = test_tmp_path("read_only");
    mkdir(ro, 0555);
    char* target = test_tmp_path("read_only/model.bin");
    test_expect_fatal("unwritable directory", child_write_as_nobody, target, target, "Permission denied");
    char* nodir = test_tmp_path("no_such_dir/model.bin");
    test_expect_fatal("nonexistent directory", child_write_model, nodir, nodir, "No such file or directory");
}

// ---- checkpoint directory ----------------------------------------------------------------
static int exists(const char* dir, const char* name) {
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void touch(const char* dir, const char* name) {
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    write_all(p, "x", 1);
}

static void test_checkpoint_dir(void) {
    char buf[256];
    checkpoint_model_path(buf, sizeof(buf), "out", 12);
    int model_ok = strcmp(buf, "out/model_00000012.bin") == 0;
    char buf2[256];
    checkpoint_state_path(buf2, sizeof(buf2), "out", 123456789, 3);
    test_check(model_ok && strcmp(buf2, "out/state_123456789_00003.bin") == 0, "checkpoint names", "%s, %s", buf, buf2);

    char* dir = test_tmp_path("ckpt");
    long long missing = checkpoint_latest_step(dir, 0);
    mkdir(dir, 0755);
    long long empty = checkpoint_latest_step(dir, 0);
    test_check(missing == -1 && empty == -1, "latest step without checkpoints", "missing dir %lld, empty dir %lld", missing, empty);

    TrainState st = make_state(&tiny, 0, count_params(&tiny), 6);
    const long long steps[3] = {10, 20, 30};
    for (int i = 0; i < 3; i++)
        for (int rank = 0; rank < 2; rank++) {
            checkpoint_state_path(buf, sizeof(buf), dir, steps[i], rank);
            train_state_write(buf, &st);
        }
    train_state_free(&st);
    const char* others[] = {"state_00000045_00001.bin", "state_00000040_00000.bin.tmp.123", "state_00000050_00000.bin~",
                            "state_00000060_0.bin", "state_x_00000.bin", "model_00000010.bin", "model_00000020.bin",
                            "model_00000030.bin", "model_00000070.bin", "model_00000080.bin.tmp.7", "notes.txt"};
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) touch(dir, others[i]);
    long long l0 = checkpoint_latest_step(dir, 0), l1 = checkpoint_latest_step(dir, 1), l2 = checkpoint_latest_step(dir, 2);
    test_check(l0 == 30 && l1 == 45 && l2 == -1, "latest step per rank", "ranks 0, 1, 2: %lld %lld %lld (want 30 45 -1)", l0, l1, l2);

    checkpoint_prune(dir, 1, 0, 0);
    int kept_all = exists(dir, "state_00000010_00001.bin") && exists(dir, "model_00000010.bin");
    checkpoint_prune(dir, 1, 2, 0);
    int rank1 = !exists(dir, "state_00000010_00001.bin") && !exists(dir, "state_00000020_00001.bin") &&
                exists(dir, "state_00000030_00001.bin") && exists(dir, "state_00000045_00001.bin");
    int rank0_untouched = exists(dir, "state_00000010_00000.bin") && exists(dir, "model_00000010.bin");
    test_check(kept_all && rank1 && rank0_untouched, "prune rank 1 keeps its 2 newest",
               "keep 0 %s, rank 1 %s, rank 0 %s", kept_all ? "kept all" : "deleted", rank1 ? "right" : "wrong",
               rank0_untouched ? "untouched" : "touched");
    checkpoint_prune(dir, 0, 2, 0);
    int states0 = !exists(dir, "state_00000010_00000.bin") && exists(dir, "state_00000020_00000.bin") &&
                  exists(dir, "state_00000030_00000.bin");
    int models = !exists(dir, "model_00000010.bin") && !exists(dir, "model_00000020.bin") &&
                 exists(dir, "model_00000030.bin") && exists(dir, "model_00000070.bin");
    int others_kept = exists(dir, "notes.txt") && exists(dir, "state_00000060_0.bin") &&
                      exists(dir, "state_00000050_00000.bin~") && exists(dir, "state_00000045_00001.bin");
    int stale_removed = !exists(dir, "state_00000040_00000.bin.tmp.123") && !exists(dir, "model_00000080.bin.tmp.7");
    test_check(states0 && models && others_kept && stale_removed,
               "prune rank 0 keeps 2 newest states and models, removes stale temporaries",
               "states %s, models %s, other files %s, temporaries %s", states0 ? "right" : "wrong",
               models ? "right" : "wrong", others_kept ? "kept" : "touched", stale_removed ? "removed" : "kept");
}

// A run that checkpoints every step and whose steps after 3 are all skipped: --keep 1 keeps the
// newest checkpoint and also step 2's, the newest one that an applied step (3) trained on; stopping
// for divergence sets aside the checkpoints of step 3 on (they hold step 3's weights), and the
// newest checkpoint left is step 2's.
static void test_confirmed_and_set_aside(void) {
    char* dir = test_tmp_path("diverged");
    mkdir(dir, 0755);
    TrainState st = make_state(&tiny, 0, count_params(&tiny), 7);
    char buf[600];
    for (long long step = 1; step <= 6; step++) {
        checkpoint_state_path(buf, sizeof(buf), dir, step, 0);
        train_state_write(buf, &st);
        checkpoint_model_path(buf, sizeof(buf), dir, step);
        write_all(buf, "x", 1);
        checkpoint_prune(dir, 0, 1, step < 3 ? step : 3);
    }
    train_state_free(&st);
    int kept = exists(dir, "state_00000002_00000.bin") && exists(dir, "model_00000002.bin") &&
               exists(dir, "state_00000006_00000.bin") && exists(dir, "model_00000006.bin");
    int pruned = 1;
    for (int step = 1; step <= 5; step++) {
        if (step == 2) continue;
        char name[64];
        snprintf(name, sizeof(name), "state_%08d_00000.bin", step);
        pruned &= !exists(dir, name);
    }
    test_check(kept && pruned, "keep 1 also keeps the newest confirmed checkpoint",
               "steps 2 and 6 %s, steps 1, 3, 4, 5 %s", kept ? "kept" : "missing", pruned ? "deleted" : "kept");

    int renamed = checkpoint_set_aside(dir, 0, 3);
    long long latest = checkpoint_latest_step(dir, 0), latest_model = checkpoint_latest_step(dir, -1);
    checkpoint_prune(dir, 0, 1, 3);
    int aside = exists(dir, "state_00000006_00000.bin.diverged") && exists(dir, "model_00000006.bin.diverged") &&
                !exists(dir, "state_00000006_00000.bin") && exists(dir, "state_00000002_00000.bin");
    test_check(renamed == 1 && latest == 2 && latest_model == 2 && aside,
               "set aside from step 3: the newest left is step 2, pruning keeps the set-aside files",
               "renamed %d (want 1), latest state %lld, model %lld (want 2), files %s", renamed, latest,
               latest_model, aside ? "right" : "wrong");
}

static void child_claim_fresh(const void* dir) { checkpoint_dir_claim(dir, 0, 0, 0); }

// The lock refuses a second claim while the first holder lives; a fresh run is refused a directory
// holding an earlier run, --overwrite deletes exactly the run's files, and an interrupted overwrite
// is finished by the next claim.
static void test_claim(void) {
    char* dir = test_tmp_path("claimed");
    mkdir(dir, 0755);
    const char* run[] = {"log.csv", "model_00000003.bin", "state_00000003_00000.bin", "state_00000002_00000.bin.tmp.9",
                         "model_00000001.bin.diverged", "state_00000001_00000.bin.corrupt"};
    const char* foreign[] = {"notes.txt", "state_00000003_00001.bin", "model_x.bin", "log.csv~"};
    for (size_t i = 0; i < sizeof(foreign) / sizeof(foreign[0]); i++) touch(dir, foreign[i]);
    for (size_t i = 0; i < sizeof(run) / sizeof(run[0]); i++) touch(dir, run[i]);
    test_expect_fatal("claim of a directory holding a run", child_claim_fresh, dir, "holds an earlier run",
                      "log.csv and checkpoints up to step 3");
    // Interrupted: the trash directory made, one file moved into it; the next claim (even a resume) ends it.
    char trash[600], moved[700];
    snprintf(trash, sizeof(trash), "%s/overwritten_00000.deleting", dir);
    mkdir(trash, 0755);
    snprintf(moved, sizeof(moved), "%s/log.csv", dir);
    char to[700];
    snprintf(to, sizeof(to), "%s/log.csv", trash);
    rename(moved, to);
    checkpoint_dir_claim(dir, 0, 1, 0);
    int gone = 1, kept = 1;
    for (size_t i = 0; i < sizeof(run) / sizeof(run[0]); i++) gone &= !exists(dir, run[i]);
    for (size_t i = 0; i < sizeof(foreign) / sizeof(foreign[0]); i++) kept &= exists(dir, foreign[i]);
    test_check(gone && kept && access(trash, F_OK) != 0, "an interrupted overwrite is finished",
               "run files %s, other files %s, trash %s", gone ? "deleted" : "left", kept ? "kept" : "deleted",
               access(trash, F_OK) == 0 ? "left" : "deleted");
    char want[64];
    snprintf(want, sizeof(want), "(pid %d,", (int)getpid());
    test_expect_fatal("a second claim while the first holds the lock", child_claim_fresh, dir,
                      "is in use by another run", want);
}

int main(void) {
    test_tmpdir_create("test_checkpoint");
    test_model_round_trip();
    test_model_bf16();
    test_model_errors();
    test_find_nonfinite();
    test_state_round_trip();
    test_state_errors();
    test_checksums();
    test_kill_during_write();
    test_failed_writes();
    test_checkpoint_dir();
    test_confirmed_and_set_aside();
    test_claim();
    test_tmpdir_remove();
    return test_summary("test_checkpoint");
}
