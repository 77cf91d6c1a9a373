// Token + position embedding. The backward is deterministic without float atomics: the positions
// are bucketed by token on the GPU (CUB's stable radix sort, run-length encoding and scan, all
// deterministic), then one thread per (token, X128 channels) sums its positions in order and is the
// only writer of those dwte elements. Nothing waits for the host: bucketing on the host took a download
// of the tokens, a sort on the CPU while the GPU idled, and an upload, three times the GPU's time.
#include <cub/cub.cuh>

#include "kernels/cuda/common.cuh"

// One thread per X128 channels of a position (16-byte loads and stores where rows and arrays are
// 16-byte aligned): one thread per element issued 8 times the instructions and reached a fifth of
// the memory bandwidth (ncu, d12 B 64).
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte,
                                       const floatX* wpe, int B, int T, int C, bool vector) {
    const int vecs_per_row = (C + X128 - 1) / X128;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * T * vecs_per_row) return;
    const size_t row = i / vecs_per_row;
    const int c = (int)(i % vecs_per_row) * X128, t = (int)(row % T);
    float token[X128], position[X128];
    load_x128(token, wte + (size_t)inp[row] * C, c, C, vector);
    load_x128(position, wpe + (size_t)t * C, c, C, vector);
    for (int k = 0; k < X128; k++) token[k] += position[k];
    store_x128(out + row * C, token, c, C, vector);
}

void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                     int B, int T, int C) {
    const bool vector = C % X128 == 0 && aligned16(out, wte, wpe);
    const size_t threads = (size_t)B * T * ((C + X128 - 1) / X128);
    encoder_forward_kernel<<<ceil_div(threads, 256), 256>>>(out, inp, wte, wpe, B, T, C, vector);
    launchCheck();
}

// blockIdx.x walks the distinct tokens (bucket < *num_buckets, read on the device, so the host never
// waits for the count); rows[bucket_start[b] .. + bucket_count[b]) are token tokens[b]'s positions in
// increasing order. Thread x of a block owns X128 channels of the token (16-byte loads of dout where
// its rows are aligned): the positions of one sequence (of T) are summed, then added to dwte sequence
// after sequence, so the sum does not depend on how many sequences a batch holds.
// In text a few tokens are very frequent: newline is 4,913 of tinyshakespeare's first 65,536 tokens,
// the next 3,898 (uniform random ids repeat one at most 8 times). One block summing such a chain lasts
// as long as the chain, whole milliseconds of a d12 B 64 step even with the positions staged 32 at a
// time (below), while the other SMs idle. So a bucket of
// long_rows positions or more is summed by B blocks in parallel, one per sequence, into a scratch of
// sequence sums, and a last kernel adds those sums into dwte in sequence order: the same additions.
#define ENCODER_WTE_THREADS 128
#define ENCODER_STAGE_ROWS 32 // 64 KB of shared memory a block
#define ENCODER_LONG_ROWS 256 // the least long_rows: a shorter chain takes at most 8 staged chunks

// The block's staging area: positions' dout vectors and their rows and sequences.
struct EncoderStage {
    PackedX* vectors; // [position][vector of the block]
    int* row;
    int* sequence;
};

__device__ inline EncoderStage encoder_stage() {
    extern __shared__ float4 stage_shared[];
    EncoderStage stage;
    stage.vectors = reinterpret_cast<PackedX*>(stage_shared);
    stage.row = reinterpret_cast<int*>(stage.vectors + ENCODER_STAGE_ROWS * ENCODER_WTE_THREADS);
    stage.sequence = stage.row + ENCODER_STAGE_ROWS;
    return stage;
}

