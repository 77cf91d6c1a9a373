// The CPU reference kernels under other names, so a test can link them beside the CUDA kernels of
// the same names (tests/gpu/test_kernels_gpu.cu). The CPU files are compiled for such a test with
// `-include kernels/cpu_reference_names.h` (and no PRECISION flag, so floatX is float): the
// #defines below rename every function of kernels/kernels.h to cpu_<name>, and the compiler checks
// kernels.h's prototypes, so renamed, against the declarations here. The test defines
// CPU_REFERENCE_DECLARATIONS_ONLY to get the declarations without the renaming.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
void cpu_backend_init(int device_index);
const char* cpu_backend_describe(void);
double cpu_backend_peak_flops(void);
const char* cpu_backend_peak_source(void);
int cpu_backend_memory(size_t* free_bytes, size_t* total_bytes);
void* cpu_dev_malloc(size_t bytes, const char* what);
void cpu_dev_free(void* p);
void cpu_dev_memset_zero(void* p, size_t bytes);
void cpu_dev_upload(void* dst_dev, const void* src_host, size_t bytes);
void cpu_dev_download(void* dst_host, const void* src_dev, size_t bytes);
void cpu_dev_copy(void* dst_dev, const void* src_dev, size_t bytes);
void cpu_dev_synchronize(void);
void* cpu_dev_malloc_host(size_t bytes, const char* what);
void cpu_dev_free_host(void* p);
void cpu_dev_upload_async(void* dst_dev, const void* src_host, size_t bytes);
void cpu_dev_download_async(void* dst_host, const void* src_dev, size_t bytes);
void cpu_dev_wait_downloads(void);
void cpu_dev_slot_upload(int slot, void* dst_dev, const void* src_host, size_t bytes);
void cpu_dev_slot_ready(int slot);
void cpu_dev_slot_download(int slot, void* dst_host, const void* src_dev, size_t bytes);
void cpu_floatX_from_float(float* dst, const float* src, size_t n);
void cpu_float_from_floatX(float* dst, const float* src, size_t n);
void cpu_float_accumulate(float* dst, const float* src, size_t n);
void cpu_init_normal(float* dst, size_t n, float mean, float std, unsigned long long seed,
                     unsigned long long offset);
void cpu_encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C);
void cpu_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C);
void cpu_layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                           const float* bias, int N, int C, int ld_out);
void cpu_layernorm_backward(float* dinp, float* dweight, float* dbias, float* dinp_sums, const float* dout, const float* inp,
                            const float* weight, const float* mean, const float* rstd, int N, int C, int group_rows,
                            int dinp_mode);
void cpu_matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                        const float* residual, int N, int C, int OC, int ld_inp, int group_rows);
void cpu_matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, int N, int C, int OC, int ld_inp, int group_rows, int dweight_mode);
void cpu_matmul_backward_weights(float* dweight, float* dbias, const float* dout, const float* inp, int N, int C, int OC,
                                 int ld_inp, int group_rows, int dweight_mode);
void cpu_matmul_backward_wait(void);
void cpu_gelu_forward(float* out, const float* inp, size_t n);
void cpu_gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);
void cpu_matmul_forward_gelu(float* pre, float* out, const float* inp, const float* weight, const float* bias,
                             int N, int C, int OC, int ld_inp, int group_rows);
void cpu_matmul_backward_gelu(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                              const float* weight, const float* pre, int N, int C, int OC, int group_rows,
                              int dweight_mode);
void cpu_fused_classifier(float* logits, float* losses, const int* targets, float dloss, int N, int V,
                          int Vp, int write_dlogits);
size_t cpu_head_scratch_bytes(int N, int C, int Vp);
void cpu_head_classifier(float* losses, float* dinp, float* dweight, void* scratch, const int* targets, float dloss,
                         const float* inp, const float* weight, int N, int C, int V, int Vp, int group_rows,
                         int dweight_mode);
size_t cpu_attention_saved_bytes(int B, int T, int NH);
size_t cpu_attention_scratch_bytes(int B, int T, int C, int NH);
void cpu_attention_forward(float* out, void* saved, const float* qkv, int B, int T, int C, int NH);
void cpu_attention_backward(float* dqkv, float* dbias, void* scratch, const float* dout, const float* qkv,
                            const float* out, const void* saved, int B, int T, int C, int NH, int group_rows);
const char* cpu_attention_name(void);
const char* cpu_attention_kernels(void);
float cpu_grad_norm_squared(const float* grad, size_t n);
void cpu_round_master_weights(float* param, const float* master, size_t n, size_t index0, int t,
                              unsigned long long seed);
void cpu_adamw_update(float* param, float* master, const float* grad, float* m, float* v, size_t n,
                      size_t index0, float lr, float beta1, float beta2, float eps, float weight_decay,
                      float grad_scale, int t, unsigned long long seed);
#ifdef __cplusplus
}
#endif

#ifndef CPU_REFERENCE_DECLARATIONS_ONLY
#define backend_init cpu_backend_init
#define backend_describe cpu_backend_describe
#define backend_peak_flops cpu_backend_peak_flops
#define backend_peak_source cpu_backend_peak_source
#define backend_memory cpu_backend_memory
#define dev_malloc cpu_dev_malloc
#define dev_free cpu_dev_free
#define dev_memset_zero cpu_dev_memset_zero
#define dev_upload cpu_dev_upload
#define dev_download cpu_dev_download
#define dev_copy cpu_dev_copy
#define dev_synchronize cpu_dev_synchronize
#define dev_malloc_host cpu_dev_malloc_host
#define dev_free_host cpu_dev_free_host
#define dev_upload_async cpu_dev_upload_async
#define dev_download_async cpu_dev_download_async
#define dev_wait_downloads cpu_dev_wait_downloads
#define dev_slot_upload cpu_dev_slot_upload
#define dev_slot_ready cpu_dev_slot_ready
#define dev_slot_download cpu_dev_slot_download
#define floatX_from_float cpu_floatX_from_float
#define float_from_floatX cpu_float_from_floatX
#define float_accumulate cpu_float_accumulate
#define init_normal cpu_init_normal
#define encoder_forward cpu_encoder_forward
#define encoder_backward cpu_encoder_backward
#define layernorm_forward cpu_layernorm_forward
#define layernorm_backward cpu_layernorm_backward
#define matmul_forward cpu_matmul_forward
#define matmul_backward cpu_matmul_backward
#define matmul_backward_weights cpu_matmul_backward_weights
#define matmul_backward_wait cpu_matmul_backward_wait
#define gelu_forward cpu_gelu_forward
#define gelu_backward cpu_gelu_backward
#define matmul_forward_gelu cpu_matmul_forward_gelu
#define matmul_backward_gelu cpu_matmul_backward_gelu
#define fused_classifier cpu_fused_classifier
#define head_scratch_bytes cpu_head_scratch_bytes
#define head_classifier cpu_head_classifier
#define attention_saved_bytes cpu_attention_saved_bytes
#define attention_scratch_bytes cpu_attention_scratch_bytes
#define attention_forward cpu_attention_forward
#define attention_backward cpu_attention_backward
#define attention_name cpu_attention_name
#define attention_kernels cpu_attention_kernels
#define grad_norm_squared cpu_grad_norm_squared
#define adamw_update cpu_adamw_update
#define round_master_weights cpu_round_master_weights
#endif
