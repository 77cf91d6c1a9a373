// Flash attention on the CPU: the same algorithm as the fused GPU kernel, in fp32, so it is the
// reference the GPU is checked against and the CPU trainer's attention when ATTN=flash.
//
// Forward: each task owns a block of query rows; K/V blocks are streamed with an online softmax
// (running max m, running sum l of exp(s - m), output accumulator rescaled whenever m grows).
// Backward, column-wise: each K/V block collects dK and dV over the query blocks at or below the
// diagonal, recomputing P = exp(S - m) / l from Q, K and the saved (m, l), and adds its share of dQ.
// Only block_q x block_k and block x HS tiles exist; nothing is of size T x T.
#include "kernels/cpu/attention_cpu.h"
#include "kernels/constants.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

size_t attention_flash_saved_bytes(int B, int T, int NH) {
    return 2 * (size_t)B * NH * T * sizeof(float);
}

size_t attention_flash_scratch_bytes(int B, int T, int C, int NH) {
    (void)C;
    return (size_t)B * NH * T * sizeof(float);
}

static void check_block_sizes(int block_q, int block_k) {
    if (block_q < 1 || block_k < 1) {
        fatal("flash attention: block sizes must be >= 1, got block_q %d, block_k %d", block_q, block_k);
    }
}

// How many keys of the block starting at key k0 (nk keys) the query row `query` may see (causal).
static int visible_keys(int query, int k0, int nk) {
    int n = query - k0 + 1;
    return n < 0 ? 0 : (n > nk ? nk : n);
}

void attention_flash_forward_cpu(float* out, float* m, float* l, const float* qkv, int B, int T,
                                 int C, int NH, int block_q, int block_k) {
    check_block_sizes(block_q, block_k);
    const int HS = C / NH;
    const float scale = ATTENTION_SCALE(HS);
    const int num_q_blocks = (T + block_q - 1) / block_q;
#pragma omp parallel
    {
        // Per-thread tiles: scores/probabilities, the output accumulator, running max and sum.
        float* S = xmalloc((size_t)block_q * block_k * sizeof(float), "flash attention score tile");
        float* acc = xmalloc((size_t)block_q * HS * sizeof(float), "flash attention accumulator");
        float* m_run = xmalloc((size_t)block_q * sizeof(float), "flash attention running max");
        float* l_run = xmalloc((size_t)block_q * sizeof(float), "flash attention running sum");
        // Later query blocks see more keys, so blocks are handed out dynamically.
#pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int qb = 0; qb < num_q_blocks; qb++) {
                    const int q0 = qb * block_q;
                    const int nq = T - q0 < block_q ? T - q0 : block_q;
                    for (int i = 0; i < nq; i++) {
                        m_run[i] = -INFINITY;
                        l_run[i] = 0.0f;
                    }
                    memset(acc, 0, (size_t)nq * HS * sizeof(float));
                    // K/V blocks starting after the last query row lie above the diagonal: skipped.
                    for (int k0 = 0; k0 <= q0 + nq - 1; k0 += block_k) {
                        const int nk = T - k0 < block_k ? T - k0 : block_k;
                        for (int i = 0; i < nq; i++) {
                            // Keys beyond the query are masked (only in the diagonal block); a row
                            // can see no key of this block at all when block_q > block_k.
                            const int nv = visible_keys(q0 + i, k0, nk);
                            if (nv == 0) continue;
                            const float* q = qkv + ((size_t)(b * T + q0 + i) * 3 + 0) * C + h * HS;
                            float* s = S + (size_t)i * block_k;
                            float block_max = -INFINITY;
                            for (int j = 0; j < nv; j++) {
                                const float* k = qkv + ((size_t)(b * T + k0 + j) * 3 + 1) * C + h * HS;
                                s[j] = attention_dot(q, k, HS) * scale;
                                if (s[j] > block_max) block_max = s[j];
                            }
                            // Online softmax: move the row to the new max, rescaling what was summed.
                            // The first block (k0 = 0) always has a visible key, so m_new is finite.
                            const float m_new = block_max > m_run[i] ? block_max : m_run[i];
                            const float correction = expf(m_run[i] - m_new); // 0 on the first block
                            float block_sum = 0.0f;
                            for (int j = 0; j < nv; j++) {
                                s[j] = expf(s[j] - m_new);
                                block_sum += s[j];
                            }
                            m_run[i] = m_new;
                            l_run[i] = l_run[i] * correction + block_sum;
                            // acc = acc * correction + P V
                            float* a = acc + (size_t)i * HS;
                            for (int d = 0; d < HS; d++) a[d] *= correction;
                            for (int j = 0; j < nv; j++) {
                                const float* v = qkv + ((size_t)(b * T + k0 + j) * 3 + 2) * C + h * HS;
                                for (int d = 0; d < HS; d++) a[d] += s[j] * v[d];
                            }
                        }
                    }
                    for (int i = 0; i < nq; i++) {
                        const size_t row = ((size_t)b * NH + h) * T + q0 + i;
                        float* o = out + (size_t)(b * T + q0 + i) * C + h * HS;
                        const float inv_l = 1.0f / l_run[i];
                        for (int d = 0; d < HS; d++) o[d] = acc[(size_t)i * HS + d] * inv_l;
                        m[row] = m_run[i];
                        l[row] = l_run[i];
                    }
                }
            }
        }
        free(S);
        free(acc);
        free(m_run);
        free(l_run);
    }
}

