// The head of one slice of rows (kernels.h, head_classifier): the logits, the classifier's losses and
// dlogits, and the head's backward. Elsewhere (sm75/80/86/89, FP32, FP16, operands the kernel does
// not take) as the CPU computes it: matmul_forward, fused_classifier, matmul_backward. On H100/H200 (sm_90a,
// BF16) the logits are never stored, which saves the classifier's pass over them (13.2 GB a GPT-2
// 124M step of 64K tokens):
//   - each row's target logit b_r = inp_r . weight_target, a dot product in fp32 (head_shift_kernel);
//   - our wgmma product (matmul_wgmma.cuh) with the epilogue below: it stages each fp32 sum less its
//     row's b_r in fp16 (4 times bf16's precision, and the range that exp needs), and stores
//     p~ = bf16(exp(l - b_r)), 0 on the padding columns, with the sum of each row's p~ in each tile;
//   - a pass per row (head_rows_kernel): S = the sum of the row's tiles, in order; the loss log S
//     (b_r is the target's logit, so exactly -log p_target); with dloss, the target's element
//     written over as p~_t - S, so that the row is S / dloss times dlogits' row (p~_v = S p_v,
//     p~_t - S = S (p_t - 1): the target's cancellation made in fp32 before rounding, as
//     fused_classifier makes it); the row's scale dloss / S, and inp's row times it;
//   - cuBLASLt's products on that matrix: dinp = (matrix @ weight), then each row times its scale;
//     dweight += (or =, dweight_mode) matrix^T @ (inp's rows times their scales).
// A row whose largest logit lies more than about 60 nats above its target's (S > HEAD_RANGE, or
// exponentials that overflowed) would leave the range of the scales. Such a row is far: one of its
// tile sums passes HEAD_RANGE / the tiles a row (so every row whose S may pass HEAD_RANGE), or is not a
// number. The epilogue marks the row block of a far row, and the product is made again over the marked
// row blocks alone, twice: for each row's largest l - b_r, m_r (RowMaxEpilogue), then, once
// head_far_shift_kernel has found the far rows again by their tile sums, for p~ with each far row's
// sums less b_r + m_r instead (its loss adds m_r back). The other rows of those row blocks are made
// again with the bits they had.
// A run that is not diverging has no far rows, and these launches end at once; with every row of a
// slice far, the head takes about two products longer (docs/performance.md).
// FP16 cannot take this form: p~ = exp(l - b_r) reaches HEAD_RANGE (1e26), far beyond fp16's 65504.
// Against float64, this form's losses and gradients are 3 to 10 times closer than those made from the
// other path's bf16 logits and dlogits (a simulation), and the step is shorter by the pass it saves
// (docs/performance.md).
#include <cuda_fp16.h>

#include "kernels/cuda/common.cuh"
#if defined(PRECISION_BF16)
#include "kernels/cuda/matmul_wgmma.cuh"
#endif

// S above this leaves the row to be computed again: dloss / S stays a normal float and inp's rows
// times it normal bf16s, and the product's sums (up to S |weight| a row) far from overflow.
#define HEAD_RANGE 1e26f
#define HEAD_ROW_THREADS 256

#if defined(PRECISION_BF16)
// The scratch: p~ (N, Vp), the tiles' row sums and maxima (N, column blocks), the rows' shifts b_r
// (N; b_r + m_r for a far row), the far rows' m_r (N; 0 for the others), the rows' scales (N), inp's
// rows times them (N, C), whether each row block holds a far row (row blocks, then whether any does:
// wgmma_product::launch's row_blocks_taken).
struct HeadScratch {
    floatX* probs;
    float *tile_sums, *tile_maxes, *shift, *offset, *scale;
    floatX* scaled_inp;
    int* far_blocks;
};
// Its parts at 256-byte aligned offsets from base; *bytes: the whole.
static HeadScratch head_scratch(void* base, int N, int C, int Vp, size_t* bytes) {
    size_t used = 0;
    auto part = [&](size_t size) {
        unsigned char* p = (unsigned char*)base + used;
        used += (size + 255) / 256 * 256;
        return p;
    };
    HeadScratch s;
    const size_t tiles = (size_t)N * ceil_div(Vp, wgmma_product::BN);
    s.probs = (floatX*)part((size_t)N * Vp * sizeof(floatX));
    s.tile_sums = (float*)part(tiles * sizeof(float));
    s.tile_maxes = (float*)part(tiles * sizeof(float));
    s.shift = (float*)part((size_t)N * sizeof(float));
    s.offset = (float*)part((size_t)N * sizeof(float));
    s.scale = (float*)part((size_t)N * sizeof(float));
    s.scaled_inp = (floatX*)part((size_t)N * C * sizeof(floatX));
    s.far_blocks = (int*)part(((size_t)ceil_div(N, wgmma_product::BM) + 1) * sizeof(int));
    *bytes = used;
    return s;
}
size_t head_scratch_bytes(int N, int C, int Vp) {
    size_t bytes;
    head_scratch(NULL, N, C, Vp, &bytes);
    return bytes;
}

