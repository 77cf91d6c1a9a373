// The generic attention of kernels/kernels.h, bound at build time (ATTN=flash|naive, which the
// Makefile passes as -DATTN_FLASH or -DATTN_NAIVE) to one of the CPU variants. On the CPU floatX is
// float, so the pointers pass straight through.
#include "kernels/checks.h"
#include "kernels/kernels.h"

#include "common/util.h"
#include "kernels/cpu/attention_cpu.h"

#if defined(ATTN_FLASH) == defined(ATTN_NAIVE)
#error "define exactly one of ATTN_FLASH and ATTN_NAIVE"
#endif

// dbias += the column sums of dqkv (if dbias is not NULL), as matmul_backward sums its bias gradient.
// The groups were checked before the backward ran (check_sequence_groups).
static void qkv_bias_backward(float* dbias, const floatX* dqkv, int B, int T, int C, int group_rows) {
    if (dbias) matmul_backward(NULL, NULL, dbias, dqkv, NULL, NULL, B * T, C, 3 * C, C, group_rows, GRAD_ADD);
}

#ifdef ATTN_FLASH

size_t attention_saved_bytes(int B, int T, int NH) { return attention_flash_saved_bytes(B, T, NH); }

size_t attention_scratch_bytes(int B, int T, int C, int NH) {
    return attention_flash_scratch_bytes(B, T, C, NH);
}

// saved holds m then l, (B, NH, T) each.
void attention_forward(floatX* out, void* saved, const floatX* qkv, int B, int T, int C, int NH) {
    float* m = saved;
    float* l = m + (size_t)B * NH * T;
    attention_flash_forward_cpu(out, m, l, qkv, B, T, C, NH, ATTN_FLASH_BLOCK_Q, ATTN_FLASH_BLOCK_K);
}

void attention_backward(floatX* dqkv, float* dbias, void* scratch, const floatX* dout, const floatX* qkv,
                        const floatX* out, const void* saved, int B, int T, int C, int NH, int group_rows) {
    if (dbias) check_sequence_groups("attention_backward", B, T, group_rows);
    const float* m = saved;
    const float* l = m + (size_t)B * NH * T;
    attention_flash_backward_cpu(dqkv, scratch, dout, qkv, out, m, l, B, T, C, NH,
                                 ATTN_FLASH_BLOCK_Q, ATTN_FLASH_BLOCK_K);
    qkv_bias_backward(dbias, dqkv, B, T, C, group_rows);
}

const char* attention_name(void) { return "flash"; }
const char* attention_kernels(void) { return ""; }

#else

size_t attention_saved_bytes(int B, int T, int NH) { return attention_naive_saved_bytes(B, T, NH); }

size_t attention_scratch_bytes(int B, int T, int C, int NH) {
    return attention_naive_scratch_bytes(B, T, C, NH);
}

// saved holds the probabilities (B, NH, T, T).
void attention_forward(floatX* out, void* saved, const floatX* qkv, int B, int T, int C, int NH) {
    attention_naive_forward_cpu(out, saved, qkv, B, T, C, NH);
}

// The naive backward needs only the probabilities, not the output.
void attention_backward(floatX* dqkv, float* dbias, void* scratch, const floatX* dout, const floatX* qkv,
                        const floatX* out, const void* saved, int B, int T, int C, int NH, int group_rows) {
    (void)out;
    if (dbias) check_sequence_groups("attention_backward", B, T, group_rows);
    attention_naive_backward_cpu(dqkv, scratch, dout, qkv, saved, B, T, C, NH);
    qkv_bias_backward(dbias, dqkv, B, T, C, group_rows);
}

const char* attention_name(void) { return "naive"; }
const char* attention_kernels(void) { return ""; }

#endif
