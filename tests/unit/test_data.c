// Token files and the data loader. Expected batches come from the test's own arithmetic (synthetic
// files whose token value is its position) or from the raw bytes of the reference file, never from
// the loader itself. Errors, which exit the process, are checked in forked children.
#define _GNU_SOURCE
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "data/dataloader.h"
#include "data/tokenfile.h"
#include "tests/lib/testutil.h"

// ---- helpers -----------------------------------------------------------------------------

// Writes a token file byte by byte, independently of tokenfile_write: header fields as given,
// `ntokens` little-endian tokens, then `extra` zero bytes.
static void write_raw(const char* path, int magic, int version, int header_count,
                      const uint16_t* tokens, size_t ntokens, size_t extra) {
    FILE* f = xfopen(path, "wb");
    int32_t header[TOKENFILE_HEADER_INTS] = {magic, version, header_count};
    unsigned char bytes[TOKENFILE_HEADER_BYTES];
    for (int i = 0; i < TOKENFILE_HEADER_INTS; i++)
        for (int b = 0; b < 4; b++) bytes[4 * i + b] = (unsigned char)((uint32_t)header[i] >> (8 * b));
    fwrite(bytes, 1, sizeof(bytes), f);
    for (size_t i = 0; i < ntokens; i++) {
        fputc(tokens[i] & 0xFF, f);
        fputc(tokens[i] >> 8, f);
    }
    for (size_t i = 0; i < extra; i++) fputc(0, f);
    fclose(f);
}

// A valid file of n tokens with values first, first+1, ...: a token's value is its position.
static void write_counting(const char* path, int first, size_t n) {
    uint16_t* t = xmalloc(n * sizeof(uint16_t), "tokens");
    for (size_t i = 0; i < n; i++) t[i] = (uint16_t)(first + (int)i);
    write_raw(path, TOKENFILE_MAGIC, TOKENFILE_VERSION, (int)n, t, n, 0);
    free(t);
}

// Reads the tokens of a token file from its raw bytes.
static uint16_t* read_raw_tokens(const char* path, size_t* n) {
    long long bytes = file_size(path);
    unsigned char* raw = xmalloc((size_t)bytes, "raw file");
    FILE* f = xfopen(path, "rb");
    xfread(raw, 1, (size_t)bytes, f, path);
    fclose(f);
    *n = (size_t)(bytes - TOKENFILE_HEADER_BYTES) / 2;
    uint16_t* t = xmalloc(*n * sizeof(uint16_t), "raw tokens");
    for (size_t i = 0; i < *n; i++)
        t[i] = (uint16_t)(raw[TOKENFILE_HEADER_BYTES + 2 * i] | raw[TOKENFILE_HEADER_BYTES + 2 * i + 1] << 8);
    free(raw);
    return t;
}

static int32_t raw_header_int(const char* path, int index) {
    unsigned char b[4];
    FILE* f = xfopen(path, "rb");
    fseek(f, 4L * index, SEEK_SET);
    xfread(b, 1, 4, f, path);
    fclose(f);
    return (int32_t)(b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24);
}

// On counting files: the batch is consecutive values from inputs[0], targets shifted by one.
// Returns inputs[0] (the batch's global start), or -1 if the batch is not consecutive.
static long long batch_start(const DataLoader* dl) {
    int n = dl->B * dl->T;
    for (int i = 0; i < n; i++)
        if (dl->inputs[i] != dl->inputs[0] + i || dl->targets[i] != dl->inputs[0] + i + 1) return -1;
    return dl->inputs[0];
}

// The synthetic shards: sizes and global first values; written out of order to test the sorting.
#define NSHARDS 3
static const int shard_sizes[NSHARDS] = {1000, 1500, 777};
static const int shard_first[NSHARDS] = {0, 1000, 2500};

// ---- child actions (each must exit through fatal) ---------------------------------------
static void child_read_vocab50257(const void* path) {
    size_t n;
    tokenfile_read((const char*)path, 50257, &n);
}

typedef struct { const char* pattern; int B, T, rank, world; } LoaderArgs;
static void child_init_loader(const void* arg) {
    const LoaderArgs* a = arg;
    DataLoader dl;
    dataloader_init(&dl, a->pattern, a->B, a->T, a->rank, a->world, 0, 1, 50257);
}

typedef struct { LoaderArgs loader; DataLoaderState state; } RestoreArgs;
static void child_restore(const void* arg) {
    const RestoreArgs* a = arg;
    DataLoader dl;
    dataloader_init(&dl, a->loader.pattern, a->loader.B, a->loader.T, a->loader.rank,
                    a->loader.world, 1, 1, 65536);
    dataloader_set_state(&dl, &a->state);
}