using namespace wgmma_product;

// Each of thread t's CHUNKS_PER_THREAD rows' values (one from each of its row's 8 neighbouring lanes,
// t / 8 the same), reduced in a fixed order by op; row(r, reduced) is called on the row's first lane
// for each row r inside the tile and N.
template <class Op, class Row>
__device__ __forceinline__ void reduce_rows(const float (&values)[CHUNKS_PER_THREAD], Op op, int t, int row0, int N,
                                            Row row) {
#pragma unroll
    for (int u = 0; u < CHUNKS_PER_THREAD; u++) {
        float v = values[u];
        v = op(v, __shfl_xor_sync(0xffffffff, v, 1));
        v = op(v, __shfl_xor_sync(0xffffffff, v, 2));
        v = op(v, __shfl_xor_sync(0xffffffff, v, 4));
        const int r = row0 + t / 8 + u * (EPILOGUE_THREADS / 8);
        if (t % 8 == 0 && t + u * EPILOGUE_THREADS < PANEL_CHUNKS && r < N) row(r, v);
    }
}

// Whether a tile's sum of p~ makes its row far: above far_tile_sum (HEAD_RANGE / the tiles a row), or
// not a number. The epilogue marks row blocks by it and head_far_shift_kernel finds their rows again.
__device__ __forceinline__ bool is_far_tile_sum(float sum, float far_tile_sum) { return !(sum <= far_tile_sum); }

// The epilogue (warps 1-3): p~ = exp(staged value) in place, 0 from column V on, each row's sum of
// the tile's p~ (fp32, before the rounding) into tile_sums, and p~'s TMA store, panel by panel.
// Where far_blocks is not NULL, a row with a far tile sum (is_far_tile_sum) marks its row block there.
struct ProbabilitiesEpilogue {
    struct Params {
        const float* shift;
        CUtensorMap probs_map;
        float* tile_sums;
        int V;
        int* far_blocks;
        float far_tile_sum;
    };
    static constexpr int ROW_GROUP = 32; // the head's weight (77 MB at GPT-2's) is larger than the L2
    static constexpr bool HAS_BIAS = false, SHIFT_ROWS = true;
    __device__ static uint32_t pack(float lo, float hi) {
        const __half2 v = __floats2half2_rn(lo, hi);
        return *(const uint32_t*)&v;
    }
    __device__ __forceinline__ static void store(const Params& params, unsigned char* staged, int row0, int col_block,
                                                 int N, int OC) {
        const int t = threadIdx.x - EPILOGUE_FIRST, col0 = col_block * BN, col_blocks = (OC + BN - 1) / BN;
        constexpr int PER = CHUNKS_PER_THREAD;
        const PanelChunkOffsets chunk_offset(t); // the panel's chunks as store_panel lays them out
        float row_sums[PER];
#pragma unroll
        for (int u = 0; u < PER; u++) row_sums[u] = 0.0f;
        for (int panel = 0; panel < BN / 64; panel++) {
            const uint32_t panel_address = smem_address(staged + panel * (BM * 128));
            uint4 v[PER]; // 8 fp16 each, in 4 words
#pragma unroll
            for (int u = 0; u < PER; u++) v[u] = load_shared_16(panel_address + chunk_offset(u));
            const int col = col0 + panel * 64 + (t % 8) * 8; // the chunks' first column
#pragma unroll
            for (int u = 0; u < PER; u++) {
                uint32_t* w = &v[u].x;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float2 x = __half22float2(*(const __half2*)&w[k]);
                    const float lo = col + 2 * k < params.V ? fast_exp2(x.x * LOG2E) : 0.0f;
                    const float hi = col + 2 * k + 1 < params.V ? fast_exp2(x.y * LOG2E) : 0.0f;
                    row_sums[u] += lo + hi;
                    w[k] = pack_floatX2(lo, hi);
                }
            }
            store_panel(v, staged + panel * (BM * 128), chunk_offset, &params.probs_map, col0 + 64 * panel, row0);
        }
        reduce_rows(row_sums, [](float a, float b) { return a + b; }, t, row0, N, [&](int row, float sum) {
            params.tile_sums[(size_t)row * col_blocks + col_block] = sum;
            if (params.far_blocks && is_far_tile_sum(sum, params.far_tile_sum)) {
                params.far_blocks[row / BM] = 1;
                params.far_blocks[(N + BM - 1) / BM] = 1;
            }
        });
        if (t == 0) bulk_wait_all<true>();
        named_barrier_sync(1, EPILOGUE_THREADS);
    }
};

