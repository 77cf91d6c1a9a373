// The fc layer's forward with its GELU (kernels.h, matmul_forward_gelu): pre = inp weight^T + bias,
// rounded once, and out = gelu(pre) with gelu_forward's bits.
//
// cuBLASLt has no epilogue that computes our GELU on the rounded product (its GELU_AUX works on the
// fp32 sums with a GELU of its own, so recompute, which rebuilds out from pre with gelu_forward,
// would change the numbers). So cuBLASLt writes pre and gelu_forward reads it back: 403 MB each way
// per GPT-2 124M layer at 64K tokens, about half the product's own time. On H100/H200
// (sm_90a, BF16) one kernel of ours does both: our wgmma product (matmul_wgmma.cuh) with the GELU
// epilogue below, which stores pre by TMA panel by panel and, as each panel's store has read it,
// turns that panel into gelu(pre) in place (a thread's chunks of the panel all loaded first, for
// the latency) and stores it to out, beside the next tile's product. Elsewhere (and for shapes it
// does not take): matmul_forward, then gelu_forward. The FP16 build takes that way on H100/H200 too:
// the epilogue turns bf16 bits into floats by shifting them, and FP16 is for cards without bf16
// (Turing), where speed on an H100 matters little; cuBLASLt's fp16 product is the simplest right one.
#include "kernels/cuda/gelu.cuh"
#if defined(PRECISION_BF16)
#include "kernels/cuda/matmul_wgmma.cuh"
#endif

#if defined(PRECISION_BF16)
using namespace wgmma_product;

struct GeluEpilogue {
    struct Params {
        const floatX* bias;
        CUtensorMap pre_map, out_map;
    };
    static constexpr int ROW_GROUP = 0;
    static constexpr bool HAS_BIAS = true, SHIFT_ROWS = false;
    __device__ static uint32_t pack(float lo, float hi) { return pack_floatX2(lo, hi); }
    // The epilogue (warps 1-3): stores the staged tile at (row0, col0) to pre, then gelu of it to out,
    // panel by panel. Its thread 0's bulk groups are pre's BN / 64 panels, then out's in turn: before
    // panel p's GELU, at most BN / 64 - 1 groups may still be reading (pre's later panels and out's
    // earlier ones). The epilogue's three warps take longer than the product (a trace's samples: the
    // multiplying warps' most waited-for barrier is staged_free), so its shared-memory chunks are
    // addressed with a thread's two offsets and constants, by ld/st.shared (through a generic pointer,
    // each chunk cost its address arithmetic and a generic load).
    __device__ __forceinline__ static void store(const Params& params, unsigned char* staged, int row0, int col_block,
                                                 int, int) {
        const CUtensorMap *pre_map = &params.pre_map, *out_map = &params.out_map;
        const int col0 = col_block * BN, t = threadIdx.x - EPILOGUE_FIRST; // t: 0 .. EPILOGUE_THREADS - 1
        if (t == 0) {
            for (int p = 0; p < BN / 64; p++) {
                tma_store_3d<false>(pre_map, col0 + 64 * p, row0, 0, staged + p * (BM * 128));
                bulk_commit();
            }
        }
        const GeluForward gelu;
        constexpr int PER = CHUNKS_PER_THREAD;
        const PanelChunkOffsets chunk_offset(t); // the panel's chunks as store_panel lays them out
        for (int panel = 0; panel < BN / 64; panel++) {
            if (t == 0) asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(BN / 64 - 1) : "memory");
            named_barrier_sync(1, EPILOGUE_THREADS);
            const uint32_t panel_address = smem_address(staged + panel * (BM * 128));
            uint4 v[PER]; // 8 bf16 each, in 4 words
#pragma unroll
            for (int u = 0; u < PER; u++) v[u] = load_shared_16(panel_address + chunk_offset(u));
#pragma unroll
            for (int u = 0; u < PER; u++) {
                uint32_t* w = &v[u].x;
#pragma unroll
                for (int k = 0; k < 4; k++) // a bf16's bits are the top half of its float's
                    w[k] = pack_floatX2(gelu(__uint_as_float(w[k] << 16), 0.0f), gelu(__uint_as_float(w[k] & 0xFFFF0000u), 0.0f));
            }
            store_panel(v, staged + panel * (BM * 128), chunk_offset, out_map, col0 + 64 * panel, row0);
        }
        if (t == 0) bulk_wait_all<true>();
        named_barrier_sync(1, EPILOGUE_THREADS);
    }
};

// Whether this GPU runs the kernel (sm90a_code_runs), which then gets its shared memory.
static bool gemm_gelu_available(void) {
    static int available = -1;
    if (available < 0) available = wgmma_product::kernel_runs<GeluEpilogue>();
    return available;
}
#endif

void matmul_forward_gelu(floatX* pre, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                         int N, int C, int OC, int ld_inp, int group_rows) {
    check_row_groups("matmul_forward_gelu", N, group_rows);
#if defined(PRECISION_BF16)
    // TMA wants rows 16 bytes apart and 16-byte aligned bases; the bias is read in pairs.
    const bool aligned = aligned16(pre, out, inp, weight) && (uintptr_t)bias % 4 == 0 && OC % 8 == 0 && C % 8 == 0 &&
                         ld_inp % 8 == 0;
    if (N > 0 && aligned && gemm_gelu_available()) {
        check_linear_ld("matmul_forward_gelu", C, ld_inp);
        // one launch whatever group_rows: each output's sum does not depend on N (matmul_wgmma.cuh)
        const GeluEpilogue::Params params = {
            bias, tensor_map_3d(pre, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(floatX), 1, N, OC, OC, BM),
            tensor_map_3d(out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(floatX), 1, N, OC, OC, BM)};
        wgmma_product::launch<GeluEpilogue>(params, inp, weight, N, C, OC, ld_inp);
        return;
    }
#endif
    matmul_forward(pre, inp, weight, bias, NULL, N, C, OC, ld_inp, group_rows);
    gelu_forward(out, pre, (size_t)N * OC);
}