// Adds dout's rows rows[first .. end) (increasing) to this thread's X128 channels c = c0 + x * X128:
// the positions of one sequence into sum, which goes into total (and starts again from 0) when the
// sequence changes; `sequence` is the sequence sum belongs to. The block stages ENCODER_STAGE_ROWS
// positions at a time, all their vectors copied at once (cp.async where rows are 16-byte aligned),
// then the owners add them in order. Every thread of the block calls it (barriers).
__device__ __forceinline__ void encoder_sum_positions(float total[X128], float sum[X128], int& sequence,
                                                      const EncoderStage& stage, const floatX* dout, const int* rows,
                                                      int first, int end, int T, int C, int c0, bool vector) {
    const int vectors = min(ENCODER_WTE_THREADS, (C - c0 + X128 - 1) / X128); // this block's channels
    for (int chunk = first; chunk < end; chunk += ENCODER_STAGE_ROWS) {
        const int positions = min(ENCODER_STAGE_ROWS, end - chunk);
        __syncthreads(); // the owners are done with the stage before
        if (threadIdx.x < positions) {
            const int row = rows[chunk + threadIdx.x];
            stage.row[threadIdx.x] = row;
            stage.sequence[threadIdx.x] = row / T;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < positions * vectors; e += ENCODER_WTE_THREADS) {
            const int p = e / vectors, v = e % vectors;
            const size_t start = (size_t)stage.row[p] * C;
            PackedX* to = &stage.vectors[p * ENCODER_WTE_THREADS + v];
            if (vector) {
                cp_async_16(to, dout + start + c0 + v * X128, true);
            } else {
                float values[X128];
                load_x128(values, dout + start, c0 + v * X128, C, false);
                for (int k = 0; k < X128; k++) to->v[k] = (floatX)values[k];
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        if (threadIdx.x >= vectors) continue;
        for (int p = 0; p < positions; p++) {
            if (stage.sequence[p] != sequence) {
                for (int k = 0; k < X128; k++) total[k] += sum[k], sum[k] = 0.0f;
                sequence = stage.sequence[p];
            }
            const PackedX values = stage.vectors[p * ENCODER_WTE_THREADS + threadIdx.x];
            for (int k = 0; k < X128; k++) sum[k] += (float)values.v[k];
        }
    }
}

// The buckets of fewer than long_rows positions, whole.
__global__ void __launch_bounds__(ENCODER_WTE_THREADS)
    encoder_backward_wte_kernel(float* dwte, const floatX* dout, const int* tokens, const int* bucket_start,
                                const int* bucket_count, const int* num_buckets, const int* rows, int T, int C,
                                int long_rows, bool vector) {
    const EncoderStage stage = encoder_stage();
    const int c0 = blockIdx.y * ENCODER_WTE_THREADS * X128, c = c0 + threadIdx.x * X128;
    for (int bucket = blockIdx.x; bucket < *num_buckets; bucket += gridDim.x) {
        if (bucket_count[bucket] >= long_rows) continue; // the same for the whole block
        float total[X128], sum[X128] = {};
        float* dst = dwte + (size_t)tokens[bucket] * C + c;
        if (c < C)
            for (int k = 0; k < X128; k++) total[k] = c + k < C ? dst[k] : 0.0f;
        const int first = bucket_start[bucket];
        int sequence = rows[first] / T;
        encoder_sum_positions(total, sum, sequence, stage, dout, rows, first, first + bucket_count[bucket], T, C, c0,
                              vector);
        if (c < C)
            for (int k = 0; k < X128 && c + k < C; k++) dst[k] = total[k] + sum[k];
    }
}

// The buckets of long_rows positions or more, listed in long_buckets[0 .. *num_long) in any order
// (each is summed on its own, so the order changes no result). *num_long starts at 0.
__global__ void encoder_find_long_buckets(int* long_buckets, int* num_long, const int* bucket_count,
                                          const int* num_buckets, int long_rows) {
    for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < *num_buckets; b += gridDim.x * blockDim.x)
        if (bucket_count[b] >= long_rows) long_buckets[atomicAdd(num_long, 1)] = b;
}

// The first i in [lo, hi) with rows[i] >= value (hi if none), rows increasing, by one warp: each round
// its 32 lanes probe 32 evenly spaced points, and the answer lies between the last probe below value
// and the next, so a bucket of 5,000 positions takes three rounds of loads, not thirteen.
__device__ int warp_lower_bound(const int* rows, int lo, int hi, int value) {
    const int lane = threadIdx.x % 32;
    while (lo < hi) { // the answer is in [lo, hi]
        const int step = (hi - lo + 31) / 32, probe = lo + lane * step;
        const int below = __popc(__ballot_sync(0xffffffffu, probe < hi && rows[probe] < value));
        if (below == 0) return lo;
        const int next = lo + below * step; // >= value or past hi
        lo = lo + (below - 1) * step + 1;
        hi = min(hi, next);
    }
    return lo;
}

// Work item w = (long bucket j, sequence s): the sum of its positions in sequence s, from 0 in
// increasing order as encoder_backward_wte_kernel sums them, into sums[(j B + s) C ...]. Where the
// sequence lacks the token the sum is -0.0: adding it leaves every value as it is, -0.0 included
// (+0.0 would turn a -0.0 into +0.0).
__global__ void encoder_backward_sequence_sums_kernel(float* sums, const floatX* dout, const int* long_buckets,
                                                      const int* num_long, const int* bucket_start,
                                                      const int* bucket_count, const int* rows, int B, int T, int C,
                                                      bool vector) {
    const EncoderStage stage = encoder_stage();
    __shared__ int range[2];
    const int c0 = blockIdx.y * ENCODER_WTE_THREADS * X128, c = c0 + threadIdx.x * X128;
    for (int w = blockIdx.x; w < *num_long * B; w += gridDim.x) {
        const int j = w / B, s = w % B, bucket = long_buckets[j];
        const int first = bucket_start[bucket], end = first + bucket_count[bucket];
        __syncthreads(); // the range of the block's previous item is read
        if (threadIdx.x < 64) { // warp 0 finds where sequence s starts, warp 1 where it ends
            const int at = warp_lower_bound(rows, first, end, (s + threadIdx.x / 32) * T);
            if (threadIdx.x % 32 == 0) range[threadIdx.x / 32] = at;
        }
        __syncthreads();
        float total[X128] = {}, sum[X128]; // total stays 0: every position is in sequence s
        for (int k = 0; k < X128; k++) sum[k] = range[0] < range[1] ? 0.0f : -0.0f;
        int sequence = s;
        encoder_sum_positions(total, sum, sequence, stage, dout, rows, range[0], range[1], T, C, c0, vector);
        float* dst = sums + ((size_t)j * B + s) * C + c;
        if (c < C)
            for (int k = 0; k < X128 && c + k < C; k++) dst[k] = sum[k];
    }
}

// dwte of each long bucket's token += its B sequence sums, in sequence order. The loads do not wait
// for the additions, so they are in flight together.
__global__ void encoder_backward_add_sequence_sums_kernel(float* dwte, const float* sums, const int* long_buckets,
                                                          const int* num_long, const int* tokens, int B, int C) {
    const int c = (blockIdx.y * blockDim.x + threadIdx.x) * X128;
    if (c >= C) return;
    for (int j = blockIdx.x; j < *num_long; j += gridDim.x) {
        float* dst = dwte + (size_t)tokens[long_buckets[j]] * C + c;
        float total[X128];
        for (int k = 0; k < X128; k++) total[k] = c + k < C ? dst[k] : 0.0f;
#pragma unroll 8
        for (int s = 0; s < B; s++) {
            const float* sum = sums + ((size_t)j * B + s) * C + c;
            for (int k = 0; k < X128; k++) total[k] += c + k < C ? sum[k] : 0.0f;
        }
        for (int k = 0; k < X128 && c + k < C; k++) dst[k] = total[k];
    }
}

// Each sequence's gradient goes straight into dwpe, in order.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float total = dwpe[i];
    for (int b = 0; b < B; b++) total += (float)dout[(size_t)b * T * C + i];
    dwpe[i] = total;
}

