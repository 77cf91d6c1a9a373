// The linear layer, fp32 on the CPU: out = inp @ weight^T + bias and its backward.
//
// All three products are computed by one register-blocked tile: TILE_I x TILE_J sums
//     acc[i][j] += a_i[k] * b_k[j]
// where each a value is broadcast and b_k[0..TILE_J) is contiguous, two vectors, so each step is
// 2 TILE_I vector FMAs and the accumulators stay in vector registers over the whole k loop (with
// AVX2's 16, a few of them spill to the L1 cache). Every output element is one sum over k in
// increasing order, computed by one thread, so the results do not depend on the number of threads.
#include "kernels/checks.h"
#include "kernels/kernels.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

#define TILE_I 8
#define TILE_J 16
// matmul_backward's dinp: rows of dout per parallel work item, and rows of the weight per block
// (ROW_CHUNK x OC_BLOCK floats of dout and OC_BLOCK x TILE_J of the weight stay in the L2 cache).
#define ROW_CHUNK 64
#define OC_BLOCK 512

static inline int min_int(int a, int b) { return a < b ? a : b; }

// Half a tile row, TILE_J / 2 floats, as one value of GCC's vector extension (C as clang also
// compiles it): one AVX2 register, so the compiler does not have to discover the vectorisation
// itself, which it gets wrong for this loop nest. A whole row as one 16-float value was slower on
// an AVX2 CPU: GCC 12 kept the running sums on the stack and moved them through integer registers at
// every k (perf: under 2% of the samples on the FMAs; the CPU training step 2.2x slower).
typedef float vec_half __attribute__((vector_size(TILE_J / 2 * sizeof(float))));

// acc[i][j] += sum over k < K, in order, of a_rows[i][k * a_stride] * b[k * b_stride + j], for
// j < width. A ragged row of b (width < TILE_J) is padded with zeros. Rows of b start at any float,
// so they are loaded with memcpy (unaligned vector loads).
static void tile_multiply(float acc[TILE_I][TILE_J], const float* const a_rows[TILE_I], size_t a_stride,
                          const float* b, size_t b_stride, int K, int width) {
    vec_half lo[TILE_I], hi[TILE_I];
    for (int i = 0; i < TILE_I; i++) {
        memcpy(&lo[i], acc[i], sizeof(vec_half));
        memcpy(&hi[i], acc[i] + TILE_J / 2, sizeof(vec_half));
    }
    for (int k = 0; k < K; k++) {
        const float* b_k = b + (size_t)k * b_stride;
        vec_half b_lo, b_hi;
        if (width == TILE_J) { // straight from b (copied through a padded row, the loads wait on its stores)
            memcpy(&b_lo, b_k, sizeof(vec_half));
            memcpy(&b_hi, b_k + TILE_J / 2, sizeof(vec_half));
        } else {
            float b_row[TILE_J] = {0};
            memcpy(b_row, b_k, width * sizeof(float));
            memcpy(&b_lo, b_row, sizeof(vec_half));
            memcpy(&b_hi, b_row + TILE_J / 2, sizeof(vec_half));
        }
        for (int i = 0; i < TILE_I; i++) {
            const float a = a_rows[i][(size_t)k * a_stride];
            lo[i] += a * b_lo;
            hi[i] += a * b_hi;
        }
    }
    for (int i = 0; i < TILE_I; i++) {
        memcpy(acc[i], &lo[i], sizeof(vec_half));
        memcpy(acc[i] + TILE_J / 2, &hi[i], sizeof(vec_half));
    }
}

