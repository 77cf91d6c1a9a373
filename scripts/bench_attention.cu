// Times the BF16 flash attention (kernels/cuda/attention_flash.cu): forward, and forward plus
// backward, causal, NH heads of size HS (NH from $HEADS, default 12), B = tokens / T sequences per
// call (tokens from $TOKENS, default 65536), forward + backward both
// with the default deterministic dQ and with atomic dQ (FLASH_ATTN_DETERMINISTIC=0). Prints one
// line per T:
//   T B fwd_ms fwd_tflops fwdbwd_ms fwdbwd_tflops fwdbwd_atomic_ms fwdbwd_atomic_tflops
// FLOPs are counted as for PyTorch's numbers: 4 B NH T^2 HS / 2 for the forward (two matrix
// products over the causal half), 3.5 times that for forward plus backward. Times are medians of
// REPEATS runs timed with CUDA events after WARMUP runs, on random inputs (never zeros).
// Built and run by scripts/bench_attention.sh.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/common.cuh"

#define WARMUP 3
#define REPEATS 15

__global__ void fill_random_kernel(floatX* p, size_t n, unsigned int seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int x = (unsigned int)(i * 2654435761u) ^ seed; // a hash, uniform enough for timing
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    p[i] = (floatX)((float)(x & 0xffffff) / 16777216.0f * 2.0f - 1.0f);
}

static floatX* random_buffer(size_t n, unsigned int seed) {
    floatX* p;
    cudaCheck(cudaMalloc(&p, n * sizeof(floatX)));
    fill_random_kernel<<<ceil_div(n, 256), 256>>>(p, n, seed);
    launchCheck();
    return p;
}

static int compare_floats(const void* a, const void* b) {
    float x = *(const float*)a, y = *(const float*)b;
    return (x > y) - (x < y);
}

// Median milliseconds of one call of `work`.
template <class Work> static float median_ms(Work work) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    for (int i = 0; i < WARMUP; i++) work();
    float times[REPEATS];
    for (int i = 0; i < REPEATS; i++) {
        cudaCheck(cudaEventRecord(start));
        work();
        cudaCheck(cudaEventRecord(stop));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&times[i], start, stop));
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    qsort(times, REPEATS, sizeof(float), compare_floats);
    return times[REPEATS / 2];
}

// The environment variable `name` as a positive int, or `fallback` where it is unset.
static int positive_env(const char* name, int fallback) {
    const char* value = getenv(name);
    return value && value[0] ? (int)parse_int_option(value, name, 1, INT_MAX) : fallback;
}

int main(int argc, char** argv) {
    const int tokens = positive_env("TOKENS", 65536), NH = positive_env("HEADS", 12), HS = 64, C = NH * HS;
    if (argc < 2) fatal("usage: %s T [T ...] (sequence lengths dividing %d)", argv[0], tokens);
    for (int a = 1; a < argc; a++) {
        const int T = atoi(argv[a]);
        if (T < 1 || tokens % T != 0) fatal("bench_attention: T '%s' must be a positive divisor of %d", argv[a], tokens);
        const int B = tokens / T;
        const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
        floatX* qkv = random_buffer(n_qkv, 1);
        floatX* dout = random_buffer(n_out, 2);
        floatX *out, *dqkv;
        void *saved, *scratch;
        cudaCheck(cudaMalloc(&out, n_out * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dqkv, n_qkv * sizeof(floatX)));
        cudaCheck(cudaMalloc(&saved, attention_saved_bytes(B, T, NH)));
        // The scratch of either dQ mode: the atomic one's accumulator, or the bias partials' room.
        setenv("FLASH_ATTN_DETERMINISTIC", "0", 1);
        const size_t atomic_bytes = attention_scratch_bytes(B, T, C, NH);
        setenv("FLASH_ATTN_DETERMINISTIC", "1", 1);
        const size_t deterministic_bytes = attention_scratch_bytes(B, T, C, NH);
        cudaCheck(cudaMalloc(&scratch, atomic_bytes > deterministic_bytes ? atomic_bytes : deterministic_bytes));
        const float fwd_ms = median_ms([&] { attention_forward(out, saved, qkv, B, T, C, NH); });
        float both_ms[2]; // dQ from its own kernel (the default), dQ by atomics
        for (int atomic_dq = 0; atomic_dq < 2; atomic_dq++) {
            setenv("FLASH_ATTN_DETERMINISTIC", atomic_dq ? "0" : "1", 1);
            both_ms[atomic_dq] = median_ms([&] {
                attention_forward(out, saved, qkv, B, T, C, NH);
                attention_backward(dqkv, NULL, scratch, dout, qkv, out, saved, B, T, C, NH, T); // no bias sums
            });
        }
        cudaCheck(cudaDeviceSynchronize());
        const double fwd_flops = 4.0 * B * NH * (double)T * T * HS / 2;
        printf("%d %d %.4f %.1f %.4f %.1f %.4f %.1f\n", T, B, fwd_ms, fwd_flops / fwd_ms / 1e9, both_ms[0],
               3.5 * fwd_flops / both_ms[0] / 1e9, both_ms[1], 3.5 * fwd_flops / both_ms[1] / 1e9);
        fflush(stdout);
        cudaCheck(cudaFree(qkv));
        cudaCheck(cudaFree(dout));
        cudaCheck(cudaFree(out));
        cudaCheck(cudaFree(dqkv));
        cudaCheck(cudaFree(saved));
        cudaCheck(cudaFree(scratch));
    }
    return 0;
}