// ---- tests -------------------------------------------------------------------------------
static void test_token_file_errors(void) {
    uint16_t t[200];
    for (int i = 0; i < 200; i++) t[i] = (uint16_t)(i * 7);
    char* p = test_tmp_path("bad_magic.bin");
    write_raw(p, 12345, 1, 200, t, 200, 0);
    test_expect_fatal("tokenfile wrong magic", child_read_vocab50257, p, p, "wrong magic number 12345");
    p = test_tmp_path("bad_version.bin");
    write_raw(p, TOKENFILE_MAGIC, 2, 200, t, 200, 0);
    test_expect_fatal("tokenfile wrong version", child_read_vocab50257, p, p, "version 2");
    p = test_tmp_path("truncated.bin");
    write_raw(p, TOKENFILE_MAGIC, 1, 200, t, 150, 0);
    test_expect_fatal("tokenfile truncated", child_read_vocab50257, p, p, "truncated");
    p = test_tmp_path("trailing.bin");
    write_raw(p, TOKENFILE_MAGIC, 1, 200, t, 200, 3);
    test_expect_fatal("tokenfile trailing bytes", child_read_vocab50257, p, p, "trailing bytes");
    p = test_tmp_path("negative.bin");
    write_raw(p, TOKENFILE_MAGIC, 1, -5, t, 0, 0);
    test_expect_fatal("tokenfile negative count", child_read_vocab50257, p, p, "negative token count -5");
    p = test_tmp_path("short.bin");
    FILE* f = xfopen(p, "wb");
    fwrite("hello", 1, 5, f);
    fclose(f);
    test_expect_fatal("tokenfile shorter than header", child_read_vocab50257, p, p, "too short");
    p = test_tmp_path("bad_token.bin");
    t[123] = 50300;
    t[150] = 60000; // only the first bad token is reported
    write_raw(p, TOKENFILE_MAGIC, 1, 200, t, 200, 0);
    test_expect_fatal("tokenfile bad token", child_read_vocab50257, p, p,
                 "token 50300 at index 123 (byte offset 1270) is outside the vocabulary of 50257");
    p = test_tmp_path("missing.bin");
    test_expect_fatal("tokenfile missing", child_read_vocab50257, p, p, "No such file");

    long long n = -7;
    char err[256] = "";
    unsigned char header[TOKENFILE_HEADER_BYTES] = {0};
    int32_t fields[3] = {TOKENFILE_MAGIC, 1, 10};
    memcpy(header, fields, sizeof(fields));
    int rc = tokenfile_parse_header(header, TOKENFILE_HEADER_BYTES + 20, &n, err, sizeof(err));
    test_check(rc == 0 && n == 10, "parse_header valid", "rc %d, ntokens %lld (want 10)", rc, n);
    rc = tokenfile_parse_header(header, TOKENFILE_HEADER_BYTES + 21, &n, err, sizeof(err));
    test_check(rc == -1 && strstr(err, "trailing bytes"), "parse_header odd size", "rc %d, \"%s\"", rc, err);
    uint16_t few[4] = {5, 50256, 50257, 3};
    long long bad = tokenfile_first_bad_token(few, 4, 50257), none = tokenfile_first_bad_token(few, 2, 50257);
    test_check(bad == 2 && none == -1, "first_bad_token", "got %lld and %lld (want 2 and -1)", bad, none);
}