// out[n, oc] = (sum_c inp[n, c] weight[oc, c] + bias[oc]) + residual[n, oc]. The tile runs over i =
// oc and j = n, so it needs inp's columns contiguous: inp is first packed into panels of TILE_J
// rows, (C, TILE_J) each, zero past row N. Every output is one sum over k in order whatever N, so
// each row already has the bits of its group's product alone (group_rows, kernels.h).
void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                    const floatX* residual, int N, int C, int OC, int ld_inp, int group_rows) {
    check_linear_ld("matmul_forward", C, ld_inp);
    check_row_groups("matmul_forward", N, group_rows);
    int panels = (N + TILE_J - 1) / TILE_J;
    float* packed = xmalloc((size_t)panels * C * TILE_J * sizeof(float), "matmul_forward's packed input");
    #pragma omp parallel for collapse(2)
    for (int panel = 0; panel < panels; panel++) {
        for (int c = 0; c < C; c++) {
            float* dst = packed + ((size_t)panel * C + c) * TILE_J;
            for (int j = 0; j < TILE_J; j++) {
                int n = panel * TILE_J + j;
                dst[j] = n < N ? inp[(size_t)n * ld_inp + c] : 0.0f;
            }
        }
    }
    // Blocks of 8 tiles of weight rows; the panels of one block are consecutive iterations, which
    // a thread gets together, so the block's weight rows are reused from the L1 cache.
    const int oc_per_block = 8 * TILE_I;
    int blocks = (OC + oc_per_block - 1) / oc_per_block;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int block = 0; block < blocks; block++) {
        for (int panel = 0; panel < panels; panel++) {
            int oc_end = min_int(OC, (block + 1) * oc_per_block);
            for (int oc0 = block * oc_per_block; oc0 < oc_end; oc0 += TILE_I) {
                // Past OC the tile repeats the last row; those sums are not stored.
                const float* w_rows[TILE_I];
                float acc[TILE_I][TILE_J] = {{0}};
                for (int i = 0; i < TILE_I; i++) w_rows[i] = weight + (size_t)min_int(oc0 + i, OC - 1) * C;
                tile_multiply(acc, w_rows, 1, packed + (size_t)panel * C * TILE_J, TILE_J, C, TILE_J);
                int n_end = min_int(N - panel * TILE_J, TILE_J), i_end = min_int(OC - oc0, TILE_I);
                for (int j = 0; j < n_end; j++) {
                    const size_t row = (size_t)(panel * TILE_J + j) * OC + oc0;
                    for (int i = 0; i < i_end; i++)
                        out[row + i] = acc[i][j] + (bias ? bias[oc0 + i] : 0.0f) +
                                       (residual ? residual[row + i] : 0.0f);
                }
            }
        }
    }
    free(packed);
}

// dinp[n, c] = sum_oc dout[n, oc] weight[oc, c]: tiles of rows (i = n) x channels (j = c). A
// thread takes a chunk of ROW_CHUNK rows x TILE_J channels and walks the weight in blocks of OC_BLOCK
// rows, each used by all tiles of the chunk while it is in the L2 cache; a tile's partial sums over
// one block continue from the previous block's, so each sum still runs over oc in order. One
// parallel loop without inner barriers: on a busy machine a barrier waits for the slowest thread.
static void matmul_backward_dinp(float* dinp, const float* dout, const float* weight,
                                 int N, int C, int OC) {
    int row_chunks = (N + ROW_CHUNK - 1) / ROW_CHUNK, channel_tiles = (C + TILE_J - 1) / TILE_J;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int row_chunk = 0; row_chunk < row_chunks; row_chunk++) {
        for (int channel_tile = 0; channel_tile < channel_tiles; channel_tile++) {
            int c0 = channel_tile * TILE_J, width = min_int(C - c0, TILE_J);
            int n_end = min_int(N, (row_chunk + 1) * ROW_CHUNK);
            for (int oc_begin = 0; oc_begin < OC; oc_begin += OC_BLOCK) {
                int oc_count = min_int(OC_BLOCK, OC - oc_begin);
                for (int n0 = row_chunk * ROW_CHUNK; n0 < n_end; n0 += TILE_I) {
                    int i_end = min_int(N - n0, TILE_I);
                    // Past N the tile repeats the last row; those sums are not stored.
                    const float* dout_rows[TILE_I];
                    float acc[TILE_I][TILE_J];
                    for (int i = 0; i < TILE_I; i++) {
                        dout_rows[i] = dout + (size_t)min_int(n0 + i, N - 1) * OC + oc_begin;
                        for (int j = 0; j < TILE_J; j++)
                            acc[i][j] = oc_begin > 0 && i < i_end && j < width
                                            ? dinp[(size_t)(n0 + i) * C + c0 + j] : 0.0f;
                    }
                    tile_multiply(acc, dout_rows, 1, weight + (size_t)oc_begin * C + c0, C,
                                  oc_count, width);
                    for (int i = 0; i < i_end; i++)
                        for (int j = 0; j < width; j++) dinp[(size_t)(n0 + i) * C + c0 + j] = acc[i][j];
                }
            }
        }
    }
}