void attention_flash_backward_cpu(float* dqkv, float* D, const float* dout, const float* qkv,
                                  const float* out, const float* m, const float* l, int B, int T,
                                  int C, int NH, int block_q, int block_k) {
    check_block_sizes(block_q, block_k);
    const int HS = C / NH;
    const float scale = ATTENTION_SCALE(HS);

    // D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij: the softmax-backward term of each row, computed
    // once here instead of from the full rows of P and dP.
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const size_t offset = (size_t)(b * T + t) * C + h * HS;
                D[((size_t)b * NH + h) * T + t] = attention_dot(dout + offset, out + offset, HS);
            }
        }
    }

#pragma omp parallel
    {
        float* P = xmalloc((size_t)block_q * block_k * sizeof(float), "flash attention P tile");
        float* dS = xmalloc((size_t)block_q * block_k * sizeof(float), "flash attention dS tile");
        float* dK = xmalloc((size_t)block_k * HS * sizeof(float), "flash attention dK tile");
        float* dV = xmalloc((size_t)block_k * HS * sizeof(float), "flash attention dV tile");
        // One (b, h) per task: every K/V block of a head adds into the same dQ rows, so the head
        // stays on one thread, which also fixes the order of the additions (deterministic).
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const size_t head_row0 = ((size_t)b * NH + h) * T;
                for (int t = 0; t < T; t++) {
                    memset(dqkv + ((size_t)(b * T + t) * 3 + 0) * C + h * HS, 0, (size_t)HS * sizeof(float));
                }
                for (int k0 = 0; k0 < T; k0 += block_k) {
                    const int nk = T - k0 < block_k ? T - k0 : block_k;
                    memset(dK, 0, (size_t)nk * HS * sizeof(float));
                    memset(dV, 0, (size_t)nk * HS * sizeof(float));
                    // Query blocks ending before k0 lie above the diagonal: start at the block of k0.
                    for (int q0 = (k0 / block_q) * block_q; q0 < T; q0 += block_q) {
                        const int nq = T - q0 < block_q ? T - q0 : block_q;
                        // P = exp(S - m) / l, recomputed from Q, K and the saved row statistics.
                        for (int i = 0; i < nq; i++) {
                            const int nv = visible_keys(q0 + i, k0, nk);
                            const float* q = qkv + ((size_t)(b * T + q0 + i) * 3 + 0) * C + h * HS;
                            const float m_i = m[head_row0 + q0 + i];
                            const float inv_l = 1.0f / l[head_row0 + q0 + i];
                            for (int j = 0; j < nv; j++) {
                                const float* k = qkv + ((size_t)(b * T + k0 + j) * 3 + 1) * C + h * HS;
                                const float score = attention_dot(q, k, HS) * scale;
                                P[(size_t)i * block_k + j] = expf(score - m_i) * inv_l;
                            }
                        }
                        // dV += P^T dO; dP = dO V^T; dS = P * (dP - D).
                        for (int i = 0; i < nq; i++) {
                            const int nv = visible_keys(q0 + i, k0, nk);
                            const float* dout_i = dout + (size_t)(b * T + q0 + i) * C + h * HS;
                            const float D_i = D[head_row0 + q0 + i];
                            for (int j = 0; j < nv; j++) {
                                const float* v = qkv + ((size_t)(b * T + k0 + j) * 3 + 2) * C + h * HS;
                                const float p = P[(size_t)i * block_k + j];
                                float* dv = dV + (size_t)j * HS;
                                for (int d = 0; d < HS; d++) dv[d] += p * dout_i[d];
                                dS[(size_t)i * block_k + j] = p * (attention_dot(dout_i, v, HS) - D_i);
                            }
                        }
                        // dK += dS^T Q * scale; dQ += dS K * scale.
                        for (int i = 0; i < nq; i++) {
                            const int nv = visible_keys(q0 + i, k0, nk);
                            const float* q = qkv + ((size_t)(b * T + q0 + i) * 3 + 0) * C + h * HS;
                            float* dq = dqkv + ((size_t)(b * T + q0 + i) * 3 + 0) * C + h * HS;
                            for (int j = 0; j < nv; j++) {
                                const float* k = qkv + ((size_t)(b * T + k0 + j) * 3 + 1) * C + h * HS;
                                const float ds = dS[(size_t)i * block_k + j] * scale;
                                float* dk = dK + (size_t)j * HS;
                                for (int d = 0; d < HS; d++) {
                                    dk[d] += ds * q[d];
                                    dq[d] += ds * k[d];
                                }
                            }
                        }
                    }
                    for (int j = 0; j < nk; j++) {
                        memcpy(dqkv + ((size_t)(b * T + k0 + j) * 3 + 1) * C + h * HS, dK + (size_t)j * HS,
                               (size_t)HS * sizeof(float));
                        memcpy(dqkv + ((size_t)(b * T + k0 + j) * 3 + 2) * C + h * HS, dV + (size_t)j * HS,
                               (size_t)HS * sizeof(float));
                    }
                }
            }
        }
        free(P);
        free(dS);
        free(dK);
        free(dV);
    }
}
