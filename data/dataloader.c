#include "data/dataloader.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/tokenfile.h"

// ---- shuffling ---------------------------------------------------------------------------
// A small self-contained generator (splitmix64) so that the order depends only on (seed, epoch)
// and never on the C library.
static uint64_t splitmix64(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// One independent stream per (seed, epoch, stream): stream 0 orders the shards, stream 1 + s the
// rounds of shard s.
static uint64_t stream_state(uint64_t seed, int64_t epoch, uint64_t stream) {
    uint64_t s = seed;
    s = splitmix64(&s) ^ (uint64_t)epoch;
    s = splitmix64(&s) ^ stream;
    return splitmix64(&s);
}

// Fisher-Yates over 0..n-1. The modulo bias is below n / 2^64, far below anything observable.
static void identity_or_permutation(int64_t* order, int64_t n, int shuffle, uint64_t rng) {
    for (int64_t i = 0; i < n; i++) order[i] = i;
    if (!shuffle) return;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(splitmix64(&rng) % (uint64_t)(i + 1));
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

// ---- position ----------------------------------------------------------------------------
static void start_epoch(DataLoader* dl) {
    int64_t* order = xmalloc((size_t)dl->nshards * sizeof(int64_t), "shard order");
    identity_or_permutation(order, dl->nshards, dl->shuffle, stream_state(dl->seed, dl->epoch, 0));
    for (int i = 0; i < dl->nshards; i++) dl->shard_order[i] = (int)order[i];
    free(order);
}

// Loads the shard at shard_index (if another one is in memory) and draws its round order.
static void enter_shard(DataLoader* dl) {
    int shard = dl->shard_order[dl->shard_index];
    if (dl->loaded_shard != shard) {
        free(dl->tokens);
        size_t n;
        dl->tokens = tokenfile_read(dl->shard_paths[shard], dl->vocab_size, &n);
        if ((long long)n != dl->shard_tokens[shard])
            fatal("%s changed while training: it had %lld tokens, now %zu", dl->shard_paths[shard],
                  dl->shard_tokens[shard], n);
        dl->loaded_shard = shard;
    }
    free(dl->round_order);
    int64_t rounds = dl->shard_rounds[shard];
    dl->round_order = xmalloc((size_t)rounds * sizeof(int64_t), "round order");
    identity_or_permutation(dl->round_order, rounds, dl->shuffle,
                            stream_state(dl->seed, dl->epoch, 1 + (uint64_t)shard));
}

void dataloader_init(DataLoader* dl, const char* pattern, int B, int T, int rank, int world,
                     int shuffle, uint64_t seed, int vocab_size) {
    memset(dl, 0, sizeof(*dl));
    if (B < 1 || T < 1) fatal("data loader for %s: batch size %d and sequence length %d must be positive", pattern, B, T);
    if (world < 1 || rank < 0 || rank >= world)
        fatal("data loader for %s: rank %d is not in 0..%d (world size %d)", pattern, rank, world - 1, world);
    if ((long long)B * T > (1ll << 30))
        fatal("data loader for %s: a batch of %d x %d tokens is too large", pattern, B, T);
    dl->B = B;
    dl->T = T;
    dl->rank = rank;
    dl->world = world;
    dl->shuffle = shuffle ? 1 : 0;
    dl->seed = seed;
    dl->vocab_size = vocab_size;

    glob_t g;
    int rc = glob(pattern, GLOB_ERR, NULL, &g); // glob sorts the names
    if (rc == GLOB_NOMATCH) fatal("%s: no such file (no file matches the pattern)", pattern);
    if (rc != 0) fatal("%s: cannot list the matching files: %s", pattern, strerror(errno));
    dl->nshards = (int)g.gl_pathc;
    dl->shard_paths = xmalloc(g.gl_pathc * sizeof(char*), "shard paths");
    dl->shard_tokens = xmalloc(g.gl_pathc * sizeof(long long), "shard sizes");
    dl->shard_rounds = xmalloc(g.gl_pathc * sizeof(long long), "shard rounds");
    long long chunk = (long long)B * T;
    for (int s = 0; s < dl->nshards; s++) {
        const char* path = g.gl_pathv[s];
        dl->shard_paths[s] = xmalloc(strlen(path) + 1, "shard path");
        strcpy(dl->shard_paths[s], path);
        // Only the header here; the tokens are checked when the shard is loaded.
        long long bytes = file_size(path);
        unsigned char header[TOKENFILE_HEADER_BYTES] = {0};
        FILE* f = xfopen(path, "rb");
        xfread(header, 1, bytes < TOKENFILE_HEADER_BYTES ? (size_t)bytes : TOKENFILE_HEADER_BYTES, f, path);
        fclose(f);
        char err[256];
        if (tokenfile_parse_header(header, (size_t)bytes, &dl->shard_tokens[s], err, sizeof(err)) != 0)
            fatal("%s: %s", path, err);
        long long chunks = dl->shard_tokens[s] > 0 ? (dl->shard_tokens[s] - 1) / chunk : 0;
        dl->shard_rounds[s] = chunks / world;
        if (dl->shard_rounds[s] < 1)
            fatal("%s: %lld tokens are too few for one batch of each of %d rank(s): B %d x T %d needs %lld tokens",
                  path, dl->shard_tokens[s], world, B, T, chunk * world + 1);
    }
    globfree(&g);

    dl->shard_order = xmalloc((size_t)dl->nshards * sizeof(int), "shard order");
    dl->inputs = xmalloc((size_t)chunk * sizeof(int), "batch inputs");
    dl->targets = xmalloc((size_t)chunk * sizeof(int), "batch targets");
    dl->loaded_shard = -1;
    dataloader_reset(dl);
}

void dataloader_free(DataLoader* dl) {
    for (int s = 0; s < dl->nshards; s++) free(dl->shard_paths[s]);
    free(dl->shard_paths);
    free(dl->shard_tokens);
    free(dl->shard_rounds);
    free(dl->shard_order);
    free(dl->round_order);
    free(dl->tokens);
    free(dl->inputs);
    free(dl->targets);
    memset(dl, 0, sizeof(*dl));
}

void dataloader_reset(DataLoader* dl) {
    dl->epoch = 0;
    dl->shard_index = 0;
    dl->round = 0;
    start_epoch(dl);
    enter_shard(dl);
}

void dataloader_next_batch(DataLoader* dl) {
    long long chunk = (long long)dl->B * dl->T;
    long long k = dl->round_order[dl->round] * dl->world + dl->rank;
    const uint16_t* src = dl->tokens + k * chunk;
    for (long long i = 0; i < chunk; i++) {
        dl->inputs[i] = src[i];
        dl->targets[i] = src[i + 1];
    }
    // Keep the position pointing at the next batch, so that a saved state never points past a shard.
    dl->round++;
    if (dl->round < dl->shard_rounds[dl->shard_order[dl->shard_index]]) return;
    dl->round = 0;
    dl->shard_index++;
    if (dl->shard_index == dl->nshards) {
        dl->shard_index = 0;
        dl->epoch++;
        start_epoch(dl);
    }
    enter_shard(dl);
}

long long dataloader_batches_per_epoch(const DataLoader* dl) {
    long long total = 0;
    for (int s = 0; s < dl->nshards; s++) total += dl->shard_rounds[s];
    return total;
}

DataLoaderState dataloader_get_state(const DataLoader* dl) {
    DataLoaderState st = {
        .epoch = dl->epoch, .shard_index = dl->shard_index, .round = dl->round, .seed = dl->seed,
        .shuffle = dl->shuffle, .B = dl->B, .T = dl->T, .rank = dl->rank, .world = dl->world};
    return st;
}

void dataloader_set_state(DataLoader* dl, const DataLoaderState* st) {
    if (st->B != dl->B || st->T != dl->T || st->rank != dl->rank || st->world != dl->world)
        fatal("cannot restore the data position: it was saved with B %d, T %d, rank %d of %d, "
              "but this run has B %d, T %d, rank %d of %d",
              st->B, st->T, st->rank, st->world, dl->B, dl->T, dl->rank, dl->world);
    if (st->epoch < 0 || st->shard_index < 0 || st->shard_index >= dl->nshards)
        fatal("cannot restore the data position: epoch %lld, shard %lld do not exist in %d shard(s) of %s",
              (long long)st->epoch, (long long)st->shard_index, dl->nshards, dl->shard_paths[0]);
    // The saved seed and shuffle flag define the order being resumed, so they are taken over.
    dl->seed = st->seed;
    dl->shuffle = st->shuffle ? 1 : 0;
    dl->epoch = st->epoch;
    dl->shard_index = st->shard_index;
    start_epoch(dl);
    long long rounds = dl->shard_rounds[dl->shard_order[dl->shard_index]];
    if (st->round < 0 || st->round >= rounds)
        fatal("cannot restore the data position: round %lld is not in 0..%lld of shard %s",
              (long long)st->round, rounds - 1, dl->shard_paths[dl->shard_order[dl->shard_index]]);
    dl->round = st->round;
    enter_shard(dl);
}