// dweight[oc, c] (= with GRAD_WRITE, else +=) sum_n dout[n, oc] inp[n, c], in groups of group_rows rows:
// tiles of weight rows (i = oc) x channels (j = c), each tile adding its groups' sums in row order
// (with GRAD_WRITE, the first group's written). inp's rows are ld_inp apart.
static void matmul_backward_dweight(float* dweight, const float* dout, const float* inp,
                                    int N, int C, int OC, int ld_inp, int group_rows, int mode) {
    int oc_tiles = (OC + TILE_I - 1) / TILE_I, channel_tiles = (C + TILE_J - 1) / TILE_J;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int oc_tile = 0; oc_tile < oc_tiles; oc_tile++) {
        for (int channel_tile = 0; channel_tile < channel_tiles; channel_tile++) {
            int oc0 = oc_tile * TILE_I, c0 = channel_tile * TILE_J;
            int i_end = min_int(OC - oc0, TILE_I), width = min_int(C - c0, TILE_J);
            for (int n0 = 0; n0 < N; n0 += group_rows) {
                // Past OC the tile repeats the last column of dout; those sums are not stored.
                const float* dout_columns[TILE_I];
                float acc[TILE_I][TILE_J] = {{0}};
                for (int i = 0; i < TILE_I; i++) dout_columns[i] = dout + (size_t)n0 * OC + min_int(oc0 + i, OC - 1);
                tile_multiply(acc, dout_columns, OC, inp + (size_t)n0 * ld_inp + c0, ld_inp, group_rows, width);
                const int write = mode == GRAD_WRITE && n0 == 0;
                for (int i = 0; i < i_end; i++)
                    for (int j = 0; j < width; j++) {
                        float* sum = &dweight[(size_t)(oc0 + i) * C + c0 + j];
                        *sum = write ? acc[i][j] : *sum + acc[i][j];
                    }
            }
        }
    }
}

// dbias[oc] += sum_n dout[n, oc] in groups of group_rows rows: threads split the columns, each
// summing the rows in order (the CPU does not use inp's bias columns: its sums stay these).
static void matmul_backward_dbias(float* dbias, const float* dout, int N, int OC, int group_rows) {
    #pragma omp parallel for schedule(static)
    for (int oc0 = 0; oc0 < OC; oc0 += TILE_J) {
        int width = min_int(OC - oc0, TILE_J);
        for (int n0 = 0; n0 < N; n0 += group_rows) {
            float sums[TILE_J] = {0};
            for (int n = n0; n < n0 + group_rows; n++)
                for (int j = 0; j < width; j++) sums[j] += dout[(size_t)n * OC + oc0 + j];
            for (int j = 0; j < width; j++) dbias[oc0 + j] += sums[j];
        }
    }
}

void matmul_backward(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                     const floatX* weight, int N, int C, int OC, int ld_inp, int group_rows, int dweight_mode) {
    check_row_groups("matmul_backward", N, group_rows);
    check_linear_ld("matmul_backward", C, ld_inp);
    if (dinp) matmul_backward_dinp(dinp, dout, weight, N, C, OC);
    if (dweight) matmul_backward_dweight(dweight, dout, inp, N, C, OC, ld_inp, group_rows, dweight_mode);
    if (dbias) matmul_backward_dbias(dbias, dout, N, OC, group_rows);
}

void matmul_backward_weights(float* dweight, float* dbias, const floatX* dout, const floatX* inp, int N, int C, int OC,
                             int ld_inp, int group_rows, int dweight_mode) {
    matmul_backward(NULL, dweight, dbias, dout, inp, NULL, N, C, OC, ld_inp, group_rows, dweight_mode);
}

void matmul_backward_wait(void) {} // matmul_backward_weights is complete on return
