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
// increasing order. A thread takes X128 channels of a token (16-byte loads of dout where its rows are
// aligned; one thread per channel, 8 times the instructions, made the whole backward 0.296 ms per
// d12 B 64 call on an H100 instead of 0.276). The positions of one sequence (of T) are summed,
// then added to dwte sequence after sequence, so the sum does not depend on how many sequences a
// batch holds.
__global__ void encoder_backward_wte_kernel(float* dwte, const floatX* dout, const int* tokens,
                                            const int* bucket_start, const int* bucket_count,
                                            const int* num_buckets, const int* rows, int T, int C, bool vector) {
    const int c = (blockIdx.y * blockDim.x + threadIdx.x) * X128;
    if (c >= C) return;
    for (int bucket = blockIdx.x; bucket < *num_buckets; bucket += gridDim.x) {
        float* dst = dwte + (size_t)tokens[bucket] * C + c;
        float total[X128], sum[X128] = {};
        for (int k = 0; k < X128; k++) total[k] = c + k < C ? dst[k] : 0.0f;
        int first = bucket_start[bucket], end = first + bucket_count[bucket], sequence = rows[first] / T;
        for (int i = first; i < end; i++) {
            if (rows[i] / T != sequence) {
                for (int k = 0; k < X128; k++) total[k] += sum[k], sum[k] = 0.0f;
                sequence = rows[i] / T;
            }
            float values[X128];
            load_x128(values, dout + (size_t)rows[i] * C, c, C, vector);
            for (int k = 0; k < X128; k++) sum[k] += values[k];
        }
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
    dim3 grid(N < 4096 ? N : 4096, ceil_div(C, 128 * X128));
    encoder_backward_wte_kernel<<<grid, 128>>>(dwte, dout, tokens, starts, counts, num_buckets, rows, T, C, vector);
    launchCheck();
    encoder_backward_wpe_kernel<<<ceil_div((size_t)T * C, 256), 256>>>(dwpe, dout, B, T, C);
    launchCheck();
}
