// Data loader over one token file or a glob of shards (sorted by name).
//
// The stream is cut into chunks of B*T tokens; chunk c of a shard starts at token c*B*T and a batch
// reads B*T + 1 tokens from there (inputs, then targets shifted by one). Rank r of W reads chunk
// k*W + r as its k-th batch of a shard, so the ranks read disjoint parts of every global batch and
// together read the same tokens as one process would. A shard has floor((ntokens - 1) / (B*T)) / W
// rounds; after the last round of the last shard the epoch ends and the loader starts over. The
// (chunks mod W) chunks left over at the end of a shard are not read in any epoch, so once a
// second epoch begins, W processes read other data than one would, unless W divides each shard's
// chunk count (on large shards the few chunks make no difference; llm.c's loader does the same).
// Without shuffling, batches come in file order (batch k of rank 0 of one process starts at token
// k*B*T). With shuffling, the order of shards and the order of rounds within each shard are a
// permutation drawn from (seed, epoch), so the whole position is (epoch, shard, round) and restores
// exactly.
#pragma once
#include <stdint.h>
#include <stddef.h>

#include "common/loader_state.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    // configuration
    int B, T, rank, world, shuffle, vocab_size;
    uint64_t seed;
    int nshards;
    char** shard_paths;
    long long* shard_tokens;  // tokens per shard
    long long* shard_rounds;  // rounds per shard
    // position
    int64_t epoch, shard_index, round;
    int* shard_order;         // this epoch's shard order (identity without shuffle)
    int64_t* round_order;     // the current shard's round order (identity without shuffle)
    // the current shard, validated when loaded
    int loaded_shard;
    uint16_t* tokens;
    // the batch last produced, B*T each, host memory
    int* inputs;
    int* targets;
} DataLoader;

// Opens the file or glob. Exits with a message naming the file (or the pattern) when nothing
// matches, a file is bad (see tokenfile.h), or a shard is too small for one batch of every rank.
void dataloader_init(DataLoader* dl, const char* pattern, int B, int T, int rank, int world,
                     int shuffle, uint64_t seed, int vocab_size);
void dataloader_free(DataLoader* dl);
void dataloader_reset(DataLoader* dl);         // back to epoch 0, first batch
void dataloader_next_batch(DataLoader* dl);    // fills inputs and targets, advances
long long dataloader_batches_per_epoch(const DataLoader* dl); // batches this rank reads per epoch

DataLoaderState dataloader_get_state(const DataLoader* dl);
// Restores a position; exits with a clear message if B, T, rank or world differ from the state's.
void dataloader_set_state(DataLoader* dl, const DataLoaderState* st);

#ifdef __cplusplus
}
#endif