__global__ void iota_kernel(int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i;
}

void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const int* inp,
                      int B, int T, int C) {
    int N = B * T;
    // A bucket is long from long_rows positions on. At least 4 B, so that the sequence sums of the
    // at most N / long_rows long buckets take no more than N C / 4 floats (50 MB at d12 B 64, where
    // tinyshakespeare has 35 long buckets).
    const int long_rows = ENCODER_LONG_ROWS > 4 * B ? ENCODER_LONG_ROWS : 4 * B;
    const size_t max_long = (size_t)N / long_rows;
    // Scratch: positions, then sorted tokens and their positions (rows), the distinct tokens, their
    // counts and starts (N each, at most N distinct), the long buckets (max_long), the number of
    // distinct tokens and of long buckets, the sequence sums, CUB's temporary storage (sized by CUB's
    // queries, which do not touch the GPU).
    size_t sort_bytes = 0, encode_bytes = 0, scan_bytes = 0;
    cudaCheck(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, inp, (int*)NULL, (int*)NULL, (int*)NULL, N));
    cudaCheck(cub::DeviceRunLengthEncode::Encode(NULL, encode_bytes, (int*)NULL, (int*)NULL, (int*)NULL, (int*)NULL, N));
    cudaCheck(cub::DeviceScan::ExclusiveSum(NULL, scan_bytes, (int*)NULL, (int*)NULL, N));
    size_t temp_bytes = sort_bytes > encode_bytes ? sort_bytes : encode_bytes;
    if (scan_bytes > temp_bytes) temp_bytes = scan_bytes;
    static void* scratch;
    static size_t capacity;
    const size_t n = (size_t)N, ints = 6 * n + max_long + 2, sums_bytes = max_long * B * C * sizeof(float);
    // Each part 256-byte aligned, as cudaMalloc aligns the whole (CUB's storage wants no more).
    const size_t sums_offset = (ints * sizeof(int) + 255) & ~(size_t)255;
    const size_t temp_offset = (sums_offset + sums_bytes + 255) & ~(size_t)255;
    char* base = (char*)grow_scratch(&scratch, &capacity, temp_offset + temp_bytes, "encoder_backward buckets");
    int *positions = (int*)base, *sorted_tokens = positions + n, *rows = sorted_tokens + n, *tokens = rows + n;
    int *counts = tokens + n, *starts = counts + n, *long_buckets = starts + n;
    int *num_buckets = long_buckets + max_long, *num_long = num_buckets + 1;
    float* sums = (float*)(base + sums_offset);
    void* temp = base + temp_offset;

    iota_kernel<<<ceil_div(N, 256), 256>>>(positions, N);
    launchCheck();
    // The counts past the distinct tokens are zeroed so that the scan over all N reads written memory.
    cudaCheck(cudaMemsetAsync(counts, 0, n * sizeof(int)));
    cudaCheck(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, inp, sorted_tokens, positions, rows, N));
    cudaCheck(cub::DeviceRunLengthEncode::Encode(temp, encode_bytes, sorted_tokens, tokens, counts, num_buckets, N));
    cudaCheck(cub::DeviceScan::ExclusiveSum(temp, scan_bytes, counts, starts, N));

    const bool vector = C % X128 == 0 && aligned16(dout);
    const int channel_blocks = ceil_div(C, ENCODER_WTE_THREADS * X128);
    const size_t stage_bytes = ENCODER_STAGE_ROWS * (ENCODER_WTE_THREADS * sizeof(PackedX) + 2 * sizeof(int));
    static const bool opted_in = [&] { // beyond a block's default 48 KB
        cudaCheck(cudaFuncSetAttribute(encoder_backward_wte_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)stage_bytes));
        cudaCheck(cudaFuncSetAttribute(encoder_backward_sequence_sums_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)stage_bytes));
        return true;
    }();
    (void)opted_in;
    dim3 grid(N < 4096 ? N : 4096, channel_blocks);
    encoder_backward_wte_kernel<<<grid, ENCODER_WTE_THREADS, stage_bytes>>>(dwte, dout, tokens, starts, counts,
                                                                            num_buckets, rows, T, C, long_rows, vector);
    launchCheck();
    if (max_long > 0) {
        cudaCheck(cudaMemsetAsync(num_long, 0, sizeof(int)));
        encoder_find_long_buckets<<<ceil_div(N, 256), 256>>>(long_buckets, num_long, counts, num_buckets, long_rows);
        launchCheck();
        const size_t items = max_long * B;
        dim3 sums_grid(items < 4096 ? (unsigned)items : 4096, channel_blocks);
        encoder_backward_sequence_sums_kernel<<<sums_grid, ENCODER_WTE_THREADS, stage_bytes>>>(
            sums, dout, long_buckets, num_long, starts, counts, rows, B, T, C, vector);
        launchCheck();
        dim3 add_grid((unsigned)max_long, channel_blocks);
        encoder_backward_add_sequence_sums_kernel<<<add_grid, ENCODER_WTE_THREADS>>>(dwte, sums, long_buckets,
                                                                                    num_long, tokens, B, C);
        launchCheck();
    }
    encoder_backward_wpe_kernel<<<ceil_div((size_t)T * C, 256), 256>>>(dwpe, dout, B, T, C);
    launchCheck();
}
