// Softmax + cross-entropy + dlogits fused, one block per row; probabilities are never stored.
// The block reads its row of logits from device memory once: into shared memory, with each
// thread keeping a running max and sum of exponentials on the way (online softmax, one rescale
// per 16-byte vector). After the block's max and sum, the gradient pass reads shared memory and
// writes dlogits over the logits. So the logits are read once and written once, the least there
// is: at GPT-2's 50304 padded columns a row takes 98 KB of shared memory in BF16, which every GPU
// from sm_80 on gives a block. A row too long for that is read from device memory again instead.
// What bounds it: with two reads of the row and an expf with a branch per element it was bound by
// instructions, not memory; caching the row and taking the sum during the read (its exp2s overlap
// the loads) brought it near the sum of two floors, the row's bytes at the memory bandwidth and the
// two exp2 per element on the MUFU units, as if they did not overlap. Several 16-byte loads in
// flight per thread (4 into registers, or 8 cp.async copies straight into the cached row; same sums,
// same bits) took the read from latency-bound toward the bandwidth floor (docs/performance.md).
#include <math.h>

#include "kernels/cuda/common.cuh"

#define CLASSIFIER_THREADS 512
#define LOADS_IN_FLIGHT 4 // 16-byte loads per thread before the first is used (2 was 3% slower)
#define COPIES_IN_FLIGHT 8 // cp.async copies per thread ahead of the vector used, for cached rows

// The X128 logits src[i .. i + X128) as floats; -inf from V on (padding columns, which so take
// no part in the max and get exp2 = 0).
__device__ inline void load_logits(float vals[X128], const floatX* src, int i, int V, bool vector) {
    load_x128(vals, src, i, V, vector && i + X128 <= V, -INFINITY);
}

// cached: the row fits in the dynamic shared memory (Vp floatX).
__global__ void __launch_bounds__(CLASSIFIER_THREADS, 2) // two rows an SM: 64 registers, 2 x 98 KB (BF16)
    fused_classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp,
                            int write_dlogits, int cached) {
    extern __shared__ __align__(16) unsigned char row_cache[];
    floatX* x = logits + (size_t)blockIdx.x * Vp;
    floatX* cache = (floatX*)row_cache;
    const floatX* row = cached ? cache : x; // what the gradient pass reads
    const int target = targets[blockIdx.x];
    const float target_logit = (float)x[target]; // read before any thread overwrites the row
    const bool vector = Vp % X128 == 0 && aligned16(logits);
    const int stride = blockDim.x * X128;

    // Device memory, once: the copy into shared memory (exact: the floats came from floatX), and
    // this thread's running max m and sum of exp(v - m), moved to a new max once per vector. The
    // exp2s run while other loads are in flight; only the gradient pass is left for afterwards.
    float m = -INFINITY, sum = 0.0f;
    auto absorb = [&](const float vals[X128]) { // the vector's elements, in order, into m and sum
        float vector_max = vals[0]; // element i < V: finite for finite logits
        for (int k = 1; k < X128; k++) vector_max = fmaxf(vector_max, vals[k]);
        if (vector_max > m) {
            sum *= fast_exp2((m - vector_max) * LOG2E); // 0 while m is -inf
            m = vector_max;
        }
        const float m_log2 = m * LOG2E;
        for (int k = 0; k < X128; k++) sum += fast_exp2(vals[k] * LOG2E - m_log2); // one FFMA, one MUFU
    };
    if (cached && vector) {
        // The thread's vectors go by cp.async straight into the cache, COPIES_IN_FLIGHT of them
        // ahead of the one it uses: no registers hold a load in flight, so a thread keeps more of
        // them in flight than LOADS_IN_FLIGHT below. The last vector, past V in part, is still
        // inside the padded row (Vp a multiple of X128); load_logits reads it as -inf from V on.
        for (int j = 0; j < COPIES_IN_FLIGHT; j++) {
            const int i = threadIdx.x * X128 + j * stride;
            if (i < V) cp_async_16(cache + i, x + i, true);
            cp_async_commit(); // empty groups too: each wait below then lets exactly its vector through
        }
        for (int i = threadIdx.x * X128; i < V; i += stride) {
            cp_async_wait<COPIES_IN_FLIGHT - 1>();
            float vals[X128];
            load_logits(vals, cache, i, V, true);
            absorb(vals);
            const int next = i + COPIES_IN_FLIGHT * stride;
            if (next < V) cp_async_16(cache + next, x + next, true);
            cp_async_commit();
        }
    } else {
        // LOADS_IN_FLIGHT vectors are loaded into registers before the first is used, then used in
        // the order of one at a time (the same sums): with one 16-byte load in flight per thread the
        // read waited on memory latency (ncu: well under the DRAM bandwidth, long-scoreboard stalls
        // first).
        for (int i0 = threadIdx.x * X128; i0 < V; i0 += LOADS_IN_FLIGHT * stride) {
            PackedX raw[LOADS_IN_FLIGHT];
#pragma unroll
            for (int b = 0; b < LOADS_IN_FLIGHT; b++) {
                const int i = i0 + b * stride;
                if (vector && i + X128 <= V) raw[b] = *(const PackedX*)(x + i);
            }
#pragma unroll
            for (int b = 0; b < LOADS_IN_FLIGHT; b++) {
                const int i = i0 + b * stride;
                if (i >= V) break;
                float vals[X128];
                if (vector && i + X128 <= V)
                    for (int k = 0; k < X128; k++) vals[k] = (float)raw[b].v[k];
                else
                    load_logits(vals, x, i, V, vector);
                if (cached) store_x128(cache, vals, i, V, vector);
                absorb(vals);
            }
        }
    }
    const float row_max = block_max(m); // its barriers also publish the cached row
    const float max_log2 = row_max * LOG2E;
    const float row_sum = block_sum(sum * fast_exp2(m * LOG2E - max_log2)); // 0 from threads without elements
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(row_sum) + row_max - target_logit;
    if (!write_dlogits) return;

    // dlogits = dloss (p - [col == target]), 0 in the padding columns.
    const float p_scale = dloss / row_sum;
    for (int i = threadIdx.x * X128; i < Vp; i += stride) {
        float vals[X128];
        load_logits(vals, row, i, V, vector);
        for (int k = 0; k < X128; k++) vals[k] = fast_exp2(vals[k] * LOG2E - max_log2) * p_scale;
        if (target >= i && target < i + X128)
            for (int k = 0; k < X128; k++)
                if (i + k == target) vals[k] -= dloss;
        store_x128(x, vals, i, Vp, vector);
    }
}

void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss,
                      int N, int V, int Vp, int write_dlogits) {
    if (N == 0) return;
    static int max_shared = -1; // the most dynamic shared memory the kernel may ask for on this GPU
    if (max_shared < 0) {
        int device, per_block;
        cudaFuncAttributes kernel;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        cudaCheck(cudaFuncGetAttributes(&kernel, fused_classifier_kernel));
        max_shared = per_block - (int)kernel.sharedSizeBytes; // less the reductions' static arrays
        cudaCheck(cudaFuncSetAttribute(fused_classifier_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared));
    }
    const size_t row_bytes = (size_t)Vp * sizeof(floatX);
    const int cached = row_bytes <= (size_t)max_shared;
    fused_classifier_kernel<<<N, CLASSIFIER_THREADS, cached ? row_bytes : 0>>>(logits, losses, targets, dloss, V, Vp,
                                                                               write_dlogits, cached);
    launchCheck();
}
