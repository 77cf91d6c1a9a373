// The data loader's position as the training state records it. data/dataloader.c produces and
// restores it, checkpoints/train_state.c stores it: defined here, below both, so that neither
// includes the other.
#pragma once
#include <stdint.h>

typedef struct {
    int64_t epoch;
    int64_t shard_index;  // position in this epoch's shard order
    int64_t round;        // next round within that shard (position in its round order)
    uint64_t seed;
    int32_t shuffle;
    int32_t B, T, rank, world; // recorded so a restore can check they match
} DataLoaderState;