static void test_read_and_write(const char* data_dir) {
    // The validation file of tinyshakespeare, against its raw bytes and the facts in DESIGN.md.
    char path[1024];
    snprintf(path, sizeof(path), "%s/tinyshakespeare/tiny_shakespeare_val.bin", data_dir);
    size_t n, nraw;
    uint16_t* tokens = tokenfile_read(path, 50257, &n);
    uint16_t* raw = read_raw_tokens(path, &nraw);
    test_check(n == 32768 && n == nraw && memcmp(tokens, raw, n * 2) == 0 && tokens[0] == 50256,
               "read tinyshakespeare val", "%zu tokens (want 32768, raw %zu), first %d (want 50256)",
               n, nraw, tokens[0]);

    // The loader on it: batch k starts at token k*B*T.
    DataLoader dl;
    dataloader_init(&dl, path, 4, 64, 0, 1, 0, 0, 50257);
    long long per_epoch = dataloader_batches_per_epoch(&dl);
    int bad = -1;
    for (int k = 0; k < per_epoch && bad < 0; k++) {
        dataloader_next_batch(&dl);
        for (int i = 0; i < 256; i++)
            if (dl.inputs[i] != raw[k * 256 + i] || dl.targets[i] != raw[k * 256 + i + 1]) bad = k;
    }
    test_check(per_epoch == 32767 / 256 && bad < 0, "val file batches in file order",
               "%lld batches per epoch (want %d), first wrong batch %d", per_epoch, 32767 / 256, bad);
    dataloader_free(&dl);
    free(tokens);
    free(raw);

    // tokenfile_write, checked against the raw bytes, then overwritten by a smaller file.
    char* p = test_tmp_path("written.bin");
    uint16_t want[1000];
    for (int i = 0; i < 1000; i++) want[i] = (uint16_t)(i * 37 % 50257 + (i == 999) * 65000);
    tokenfile_write(p, want, 1000);
    raw = read_raw_tokens(p, &nraw);
    test_check(raw_header_int(p, 0) == 20240520 && raw_header_int(p, 1) == 1 && raw_header_int(p, 2) == 1000 &&
                   raw_header_int(p, 3) == 0 && nraw == 1000 && memcmp(raw, want, sizeof(want)) == 0,
               "tokenfile_write bytes", "header %d %d %d, %zu tokens", raw_header_int(p, 0),
               raw_header_int(p, 1), raw_header_int(p, 2), nraw);
    free(raw);
    tokenfile_write(p, want + 500, 10);
    raw = read_raw_tokens(p, &nraw);
    int tmp_left = 0;
    DIR* d = opendir(test_tmpdir);
    for (struct dirent* e; (e = readdir(d));) tmp_left += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    test_check(file_size(p) == 1024 + 20 && raw_header_int(p, 2) == 10 && memcmp(raw, want + 500, 20) == 0 && !tmp_left,
               "tokenfile_write overwrite", "size %lld (want 1044), %d temporary files left", file_size(p), tmp_left);
    free(raw);
}

static void test_file_order(void) {
    // One shard: batch k starts at token k*B*T; after the last batch the epoch wraps.
    char* single = test_tmp_path("single.bin");
    write_counting(single, 0, 1000);
    DataLoader dl;
    dataloader_init(&dl, single, 2, 8, 0, 1, 0, 7, 65536);
    long long per_epoch = dataloader_batches_per_epoch(&dl);
    long long first_bad = -1;
    for (long long k = 0; k < per_epoch; k++) {
        dataloader_next_batch(&dl);
        if (batch_start(&dl) != k * 16 && first_bad < 0) first_bad = k;
    }
    test_check(per_epoch == 62 && first_bad < 0, "single shard in file order",
               "%lld batches per epoch (want 62), first wrong batch %lld", per_epoch, first_bad);
    dataloader_next_batch(&dl);
    DataLoaderState st = dataloader_get_state(&dl);
    test_check(batch_start(&dl) == 0 && st.epoch == 1 && st.round == 1, "epoch wrap",
               "batch after the epoch starts at %lld (want 0), epoch %lld, round %lld",
               batch_start(&dl), (long long)st.epoch, (long long)st.round);
    dataloader_reset(&dl);
    dataloader_next_batch(&dl);
    test_check(batch_start(&dl) == 0 && dl.epoch == 0, "reset", "starts at %lld", batch_start(&dl));
    dataloader_free(&dl);

    // Shards from a glob, in name order, each read to its last full round.
    dataloader_init(&dl, test_tmp_path("shard_*.bin"), 2, 8, 0, 1, 0, 7, 65536);
    first_bad = -1;
    long long k = 0;
    for (int epoch = 0; epoch < 2; epoch++)
        for (int s = 0; s < NSHARDS; s++)
            for (int c = 0; c < (shard_sizes[s] - 1) / 16; c++, k++) {
                dataloader_next_batch(&dl);
                if (batch_start(&dl) != shard_first[s] + c * 16 && first_bad < 0) first_bad = k;
            }
    test_check(dl.nshards == 3 && dataloader_batches_per_epoch(&dl) == 62 + 93 + 48 && first_bad < 0,
               "shards in name order over two epochs", "%d shards, %lld batches per epoch (want 203), first wrong batch %lld",
               dl.nshards, dataloader_batches_per_epoch(&dl), first_bad);
    dataloader_free(&dl);
}

