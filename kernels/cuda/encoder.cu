// Token + position embedding. The backward is deterministic without float atomics: the positions
// are bucketed by token on the host, then one thread per (token, channel) sums its positions in
// order and is the only writer of that dwte element.
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte,
                                       const floatX* wpe, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * T * C) return;
    size_t row = i / C;
    int c = (int)(i % C), t = (int)(row % T);
    out[i] = (floatX)((float)wte[(size_t)inp[row] * C + c] + (float)wpe[(size_t)t * C + c]);
}

void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                     int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    encoder_forward_kernel<<<ceil_div(n, 256), 256>>>(out, inp, wte, wpe, B, T, C);
    launchCheck();
}

// blockIdx.x is a distinct token; rows[bucket_start[y] .. bucket_start[y+1]) are its positions in
// increasing order. The positions of one sequence (of T) are summed, then added to dwte sequence
// after sequence, so the sum does not depend on how many sequences a batch holds.
__global__ void encoder_backward_wte_kernel(float* dwte, const floatX* dout, const int* tokens,
                                            const int* bucket_start, const int* rows, int T, int C) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int bucket = blockIdx.x;
    float total = dwte[(size_t)tokens[bucket] * C + c], sum = 0.0f;
    int sequence = rows[bucket_start[bucket]] / T;
    for (int k = bucket_start[bucket]; k < bucket_start[bucket + 1]; k++) {
        if (rows[k] / T != sequence) {
            total += sum;
            sum = 0.0f;
            sequence = rows[k] / T;
        }
        sum += (float)dout[(size_t)rows[k] * C + c];
    }
    dwte[(size_t)tokens[bucket] * C + c] = total + sum;
}

// Each sequence's gradient goes straight into dwpe, in order.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float total = dwpe[i];
    for (int b = 0; b < B; b++) total += (float)dout[(size_t)b * T * C + i];
    dwpe[i] = total;
}

void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const int* inp,
                      int B, int T, int C) {
    int N = B * T;
    // Host copy of the tokens, then a counting sort of the positions by token (stable, so each
    // bucket lists its positions in increasing order). Layout of `lists`: tokens[distinct],
    // bucket_start[distinct + 1], rows[N].
    static int *host_inp, *host_lists;
    static size_t host_capacity;
    static void* dev_lists;
    static size_t dev_capacity;
    if ((size_t)N > host_capacity) {
        free(host_inp);
        free(host_lists);
        host_inp = (int*)xmalloc((size_t)N * sizeof(int), "encoder_backward tokens");
        host_lists = (int*)xmalloc((3 * (size_t)N + 1) * sizeof(int), "encoder_backward buckets");
        host_capacity = N;
    }
    dev_download(host_inp, inp, (size_t)N * sizeof(int));
    int max_token = 0;
    for (int i = 0; i < N; i++) {
        if (host_inp[i] < 0) fatal("encoder_backward: negative token %d at position %d", host_inp[i], i);
        if (host_inp[i] > max_token) max_token = host_inp[i];
    }
    // start[v] = first slot of token v in rows, from the counts' prefix sums.
    int* start = (int*)xcalloc((size_t)max_token + 2, sizeof(int), "encoder_backward counts");
    for (int i = 0; i < N; i++) start[host_inp[i] + 1]++;
    int distinct = 0;
    for (int v = 0; v <= max_token; v++) {
        distinct += start[v + 1] > 0;
        start[v + 1] += start[v];
    }
    int *tokens = host_lists, *bucket_start = tokens + distinct, *rows = bucket_start + distinct + 1;
    for (int v = 0, d = 0; v <= max_token; v++)
        if (start[v + 1] > start[v]) {
            tokens[d] = v;
            bucket_start[d++] = start[v];
        }
    bucket_start[distinct] = N;
    for (int i = 0; i < N; i++) rows[start[host_inp[i]]++] = i;
    free(start);
    size_t list_bytes = (2 * (size_t)distinct + 1 + N) * sizeof(int);
    int* lists = (int*)grow_scratch(&dev_lists, &dev_capacity, list_bytes, "encoder_backward buckets");
    dev_upload(lists, host_lists, list_bytes);

    dim3 grid(distinct, ceil_div(C, 128));
    encoder_backward_wte_kernel<<<grid, 128>>>(dwte, dout, lists, lists + distinct,
                                               lists + 2 * distinct + 1, T, C);
    launchCheck();
    encoder_backward_wpe_kernel<<<ceil_div((size_t)T * C, 256), 256>>>(dwpe, dout, B, T, C);
    launchCheck();
}
