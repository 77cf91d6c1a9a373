// Token + position embedding. The backward is deterministic without float atomics: the positions
// are bucketed by token on the GPU (CUB's stable radix sort, run-length encoding and scan, all
// deterministic), then one thread per (token, X128 channels) sums its positions in order and is the
// only writer of those dwte elements. Nothing waits for the host: bucketing on the host took a download
// of the tokens, a sort on the CPU while the GPU idled, and an upload, about 0.9 ms of a d12 step.
#include <cub/cub.cuh>

#include "kernels/cuda/common.cuh"

// One thread per X128 channels of a position (16-byte loads and stores where rows and arrays are
// 16-byte aligned): one thread per element issued 8 times the instructions and reached a fifth of
// the memory bandwidth (ncu on an H100, d12 B 64: 0.27 ms for 170 MB).
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
    const bool vector = C % X128 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)wte % 16 == 0 && (uintptr_t)wpe % 16 == 0;
    const size_t threads = (size_t)B * T * ((C + X128 - 1) / X128);
    encoder_forward_kernel<<<ceil_div(threads, 256), 256>>>(out, inp, wte, wpe, B, T, C, vector);
    launchCheck();
}

// blockIdx.x walks the distinct tokens (bucket < *num_buckets, read on the device, so the host never
// waits for the count); rows[bucket_start[b] .. + bucket_count[b]) are token tokens[b]'s positions in
// increasing order. Thread x of the block owns X128 channels of the token (16-byte loads of dout where
// its rows are aligned): the positions of one sequence (of T) are summed, then added to dwte sequence
// after sequence, so the sum does not depend on how many sequences a batch holds.
// The kernel lasts as long as the most frequent token's chain of positions, which in text is long:
// newline is 4,913 of tinyshakespeare's first 65,536 tokens (uniform random ids repeat one at most
// 8 times). Each owner loading its positions one after another, that chain took 1.8 ms of a d12 B 64
// step on an H100 (0.27 ms on random ids), and 8 loads in flight per owner 2.6 ms. So the block
// stages ENCODER_STAGE_ROWS positions at a time in shared memory, all their vectors copied at once
// (cp.async where rows are 16-byte aligned), and the owners then add them from there, in order.
#define ENCODER_WTE_THREADS 128
#define ENCODER_STAGE_ROWS 32 // 64 KB of shared memory a block
__global__ void __launch_bounds__(ENCODER_WTE_THREADS)
    encoder_backward_wte_kernel(float* dwte, const floatX* dout, const int* tokens, const int* bucket_start,
                                const int* bucket_count, const int* num_buckets, const int* rows, int T, int C,
                                bool vector) {
    extern __shared__ float4 stage_shared[];
    PackedX* stage = reinterpret_cast<PackedX*>(stage_shared); // [position][vector of the block]
    int* stage_row = reinterpret_cast<int*>(stage + ENCODER_STAGE_ROWS * ENCODER_WTE_THREADS);
    int* stage_sequence = stage_row + ENCODER_STAGE_ROWS;
    const int c0 = blockIdx.y * ENCODER_WTE_THREADS * X128, c = c0 + threadIdx.x * X128;
    const int vectors = min(ENCODER_WTE_THREADS, (C - c0 + X128 - 1) / X128); // this block's channels
    for (int bucket = blockIdx.x; bucket < *num_buckets; bucket += gridDim.x) {
        float total[X128], sum[X128] = {};
        float* dst = dwte + (size_t)tokens[bucket] * C + c;
        if (c < C)
            for (int k = 0; k < X128; k++) total[k] = c + k < C ? dst[k] : 0.0f;
        const int first = bucket_start[bucket], end = first + bucket_count[bucket];
        int sequence = rows[first] / T;
        for (int chunk = first; chunk < end; chunk += ENCODER_STAGE_ROWS) {
            const int positions = min(ENCODER_STAGE_ROWS, end - chunk);
            __syncthreads(); // the owners are done with the stage before
            if (threadIdx.x < positions) {
                const int row = rows[chunk + threadIdx.x];
                stage_row[threadIdx.x] = row;
                stage_sequence[threadIdx.x] = row / T;
            }
            __syncthreads();
            for (int e = threadIdx.x; e < positions * vectors; e += ENCODER_WTE_THREADS) {
                const int p = e / vectors, v = e % vectors;
                const size_t start = (size_t)stage_row[p] * C;
                PackedX* to = &stage[p * ENCODER_WTE_THREADS + v];
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
            if (c >= C) continue;
            for (int p = 0; p < positions; p++) {
                if (stage_sequence[p] != sequence) {
                    for (int k = 0; k < X128; k++) total[k] += sum[k], sum[k] = 0.0f;
                    sequence = stage_sequence[p];
                }
                const PackedX values = stage[p * ENCODER_WTE_THREADS + threadIdx.x];
                for (int k = 0; k < X128; k++) sum[k] += (float)values.v[k];
            }
        }
        if (c < C)
            for (int k = 0; k < X128 && c + k < C; k++) dst[k] = total[k] + sum[k];
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
    // Scratch: positions, then sorted tokens and their positions (rows), the distinct tokens, their
    // counts and starts (N each, at most N distinct), the number of distinct tokens, CUB's temporary
    // storage (sized by CUB's queries, which do not touch the GPU).
    size_t sort_bytes = 0, encode_bytes = 0, scan_bytes = 0;
    cudaCheck(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, inp, (int*)NULL, (int*)NULL, (int*)NULL, N));
    cudaCheck(cub::DeviceRunLengthEncode::Encode(NULL, encode_bytes, (int*)NULL, (int*)NULL, (int*)NULL, (int*)NULL, N));
    cudaCheck(cub::DeviceScan::ExclusiveSum(NULL, scan_bytes, (int*)NULL, (int*)NULL, N));
    size_t temp_bytes = sort_bytes > encode_bytes ? sort_bytes : encode_bytes;
    if (scan_bytes > temp_bytes) temp_bytes = scan_bytes;
    static void* scratch;
    static size_t capacity;
    size_t n = (size_t)N;
    char* base = (char*)grow_scratch(&scratch, &capacity, 6 * n * sizeof(int) + 256 + temp_bytes, "encoder_backward buckets");
    int *positions = (int*)base, *sorted_tokens = positions + n, *rows = sorted_tokens + n, *tokens = rows + n;
    int *counts = tokens + n, *starts = counts + n, *num_buckets = starts + n;
    void* temp = base + 6 * n * sizeof(int) + 256; // CUB wants its storage aligned to 256 bytes or less
    temp = (void*)(((uintptr_t)temp + 255) & ~(uintptr_t)255);

    iota_kernel<<<ceil_div(N, 256), 256>>>(positions, N);
    launchCheck();
    // The counts past the distinct tokens are zeroed so that the scan over all N reads written memory.
    cudaCheck(cudaMemsetAsync(counts, 0, n * sizeof(int)));
    cudaCheck(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, inp, sorted_tokens, positions, rows, N));
    cudaCheck(cub::DeviceRunLengthEncode::Encode(temp, encode_bytes, sorted_tokens, tokens, counts, num_buckets, N));
    cudaCheck(cub::DeviceScan::ExclusiveSum(temp, scan_bytes, counts, starts, N));

    const bool vector = C % X128 == 0 && (uintptr_t)dout % 16 == 0;
    dim3 grid(N < 4096 ? N : 4096, ceil_div(C, ENCODER_WTE_THREADS * X128));
    const size_t stage_bytes = ENCODER_STAGE_ROWS * (ENCODER_WTE_THREADS * sizeof(PackedX) + 2 * sizeof(int));
    static const bool opted_in = [&] { // beyond a block's default 48 KB
        cudaCheck(cudaFuncSetAttribute(encoder_backward_wte_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)stage_bytes));
        return true;
    }();
    (void)opted_in;
    encoder_backward_wte_kernel<<<grid, ENCODER_WTE_THREADS, stage_bytes>>>(dwte, dout, tokens, starts, counts,
                                                                            num_buckets, rows, T, C, vector);
    launchCheck();
    encoder_backward_wpe_kernel<<<ceil_div((size_t)T * C, 256), 256>>>(dwpe, dout, B, T, C);
    launchCheck();
}