// W ranks against one process with W times the batch: the ranks' batches side by side are the
// global batch, and no token position is an input of two ranks in an epoch.
static void test_ranks(int shuffle) {
    enum { W = 3, B = 2, T = 8 };
    const char* pattern = test_tmp_path("shard_*.bin");
    DataLoader ranks[W], global;
    for (int r = 0; r < W; r++) dataloader_init(&ranks[r], pattern, B, T, r, W, shuffle, 11, 65536);
    dataloader_init(&global, pattern, W * B, T, 0, 1, shuffle, 11, 65536);
    long long per_epoch = dataloader_batches_per_epoch(&global);
    unsigned char used[3277] = {0};
    long long first_bad = -1, reused = 0, chunk_bad = 0;
    for (long long k = 0; k < 2 * per_epoch; k++) {
        dataloader_next_batch(&global);
        for (int r = 0; r < W; r++) {
            dataloader_next_batch(&ranks[r]);
            if (memcmp(ranks[r].inputs, global.inputs + r * B * T, B * T * sizeof(int)) != 0 ||
                memcmp(ranks[r].targets, global.targets + r * B * T, B * T * sizeof(int)) != 0) {
                if (first_bad < 0) first_bad = k;
            }
            if (k < per_epoch)
                for (int i = 0; i < B * T; i++) reused += used[ranks[r].inputs[i]]++ > 0;
            // In file order rank r's k-th batch of the first shard is chunk k*W + r.
            if (!shuffle && k < 20 && batch_start(&ranks[r]) != (k * W + r) * B * T) chunk_bad++;
        }
    }
    long long rank_epoch = dataloader_batches_per_epoch(&ranks[1]);
    char name[64];
    snprintf(name, sizeof(name), "%d ranks = one global batch%s", W, shuffle ? " (shuffled)" : "");
    test_check(first_bad < 0 && rank_epoch == per_epoch && per_epoch == 20 + 31 + 16 && reused == 0 && chunk_bad == 0,
               name, "first differing step %lld, batches per epoch %lld per rank and %lld global (want 67), "
               "%lld inputs read twice, %lld batches off their chunk", first_bad, rank_epoch, per_epoch, reused, chunk_bad);
    for (int r = 0; r < W; r++) dataloader_free(&ranks[r]);
    dataloader_free(&global);
}

// Records the starts of the next n batches.
static void record_starts(DataLoader* dl, long long* starts, int n) {
    for (int i = 0; i < n; i++) {
        dataloader_next_batch(dl);
        starts[i] = batch_start(dl);
    }
}

static void test_shuffle(void) {
    const char* pattern = test_tmp_path("shard_*.bin");
    enum { PER_EPOCH = 62 + 93 + 48 };
    DataLoader a, b, c;
    dataloader_init(&a, pattern, 2, 8, 0, 1, 1, 42, 65536);
    dataloader_init(&b, pattern, 2, 8, 0, 1, 1, 42, 65536);
    dataloader_init(&c, pattern, 2, 8, 0, 1, 1, 43, 65536);
    long long sa[2 * PER_EPOCH], sb[2 * PER_EPOCH], sc[2 * PER_EPOCH];
    record_starts(&a, sa, 2 * PER_EPOCH);
    record_starts(&b, sb, 2 * PER_EPOCH);
    record_starts(&c, sc, 2 * PER_EPOCH);

    // Every epoch reads every (shard, round) once: exactly the file-order starts, shard by shard.
    for (int epoch = 0; epoch < 2; epoch++) {
        unsigned char seen[3277] = {0};
        int wrong = 0, shard_changes = 0, out_of_file_order = 0;
        for (int i = 0; i < PER_EPOCH; i++) {
            long long s = sa[epoch * PER_EPOCH + i];
            int shard = s >= 2500 ? 2 : s >= 1000 ? 1 : 0;
            if (s < 0 || (s - shard_first[shard]) % 16 != 0 || s - shard_first[shard] + 17 > shard_sizes[shard] || seen[s]++)
                wrong++;
            if (i > 0) {
                long long p = sa[epoch * PER_EPOCH + i - 1];
                shard_changes += shard != (p >= 2500 ? 2 : p >= 1000 ? 1 : 0);
                out_of_file_order += s != p + 16;
            }
        }
        char name[64];
        snprintf(name, sizeof(name), "shuffle epoch %d is a permutation", epoch);
        test_check(wrong == 0 && shard_changes == NSHARDS - 1 && out_of_file_order > PER_EPOCH / 2, name,
                   "%d batches wrong or repeated, %d shard changes (want %d), %d of %d out of file order",
                   wrong, shard_changes, NSHARDS - 1, out_of_file_order, PER_EPOCH - 1);
    }
    int same_epochs = memcmp(sa, sa + PER_EPOCH, sizeof(long long) * PER_EPOCH) == 0;
    int same_seed = memcmp(sa, sb, sizeof(sa)) == 0, other_seed = memcmp(sa, sc, sizeof(sa)) == 0;
    test_check(!same_epochs, "shuffle differs across epochs", "epoch 1 %s epoch 0", same_epochs ? "repeats" : "differs from");
    test_check(same_seed, "shuffle same seed identical", "two loaders with seed 42 %s", same_seed ? "agree" : "differ");
    test_check(!other_seed, "shuffle other seed differs", "seeds 42 and 43 give %s orders", other_seed ? "the same" : "different");
    dataloader_free(&a);
    dataloader_free(&b);
    dataloader_free(&c);
}

