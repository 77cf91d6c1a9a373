// The CPU backend's memory and device functions. "Device" memory is ordinary host memory, so
// uploads and downloads are copies and there is nothing to synchronise; floatX is float, so the
// conversions are copies too.
#include "kernels/kernels.h"
#include "common/util.h"

#include <curand.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char description[64] = "CPU fp32";

// There is one CPU "device"; the index only selects a GPU in the CUDA backend.
void backend_init(int device_index) {
    (void)device_index;
    snprintf(description, sizeof(description), "CPU fp32, %d threads", omp_get_max_threads());
}

const char* backend_describe(void) { return description; }

// MFU is a GPU measure: the CPU has no peak of its own (--peak-tflops gives one).
double backend_peak_flops(void) { return 0.0; }
const char* backend_peak_source(void) { return "no peak known for the CPU"; }

int backend_memory(size_t* free_bytes, size_t* total_bytes) {
    host_memory(free_bytes, total_bytes);
    return 0;
}

// 64-byte alignment: a cache line, and whole AVX-512 vectors for the kernels' inner loops.
void* dev_malloc(size_t bytes, const char* what) {
    void* p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0)
        fatal("out of host memory: %s needs %zu bytes (%.1f MiB); lower the batch size or the "
              "sequence length", what, bytes, (double)bytes / (1 << 20));
    return p;
}

void dev_free(void* p) { free(p); }

void dev_memset_zero(void* p, size_t bytes) { memset(p, 0, bytes); }

void dev_upload(void* dst_dev, const void* src_host, size_t bytes) { memcpy(dst_dev, src_host, bytes); }

void dev_download(void* dst_host, const void* src_dev, size_t bytes) { memcpy(dst_host, src_dev, bytes); }

void dev_copy(void* dst_dev, const void* src_dev, size_t bytes) { memmove(dst_dev, src_dev, bytes); }

// Every CPU kernel has finished when it returns.
void dev_synchronize(void) {}
void* dev_malloc_host(size_t bytes, const char* what) { return xmalloc(bytes, what); }
void dev_free_host(void* p) { free(p); }
void dev_upload_async(void* dst_dev, const void* src_host, size_t bytes) { memcpy(dst_dev, src_host, bytes); }
void dev_download_async(void* dst_host, const void* src_dev, size_t bytes) { memcpy(dst_host, src_dev, bytes); }
void dev_wait_downloads(void) {}
void dev_slot_upload(int slot, void* dst_dev, const void* src_host, size_t bytes) {
    (void)slot;
    memcpy(dst_dev, src_host, bytes);
}
void dev_slot_ready(int slot) { (void)slot; }
void dev_slot_download(int slot, void* dst_host, const void* src_dev, size_t bytes) {
    (void)slot;
    memcpy(dst_host, src_dev, bytes);
}

// memmove: a caller may convert in place.
void floatX_from_float(floatX* dst, const float* src, size_t n) { memmove(dst, src, n * sizeof(float)); }

void float_from_floatX(float* dst, const floatX* src, size_t n) { memmove(dst, src, n * sizeof(float)); }

void float_accumulate(float* dst, const float* src, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

static void check_curand(curandStatus_t status, const char* call) {
    if (status != CURAND_STATUS_SUCCESS) fatal("%s failed with cuRAND status %d", call, (int)status);
}

// The offset counts single values of the generator's sequence: value i of a run started at offset
// k is value k + i of a run started at offset 0 (checked by tests/unit/test_kernels_cpu.c).
// curandGenerateNormal makes its values in Box-Muller pairs and may refuse an odd count, so an odd
// n gets its last value from a pair generated at offset + n - 1.
void init_normal(float* dst, size_t n, float mean, float std, unsigned long long seed,
                 unsigned long long offset) {
    curandGenerator_t gen;
    check_curand(curandCreateGeneratorHost(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10),
                 "curandCreateGeneratorHost");
    check_curand(curandSetPseudoRandomGeneratorSeed(gen, seed), "curandSetPseudoRandomGeneratorSeed");
    size_t even = n & ~(size_t)1;
    if (even > 0) {
        check_curand(curandSetGeneratorOffset(gen, offset), "curandSetGeneratorOffset");
        check_curand(curandGenerateNormal(gen, dst, even, mean, std), "curandGenerateNormal");
    }
    if (n != even) {
        float pair[2];
        check_curand(curandSetGeneratorOffset(gen, offset + even), "curandSetGeneratorOffset");
        check_curand(curandGenerateNormal(gen, pair, 2, mean, std), "curandGenerateNormal");
        dst[even] = pair[0];
    }
    check_curand(curandDestroyGenerator(gen), "curandDestroyGenerator");
}
