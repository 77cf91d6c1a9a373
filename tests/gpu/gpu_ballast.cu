// Holds GPU memory so that only a given number of bytes stays free: a large GPU stands in for a
// smaller one (tests/gpu/test_long_context.sh checks what trains within 24 GB on an H100 or H200).
// Usage: gpu_ballast FREE_BYTES   prints "holding N bytes, F free" once allocated, then keeps the
// memory until it is killed.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FREE_BYTES\n", argv[0]);
        return 2;
    }
    size_t want_free = strtoull(argv[1], NULL, 10), free_bytes, total_bytes;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        fprintf(stderr, "gpu_ballast: no usable GPU\n");
        return 1;
    }
    if (free_bytes <= want_free) {
        fprintf(stderr, "gpu_ballast: only %zu bytes are free, fewer than the %zu asked to leave\n", free_bytes, want_free);
        return 1;
    }
    size_t hold = free_bytes - want_free;
    void* p;
    if (cudaMalloc(&p, hold) != cudaSuccess) {
        fprintf(stderr, "gpu_ballast: cannot allocate %zu bytes\n", hold);
        return 1;
    }
    cudaMemGetInfo(&free_bytes, &total_bytes);
    printf("holding %zu bytes, %zu free\n", hold, free_bytes);
    fflush(stdout);
    for (;;) pause();
}