// The far rows' epilogue: each row's maximum of the tile's staged l - b_r (bf16, whose range is fp32's)
// over the real columns into tile_maxes; it stores no tile.
struct RowMaxEpilogue {
    struct Params {
        const float* shift;
        float* tile_maxes;
        int V;
    };
    static constexpr int ROW_GROUP = ProbabilitiesEpilogue::ROW_GROUP;
    static constexpr bool HAS_BIAS = false, SHIFT_ROWS = true;
    __device__ static uint32_t pack(float lo, float hi) { return pack_floatX2(lo, hi); }
    __device__ __forceinline__ static void store(const Params& params, unsigned char* staged, int row0, int col_block,
                                                 int N, int OC) {
        const int t = threadIdx.x - EPILOGUE_FIRST, col0 = col_block * BN, col_blocks = (OC + BN - 1) / BN;
        constexpr int PER = CHUNKS_PER_THREAD;
        const PanelChunkOffsets chunk_offset(t);
        float row_maxes[PER];
#pragma unroll
        for (int u = 0; u < PER; u++) row_maxes[u] = -INFINITY;
        for (int panel = 0; panel < BN / 64; panel++) {
            const uint32_t panel_address = smem_address(staged + panel * (BM * 128));
            const int col = col0 + panel * 64 + (t % 8) * 8;
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const uint4 v = load_shared_16(panel_address + chunk_offset(u));
                const floatX* x = (const floatX*)&v;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if (col + k < params.V) row_maxes[u] = fmaxf(row_maxes[u], (float)x[k]);
            }
        }
        reduce_rows(row_maxes, [](float a, float b) { return fmaxf(a, b); }, t, row0, N,
                    [&](int row, float m) { params.tile_maxes[(size_t)row * col_blocks + col_block] = m; });
        named_barrier_sync(1, EPILOGUE_THREADS); // the staged tile read by all three warps
    }
};

// shift[r] = inp_r . weight_targets[r] in fp32, a warp a row; the far marks cleared, and the row's
// offset (m_r) 0.
__global__ void head_shift_kernel(HeadScratch s, const floatX* inp, const floatX* weight, const int* targets, int N,
                                  int C) {
    const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= N) return;
    const floatX* x = inp + (size_t)r * C;
    const floatX* w = weight + (size_t)targets[r] * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += (float)x[c] * (float)w[c];
    sum = warp_sum(sum);
    if (lane == 0) {
        s.shift[r] = sum;
        s.offset[r] = 0.0f;
        if (r % wgmma_product::BM == 0) s.far_blocks[r / wgmma_product::BM] = 0;
        if (r == 0) s.far_blocks[(N + wgmma_product::BM - 1) / wgmma_product::BM] = 0;
    }
}

// Each far row's m_r, the largest of its tile maxima, added to its shift; a block a row block, a warp a
// row. A row is far where one of its first product's tile sums, still in tile_sums, is far
// (is_far_tile_sum), as the epilogue that marked its row block found. The other rows keep their b_r,
// so that the product made again gives them the bits they had.
__global__ void head_far_shift_kernel(HeadScratch s, int N, int col_blocks, float far_tile_sum) {
    const int row_blocks = (N + wgmma_product::BM - 1) / wgmma_product::BM, lane = threadIdx.x % 32;
    if (!s.far_blocks[row_blocks] || !s.far_blocks[blockIdx.x]) return;
    for (int r = blockIdx.x * wgmma_product::BM + threadIdx.x / 32; r < min(N, (blockIdx.x + 1) * wgmma_product::BM);
         r += blockDim.x / 32) {
        bool far = false;
        for (int cb = lane; cb < col_blocks; cb += 32)
            far |= is_far_tile_sum(s.tile_sums[(size_t)r * col_blocks + cb], far_tile_sum);
        if (!__any_sync(0xffffffffu, far)) continue;
        float m = -INFINITY;
        for (int cb = lane; cb < col_blocks; cb += 32) m = fmaxf(m, s.tile_maxes[(size_t)r * col_blocks + cb]);
        m = warp_max(m);
        if (lane == 0) {
            const float shifted = s.shift[r] + m;
            s.offset[r] = shifted - s.shift[r]; // the shift's m_r as the product will take it away
            s.shift[r] = shifted;
        }
    }
}

