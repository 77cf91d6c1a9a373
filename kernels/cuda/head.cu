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
// exponentials that overflowed) would leave the range of the scales; the row pass then computes that
// row's logits again in fp32, shifted by their max: slow (a block a row reads the whole weight twice,
// a thread a logit; with every row of a slice there, the head takes about a thousand times as long),
// but a run that is not diverging has no such rows.
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
// The scratch: p~ (N, Vp), the tiles' row sums (N, column blocks), b_r (N), the rows' scales (N)
// and inp's rows times them (N, C).
struct HeadScratch {
    floatX* probs;
    float *tile_sums, *shift, *scale;
    floatX* scaled_inp;
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
    s.probs = (floatX*)part((size_t)N * Vp * sizeof(floatX));
    s.tile_sums = (float*)part((size_t)N * ceil_div(Vp, wgmma_product::BN) * sizeof(float));
    s.shift = (float*)part((size_t)N * sizeof(float));
    s.scale = (float*)part((size_t)N * sizeof(float));
    s.scaled_inp = (floatX*)part((size_t)N * C * sizeof(floatX));
    *bytes = used;
    return s;
}
size_t head_scratch_bytes(int N, int C, int Vp) {
    size_t bytes;
    head_scratch(NULL, N, C, Vp, &bytes);
    return bytes;
}

using namespace wgmma_product;

// The epilogue (warps 1-3): p~ = exp(staged value) in place, 0 from column V on, each row's sum of
// the tile's p~ (fp32, before the rounding) into tile_sums, and p~'s TMA store, panel by panel.
struct ProbabilitiesEpilogue {
    struct Params {
        const float* shift;
        CUtensorMap probs_map;
        float* tile_sums;
        int V;
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
        const int r0 = t / 8;                    // thread t's chunk u is in panel row r0 + 12 u
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
        // A row's 8 chunks are 8 neighbouring lanes' (t / 8 the same): their sums, in a fixed order.
#pragma unroll
        for (int u = 0; u < PER; u++) {
            float sum = row_sums[u];
            sum += __shfl_xor_sync(0xffffffff, sum, 1);
            sum += __shfl_xor_sync(0xffffffff, sum, 2);
            sum += __shfl_xor_sync(0xffffffff, sum, 4);
            const int row = row0 + r0 + u * (EPILOGUE_THREADS / 8);
            if (t % 8 == 0 && t + u * EPILOGUE_THREADS < PANEL_CHUNKS && row < N)
                params.tile_sums[(size_t)row * col_blocks + col_block] = sum;
        }
        if (t == 0) bulk_wait_all<true>();
        named_barrier_sync(1, EPILOGUE_THREADS);
    }
};

// shift[r] = inp_r . weight_targets[r] in fp32, a warp a row.
__global__ void head_shift_kernel(float* shift, const floatX* inp, const floatX* weight, const int* targets, int N,
                                  int C) {
    const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= N) return;
    const floatX* x = inp + (size_t)r * C;
    const floatX* w = weight + (size_t)targets[r] * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += (float)x[c] * (float)w[c];
    sum = warp_sum(sum);
    if (lane == 0) shift[r] = sum;
}

// Row r's logits again in fp32 (inp_r . weight_v), p~ = exp(l - their max) over the row, its loss,
// and S. For a row past HEAD_RANGE only: each thread makes C multiply-adds per logit, twice.
__device__ float recompute_row(floatX* probs, float* loss, const floatX* x, const floatX* weight, int target, int C,
                               int V, int Vp) {
    auto logit = [&](int v) {
        const floatX* w = weight + (size_t)v * C;
        float sum = 0.0f;
        for (int c = 0; c < C; c++) sum += (float)x[c] * (float)w[c];
        return sum;
    };
    float m = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, logit(v));
    const float row_max = block_max(m);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
        const float p = v < V ? expf(logit(v) - row_max) : 0.0f;
        probs[v] = (floatX)p;
        sum += p;
    }
    const float S = block_sum(sum); // its barriers also publish the row's p~
    if (threadIdx.x == 0) *loss = logf(S) + row_max - logit(target);
    return S;
}

__global__ void __launch_bounds__(HEAD_ROW_THREADS)
    head_rows_kernel(HeadScratch s, float* losses, const int* targets, float dloss, const floatX* inp,
                     const floatX* weight, int C, int V, int Vp) {
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
    float S = row_sum;
    if (S <= HEAD_RANGE) {
        if (threadIdx.x == 0) losses[r] = logf(S);
    } else {
        S = recompute_row(probs, losses + r, inp + (size_t)r * C, weight, target, C, V, Vp);
    }
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
    if (available < 0) available = wgmma_product::kernel_runs<ProbabilitiesEpilogue>();
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
    const bool aligned = ((uintptr_t)inp | (uintptr_t)weight | (uintptr_t)scratch | (uintptr_t)dinp) % 16 == 0 &&
                         C % 8 == 0 && Vp % 8 == 0;
    if (N > 0 && aligned && head_kernel_available()) {
        size_t bytes;
        const HeadScratch s = head_scratch(scratch, N, C, Vp, &bytes);
        head_shift_kernel<<<ceil_div(N, 8), 256>>>(s.shift, inp, weight, targets, N, C);
        launchCheck();
        const ProbabilitiesEpilogue::Params params = {
            s.shift,
            tensor_map_3d(s.probs, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(floatX), 1, N, Vp, Vp, wgmma_product::BM),
            s.tile_sums, V};
        wgmma_product::launch<ProbabilitiesEpilogue>(params, inp, weight, N, C, Vp, C);
        head_rows_kernel<<<N, HEAD_ROW_THREADS>>>(s, losses, targets, dloss, inp, weight, C, V, Vp);
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