static void test_state(void) {
    const char* pattern = test_tmp_path("shard_*.bin");
    enum { N = 50 };
    DataLoader a, b;
    // Rank 1 of 2, shuffled: 31 + 46 + 24 = 101 batches per epoch; 80 lies inside a shard
    // whatever the shard order, and the next 50 cross into the next epoch.
    dataloader_init(&a, pattern, 2, 8, 1, 2, 1, 5, 65536);
    long long skip[80];
    record_starts(&a, skip, 80);
    DataLoaderState st = dataloader_get_state(&a);
    long long want[N], got[N];
    record_starts(&a, want, N);
    // A different seed and position before the restore: the state must bring back both.
    dataloader_init(&b, pattern, 2, 8, 1, 2, 1, 999, 65536);
    record_starts(&b, got, 10);
    dataloader_set_state(&b, &st);
    record_starts(&b, got, N);
    int bad_batch = 0;
    for (int i = 0; i < N; i++) bad_batch += got[i] < 0 || got[i] != want[i];
    test_check(dataloader_batches_per_epoch(&a) == 101 && st.epoch == 0 && st.shard_index == 2 && st.round > 0 &&
                   bad_batch == 0 && a.epoch == 1,
               "state restore mid-epoch mid-shard shuffled", "state (epoch %lld, shard %lld, round %lld), %d of %d batches differ",
               (long long)st.epoch, (long long)st.shard_index, (long long)st.round, bad_batch, N);
    dataloader_free(&a);
    dataloader_free(&b);

    RestoreArgs args = {{pattern, 4, 8, 1, 2}, st};
    test_expect_fatal("set_state other B", child_restore, &args, "cannot restore the data position", "B 2, T 8, rank 1 of 2");
    args.loader = (LoaderArgs){pattern, 2, 8, 1, 4};
    test_expect_fatal("set_state other world", child_restore, &args, "cannot restore the data position", "rank 1 of 4");
    args.loader = (LoaderArgs){pattern, 2, 8, 1, 2};
    args.state.round = 1000;
    test_expect_fatal("set_state impossible round", child_restore, &args, "round 1000", NULL);
}

static void test_loader_errors(void) {
    LoaderArgs a = {test_tmp_path("nothing_*.bin"), 2, 8, 0, 1};
    test_expect_fatal("loader no match", child_init_loader, &a, a.pattern, "no file matches");
    char* small = test_tmp_path("small.bin");
    write_counting(small, 0, 40);
    a = (LoaderArgs){small, 2, 8, 0, 3};
    test_expect_fatal("loader shard too small for ranks", child_init_loader, &a, small, "too few for one batch of each of 3 rank(s)");
    a = (LoaderArgs){test_tmp_path("bad_token.bin"), 2, 8, 0, 1};
    test_expect_fatal("loader validates tokens", child_init_loader, &a, "bad_token.bin: token 50300 at index 123", NULL);
    a = (LoaderArgs){small, 2, 8, 2, 2};
    test_expect_fatal("loader rank out of range", child_init_loader, &a, "rank 2", NULL);
}

int main(int argc, char** argv) {
    if (argc != 2)
        fatal("usage: test_data DATA_DIR (the directory scripts/get_data.sh fills: tinyshakespeare/ and its tokens)");
    test_tmpdir_create("test_data");
    const int write_order[NSHARDS] = {2, 0, 1};
    for (int i = 0; i < NSHARDS; i++) {
        int s = write_order[i];
        char name[32];
        snprintf(name, sizeof(name), "shard_%02d.bin", s);
        write_counting(test_tmp_path(name), shard_first[s], (size_t)shard_sizes[s]);
    }
    test_token_file_errors();
    test_read_and_write(argv[1]);
    test_file_order();
    test_ranks(0);
    test_ranks(1);
    test_shuffle();
    test_state();
    test_loader_errors();
    test_tmpdir_remove();
    return test_summary("test_data");
}