__global__ void __launch_bounds__(HEAD_ROW_THREADS)
    head_rows_kernel(HeadScratch s, float* losses, const int* targets, float dloss, const floatX* inp, int C, int Vp) {
    const int r = blockIdx.x, col_blocks = (Vp + wgmma_product::BN - 1) / wgmma_product::BN;
    floatX* probs = s.probs + (size_t)r * Vp;
    const int target = targets[r];
    __shared__ float row_sum;
    if (threadIdx.x < 32) {
        float sum = 0.0f;
        for (int cb = threadIdx.x; cb < col_blocks; cb += 32) sum += s.tile_sums[(size_t)r * col_blocks + cb];
        sum = warp_sum(sum);
        if (threadIdx.x == 0) row_sum = sum;
    }
    __syncthreads();
    const float S = row_sum;
    if (threadIdx.x == 0) losses[r] = logf(S) + s.offset[r];
    if (dloss <= 0.0f) return;
    const float scale = dloss / S;
    if (threadIdx.x == 0) {
        probs[target] = (floatX)((float)probs[target] - S);
        s.scale[r] = scale;
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s.scaled_inp[(size_t)r * C + c] = (floatX)((float)inp[(size_t)r * C + c] * scale);
}

// d (N, C) row r times scale[r], 16 bytes a thread (C a multiple of 8).
__global__ void scale_rows_kernel(floatX* d, const float* scale, int N, int C) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= (size_t)N * C) return;
    PackedX v = *(PackedX*)(d + i);
    const float row_scale = scale[i / C];
    for (int k = 0; k < X128; k++) v.v[k] = (floatX)((float)v.v[k] * row_scale);
    *(PackedX*)(d + i) = v;
}

static bool head_kernel_available(void) {
    static int available = -1;
    if (available < 0)
        available = wgmma_product::kernel_runs<ProbabilitiesEpilogue>() && wgmma_product::kernel_runs<RowMaxEpilogue>();
    return available;
}
#else
size_t head_scratch_bytes(int N, int C, int Vp) {
    (void)C;
    return (size_t)N * Vp * sizeof(floatX);
}
#endif

void head_classifier(float* losses, floatX* dinp, float* dweight, void* scratch, const int* targets, float dloss,
                     const floatX* inp, const floatX* weight, int N, int C, int V, int Vp, int group_rows,
                     int dweight_mode) {
    check_row_groups("head_classifier", N, group_rows);
#if defined(PRECISION_BF16)
    // TMA and the 16-byte passes want 16-byte aligned rows and bases.
    const bool aligned = aligned16(inp, weight, scratch, dinp) && C % 8 == 0 && Vp % 8 == 0;
    if (N > 0 && aligned && head_kernel_available()) {
        size_t bytes;
        const HeadScratch s = head_scratch(scratch, N, C, Vp, &bytes);
        const int col_blocks = ceil_div(Vp, wgmma_product::BN);
        head_shift_kernel<<<ceil_div(N, 8), 256>>>(s, inp, weight, targets, N, C);
        launchCheck();
        ProbabilitiesEpilogue::Params params = {
            s.shift,
            tensor_map_3d(s.probs, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(floatX), 1, N, Vp, Vp, wgmma_product::BM),
            s.tile_sums, V, s.far_blocks, HEAD_RANGE / col_blocks};
        wgmma_product::launch<ProbabilitiesEpilogue>(params, inp, weight, N, C, Vp, C);
        // The far rows' row blocks again (none, so three launches that end at once, in a run not diverging).
        const RowMaxEpilogue::Params max_params = {s.shift, s.tile_maxes, V};
        wgmma_product::launch<RowMaxEpilogue>(max_params, inp, weight, N, C, Vp, C, s.far_blocks);
        head_far_shift_kernel<<<ceil_div(N, wgmma_product::BM), 256>>>(s, N, col_blocks, params.far_tile_sum);
        launchCheck();
        params.far_blocks = NULL;
        wgmma_product::launch<ProbabilitiesEpilogue>(params, inp, weight, N, C, Vp, C, s.far_blocks);
        head_rows_kernel<<<N, HEAD_ROW_THREADS>>>(s, losses, targets, dloss, inp, C, Vp);
        launchCheck();
        if (dloss > 0.0f) {
            matmul_backward(dinp, NULL, NULL, s.probs, inp, weight, N, C, Vp, C, group_rows, GRAD_ADD);
            scale_rows_kernel<<<ceil_div((size_t)N * C / X128, 256), 256>>>(dinp, s.scale, N, C);
            launchCheck();
            matmul_backward(NULL, dweight, NULL, s.probs, s.scaled_inp, weight, N, C, Vp, C, group_rows,
                            dweight_mode);
        }
        return;
    }
#endif
    floatX* logits = (floatX*)scratch;
    matmul_forward(logits, inp, weight, NULL, NULL, N, C, Vp, C, group_rows);
    fused_classifier(logits, losses, targets, dloss, N, V, Vp, dloss > 0.0f);
    if (dloss > 0.0f)
        matmul_backward(dinp, dweight, NULL, logits, inp, weight, N, C, Vp, C, group_rows, dweight_mode);
}
