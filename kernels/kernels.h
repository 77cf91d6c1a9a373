// The kernel interface: every layer's forward and backward, the optimizer and the few memory
// operations the model needs. kernels/cpu/*.c (fp32 reference, OpenMP) and kernels/cuda/*.cu
// implement exactly these functions with the same contracts, so model/ is written once and a test
// can run both backends on the same inputs.
//
// Conventions
// - Pointers are "device" memory: host memory in the CPU backend, GPU memory in the CUDA backend.
// - floatX is the storage type of parameters and activations (and of activation gradients): float
//   on the CPU and in the CUDA FP32 build, bf16 in the CUDA BF16 build, fp16 (IEEE half) in the CUDA
//   FP16 build (whose losses are scaled, train.c's --loss-scale). Parameter gradients are float
//   wherever a kernel writes them, so that summing micro-batches and ranks rounds no more than one
//   large batch would: in bf16, 8 micro-batches of 8 sequences trained the shakespeare recipe to a
//   train loss 0.04 above one batch of 64. Statistics (layernorm mean/rstd, attention state,
//   losses) and optimizer state are float too.
// - gradX is the storage type of the model's whole gradient array: float, but bf16 in a CUDA build
//   made with GRADS=BF16 (PRECISION=BF16 only), which halves that array's memory (GPT-2 1.5B: 5.8
//   GiB to 2.9). There the kernels write fp32 gradients into a small scratch, and gradX_fold rounds
//   each micro-step's into the bf16 array once; the all-reduce, the norm and AdamW read bf16.
// - Shapes: N = B*T rows; C channels; weights are (out, in) row-major as in PyTorch's Linear.
// - Gradients of parameters ACCUMULATE (+=) so micro-batches add up; the model zeroes them once per
//   step. The products' weight gradients (dweight of matmul_backward and its kin, head_classifier)
//   take a dweight_mode instead: GRAD_ADD adds as the rest do, GRAD_WRITE writes dweight without
//   reading it, which the model asks for in a step's first product into each weight matrix, so
//   that the big weight gradients (most of the model's) need no zeroing (GPT-2 124M: 0.5 GB of
//   memset and as much reading of those zeros a step). Gradients of activations are OVERWRITTEN
//   (=), except layernorm_backward's dinp, which accumulates because it feeds the residual stream
//   (whose own backward is the identity), and takes a dinp_mode too: the model writes the residual
//   stream's gradient with the final layernorm's backward, where it starts, instead of zeroing it
//   first (GPT-2 124M at 64K tokens: 100 MB of memset and as much reading a step).
// - group_rows (a divisor of N): the rows come in groups of group_rows consecutive rows. The layers
//   with weights sum their parameter gradients group by group and add each group's sum in turn; a
//   group's sum depends only on its own rows. The products that make each row of their output from
//   the same row of their input (the forward's, and matmul_backward's dinp) give each row the bits
//   of a product over its group alone. With group_rows = group_sequences T (train_gpt
//   --batch-invariant group_sequences), a micro-batch of B sequences gives the bits of the same
//   sequences in micro-batches of any other multiple of group_sequences; group_rows = N (one group)
//   is the fastest on the GPU, where each group's gradient sums are one cuBLAS call per product.
#pragma once
#include <stddef.h>
#include <stdint.h>

#if defined(PRECISION_BF16)
#ifdef __CUDACC__
#include <cuda_bf16.h>
typedef __nv_bfloat16 floatX;
#else
typedef uint16_t floatX; // the bits of a bf16; C code only moves it, the CUDA files do the math
#endif
#elif defined(PRECISION_FP16)
#ifdef __CUDACC__
#include <cuda_fp16.h>
typedef __half floatX;
#else
typedef uint16_t floatX; // the bits of an fp16; C code only moves it, the CUDA files do the math
#endif
#else
typedef float floatX;
#endif
#if defined(GRADS_BF16)
#if !defined(PRECISION_BF16)
#error "GRADS_BF16 needs PRECISION_BF16: the bf16 gradients are floatX's type"
#endif
typedef floatX gradX;
#define GRADS_NOTE ", bf16 gradients"
#else
typedef float gradX;
#define GRADS_NOTE ""
#endif
// GRADS_NOTE follows PRECISION_NAME where the build is named (the start-up line, run.conf): what a
// GRADS=BF16 build adds to its name.
// The build's name for floatX, in messages and in the run.conf a run writes (the CPU's is FP32).
#if defined(PRECISION_BF16)
#define PRECISION_NAME "BF16"
#elif defined(PRECISION_FP16)
#define PRECISION_NAME "FP16"
#else
#define PRECISION_NAME "FP32"
#endif
// fp16's largest finite value: a weight beyond it cannot be stored, and gpt2_set_weights refuses
// it (bf16 and float have float's range, which every finite weight is in).
#if defined(PRECISION_FP16)
#define FLOATX_MAX 65504.0f
#endif

#ifdef __cplusplus
extern "C" {
#endif

// How a gradient goes into its array (Conventions): a product's weight gradient into dweight
// (dweight_mode), layernorm_backward's into dinp (dinp_mode). GRAD_WRITE writes over what the array
// holds, which is not read; GRAD_ADD adds to it. GRAD_WRITE gives the bits of GRAD_ADD into zeros;
// with group_rows < N a weight gradient's first group's sum is written and the others' added. (Plain
// ints, so that cpu_reference_names.h declares the same prototypes without this header.)
enum { GRAD_WRITE, GRAD_ADD };

// ---- backend: memory and device ------------------------------------------------------------
// CPU: reports threads; CUDA: selects GPU device_index (GPU 0 when only one is visible).
void backend_init(int device_index);
const char* backend_describe(void);       // e.g. "CPU fp32, 2 threads" or "NVIDIA H100, BF16"
// The device's dense peak in FLOP/s for the build's precision, for MFU: BF16 tensor cores with FP32
// accumulation, or FP32 without tensor cores in the FP32 build (common/gpu_peaks.c's table); 0 when
// unknown, and on the CPU. backend_peak_source says where it comes from ("the dense BF16 tensor
// peak of the H100 PCIe (built-in table)"), or why there is none ("no BF16 peak known for NVIDIA ...").
double backend_peak_flops(void);
const char* backend_peak_source(void);
// Memory that allocations can still get, and all of it: the GPU's (cudaMemGetInfo, after
// backend_init) or the host's (MemAvailable and MemTotal of /proc/meminfo) on the CPU. Returns 1 on
// a GPU, 0 on the CPU, whose free memory moves with everything else the host runs.
int backend_memory(size_t* free_bytes, size_t* total_bytes);
void* dev_malloc(size_t bytes, const char* what);  // exits with a clear message on failure
void dev_free(void* p);
void dev_memset_zero(void* p, size_t bytes);
void dev_upload(void* dst_dev, const void* src_host, size_t bytes);
void dev_download(void* dst_host, const void* src_dev, size_t bytes);
void dev_copy(void* dst_dev, const void* src_dev, size_t bytes);
void dev_synchronize(void);
// Host memory for copies that do not make the host wait (pinned on the GPU, plain memory on the
// CPU), and those copies. They run in order with the kernels; until a dev_synchronize (or a blocking
// copy) after them, the host must not write the source of an upload nor read the destination of a
// download (for downloads, dev_wait_downloads is enough). A blocking dev_upload from ordinary
// memory waits for the GPU to finish all queued work first (CUDA's rule for pageable memory), which
// would leave it idle at every micro-step.
void* dev_malloc_host(size_t bytes, const char* what);
void dev_free_host(void* p);
void dev_upload_async(void* dst_dev, const void* src_host, size_t bytes);
void dev_download_async(void* dst_host, const void* src_dev, size_t bytes);
// Waits until the downloads queued so far (dev_download_async) have landed, and the work queued
// before them is done, but not for the work queued after them: a step can read its losses while
// the GPU runs its backward.
void dev_wait_downloads(void);
// Copies beside the kernels, for streaming pieces of pinned host arrays through device buffers:
// uploads run on one copy stream and downloads on another, so that while the kernels work on the
// buffer of one slot, the next piece goes up into the other slot's and the previous one comes down
// (PCIe carries both directions at once). Each slot orders the use of its buffers:
//   dev_slot_upload    runs after the slot's last download (its buffers are free again);
//   dev_slot_ready     makes the kernels queued next wait for the slot's uploads;
//   dev_slot_download  runs after the kernels queued so far (those that wrote its buffers).
// The host rules of the copies above hold; dev_synchronize waits for these copies too. On the CPU
// they are memcpy.
enum { DEV_SLOTS = 2 };
void dev_slot_upload(int slot, void* dst_dev, const void* src_host, size_t bytes);
void dev_slot_ready(int slot);
void dev_slot_download(int slot, void* dst_host, const void* src_dev, size_t bytes);
// Conversions between fp32 arrays and floatX arrays, both in device memory (a copy on the CPU).
void floatX_from_float(floatX* dst, const float* src, size_t n);
void float_from_floatX(float* dst, const floatX* src, size_t n);
// dst[i] += src[i] for n floats in device memory (src and dst do not overlap).
void float_accumulate(float* dst, const float* src, size_t n);
// n normally distributed floats (mean, std) from cuRAND's Philox4_32_10 generator with this seed,
// starting at this offset of its sequence: the host API on the CPU, the device API on the GPU, the
// same numbers in both. dst is device memory.
void init_normal(float* dst, size_t n, float mean, float std, unsigned long long seed,
                 unsigned long long offset);

// ---- layers ------------------------------------------------------------------------------
// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                     int B, int T, int C);
// dwte[inp[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:]. Deterministic order, and sequence
// by sequence: B sequences give the bits of the same sequences passed in smaller batches.
void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const int* inp,
                      int B, int T, int C);

// out = (inp - mean) * rstd * weight + bias per row of C, eps 1e-5; mean and rstd (N) are saved.
// out's rows are ld_out >= C elements apart: ld_out = C packs them, ld_out = C + LINEAR_BIAS_COLUMNS
// writes each row with the bias columns of a linear layer's input after it (below). The outputs
// overlap no input.
void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                       const floatX* weight, const floatX* bias, int N, int C, int ld_out);
// dinp = or += ... (dinp_mode), dweight += ..., dbias += ... (parameter sums in groups of group_rows
// rows, see above). dinp_sums (may be NULL) += the column sums of dinp after the update, the very
// bits of matmul_backward's dbias for dout = dinp: the model gives it the bias gradient of the linear
// layer whose output the residual stream adds, so that layer's backward need not read dinp once more.
void layernorm_backward(floatX* dinp, float* dweight, float* dbias, float* dinp_sums, const floatX* dout,
                        const floatX* inp, const floatX* weight, const float* mean,
                        const float* rstd, int N, int C, int group_rows, int dinp_mode);

// A linear layer's input, inp (N, C), has its rows ld_inp >= C elements apart. Where ld_inp =
// linear_bias_ld(C), each row carries the bias columns after its C values: a 1, then zeros up to
// ld_inp (a layernorm_forward with that ld_out writes them). With them, inp's product with dout^T has
// the bias gradient as one more row of the weight gradient's (the sums of dout's columns times 1),
// and the CUDA backend's matmul_backward takes dbias from its weight-gradient product instead of
// reading dout again (fc's dout is (N, 4C): 402 MB per GPT-2 124M layer at 64K tokens). That product
// reads LINEAR_BIAS_COLUMNS of them (8 keep its rows 16-byte aligned in bf16); the rows are C +
// LINEAR_BIAS_COLUMNS rounded up to 64 elements apart (128 bytes in bf16): with rows 16 bytes apart but
// not 32 (GPT-2 1.5B's C + 8 = 1,608) cuBLASLt's weight-gradient kernels were slowest, 32-byte rows
// (1,616) faster and 128-byte rows (1,664) the fastest measured (docs/performance.md).
#define LINEAR_BIAS_COLUMNS 8
static inline int linear_bias_ld(int C) { return (C + LINEAR_BIAS_COLUMNS + 63) / 64 * 64; }

// out (N, OC) = inp (N, C) @ weight(OC, C)^T + bias (OC) + residual (N, OC), summed in fp32 and
// rounded once to floatX; bias and residual may be NULL. The residual connection of a block's
// projection is this add: its backward is the identity on residual, so the model lets the
// residual stream's gradient flow through unchanged. inp's bias columns are not read. out overlaps
// no input. Each row has the bits of a product over its group of group_rows rows (Conventions).
void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                    const floatX* residual, int N, int C, int OC, int ld_inp, int group_rows);
// dinp = dout @ weight; dweight = or += dout^T @ inp (dweight_mode); dbias += column sums of dout (from
// inp's bias columns where it has them, which the caller then guarantees to be 1 and zeros). dinp,
// dweight or dbias may be NULL, which skips that part.
void matmul_backward(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                     const floatX* weight, int N, int C, int OC, int ld_inp, int group_rows, int dweight_mode);
// matmul_backward's dweight and dbias alone, with its bits, which the backend may still be making
// when it returns, beside the calls that follow (the CUDA backend: on a second stream where the rows
// are many, so that a layernorm's backward, bound by memory, runs beside the product). Until
// matmul_backward_wait(), dout and inp must not be written, nor dweight and dbias read or written;
// after it, the calls that follow see the gradients (the CPU's are complete on return).
void matmul_backward_weights(float* dweight, float* dbias, const floatX* dout, const floatX* inp, int N, int C, int OC,
                             int ld_inp, int group_rows, int dweight_mode);
void matmul_backward_wait(void);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(floatX* out, const floatX* inp, size_t n);
void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t n); // dinp =, may alias dout
// The MLP's first layer and its GELU: pre (N, OC) = inp @ weight^T + bias, summed in fp32 and rounded
// once as matmul_forward's, and out (N, OC) = gelu_forward(pre), the very bits that gelu_forward
// gives from pre, so that recompute (-r >= 1) can rebuild out from pre with gelu_forward and train
// bit for bit alike. (On H100/H200 in the BF16 build, one kernel computes both and does not read pre
// back; elsewhere matmul_forward and gelu_forward.)
// inp's bias columns are not read; pre and out overlap nothing. Rows in groups of group_rows, as
// matmul_forward's.
void matmul_forward_gelu(floatX* pre, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                         int N, int C, int OC, int ld_inp, int group_rows);
// matmul_backward of the layer that reads gelu(pre), with dinp = gelu'(pre) * (dout @ weight): the
// gradient with respect to pre (N, C), as gelu_backward would make it (in the GPU's BF16 build one
// cuBLASLt call with a GELU-derivative epilogue, which saves a pass over the (N, 4C) activations).
void matmul_backward_gelu(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                          const floatX* weight, const floatX* pre, int N, int C, int OC, int group_rows,
                          int dweight_mode);

// Softmax over the first V of Vp logits per row and cross-entropy against targets (0 <= t < V).
// losses[i] = -log p[i, targets[i]]. If write_dlogits, logits is overwritten in place with
// dloss * (p - onehot(target)) on columns < V and 0 on the padding columns; probabilities are never
// stored.
void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss,
                      int N, int V, int Vp, int write_dlogits);
// The head of one slice of rows, its product and the classifier in one, with the head's backward
// where dloss > 0: the logits inp (N, C) @ weight (Vp, C)^T, losses[i] = -log p[i, targets[i]] as
// fused_classifier's, and with dloss > 0, for dlogits = dloss (p - onehot(target)) (0 on the padding
// columns), dinp (N, C) = dlogits @ weight and dweight (Vp, C) = or += dlogits^T @ inp (dweight_mode) in
// groups of group_rows rows, as matmul_backward sums them; dinp and dweight are not touched without
// dloss.
// matmul_forward, fused_classifier and matmul_backward compute it, which is what the CPU does; a
// backend may compute it in another way that never stores the logits (the CUDA backend's on H100
// and H200: kernels/cuda/head.cu). scratch: head_scratch_bytes(N, C, Vp) bytes of working memory,
// 16-byte aligned, whose first N Vp floatX may hold the logits.
size_t head_scratch_bytes(int N, int C, int Vp);
void head_classifier(float* losses, floatX* dinp, float* dweight, void* scratch, const int* targets, float dloss,
                     const floatX* inp, const floatX* weight, int N, int C, int V, int Vp, int group_rows,
                     int dweight_mode);

// Causal self-attention, scale 1/sqrt(HS), HS = C/NH.
// qkv (B, T, 3, NH, HS): q, k, v of head h at qkv[((b*T + t)*3 + {0,1,2})*C + h*HS]; out (B, T, NH, HS).
// `saved` is what the forward keeps for the backward (attention_saved_bytes): the probabilities
// (B, NH, T, T) for the naive build; for the flash build m then l, float (B, NH, T) each (the
// running max and the running sum of exp(s - m) per row). `scratch` (attention_scratch_bytes) is
// working memory of the backward. dqkv is overwritten. If dbias is not NULL, the backward also adds
// the column sums of dqkv as stored, the gradient of the qkv projection's bias (3C), into it, in
// groups of group_rows rows as matmul_backward sums (group_rows a multiple of T); the qkv product's
// matmul_backward then gets no dbias. (The GPU's BF16 flash kernels sum dqkv's 64-row tiles as they
// store them, in an order of their own, instead of reading dqkv again.)
size_t attention_saved_bytes(int B, int T, int NH);
size_t attention_scratch_bytes(int B, int T, int C, int NH);
void attention_forward(floatX* out, void* saved, const floatX* qkv, int B, int T, int C, int NH);
void attention_backward(floatX* dqkv, float* dbias, void* scratch, const floatX* dout, const floatX* qkv,
                        const floatX* out, const void* saved, int B, int T, int C, int NH, int group_rows);
const char* attention_name(void); // "flash" or "naive"
// Which of the variant's kernels this device runs, for the start-up line: the GPU's flash tiles
// ("sm86 tiles"); "" where the variant has one kind (the CPU, the naive GPU attention, the FP32 build).
const char* attention_kernels(void);

// ---- optimizer ---------------------------------------------------------------------------
// Sum of squares of n gradient values (accumulated in at least fp32; fp64 on the CPU).
float grad_norm_squared(const gradX* grad, size_t n);
#if defined(GRADS_BF16)
// A micro-step's fp32 gradients src into the bf16 gradients dst, n values: dst = src rounded
// (mode GRAD_WRITE: the step's first micro-step, dst is not read) or dst + src summed in fp32 and
// rounded (GRAD_ADD), to nearest even. The CUDA build made with GRADS=BF16 only.
void gradX_fold(gradX* dst, const float* src, size_t n, int mode);
#endif
// One AdamW step on n parameters (PyTorch's AdamW): g = grad * grad_scale (a bf16 grad as a float);
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps)
// + weight_decay * w). `master` holds the fp32 weights when floatX is not float (then param gets the
// stochastically rounded master, randomness from seed) and is NULL when floatX is float.
// index0 is the index of param[0] in its tensor: element i draws its randomness from (seed, index0
// + i), so a ZeRO shard that updates part of a tensor rounds exactly as the whole tensor would.
void adamw_update(floatX* param, float* master, const gradX* grad, float* m, float* v, size_t n,
                  size_t index0, float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, int t, unsigned long long seed);

// The parameters that adamw_update(..., index0, ..., t, seed) leaves for fp32 weights `master`:
// stochastically rounded from the same random numbers in the BF16 build (so a resumed BF16 run
// gets back the exact bf16 weights of the step it saved), a copy where floatX is float.
void round_master_weights(floatX* param, const float* master, size_t n, size_t index0, int t,
                          unsigned long long seed);

// ---- data parallelism: one process per GPU (or CPU rank) ---------------------------------
// NCCL in the CUDA build (kernels/cuda/comm.cu); in the CPU build and in a CUDA build made with NCCL=0
// (kernels/cpu/comm.c), TCP through rank 0, which adds in rank order (the identity for one process).
// Collectives run in the order the calls are made, after the work already queued; each call but
// comm_sum_pieces_begin waits for its result, and a collective that does not finish within the
// timeout (a rank died or hangs) aborts the communicator and exits with a message.
typedef enum { COMM_FLOATX, COMM_FLOAT } CommType;
// gradX's (a GRADS=BF16 build's gradients are floatX's bf16).
#if defined(GRADS_BF16)
#define COMM_GRADX COMM_FLOATX
#else
#define COMM_GRADX COMM_FLOAT
#endif
typedef enum { COMM_SUM, COMM_MIN, COMM_MAX } CommOp;
// Joins the `world` ranks: rank 0 creates the NCCL id (without NCCL, its address and a key) and hands
// it to the others through the rendezvous rdv (common/rendezvous.h: TCP or a shared file; not used,
// and may be NULL, when world is 1). Waits at most timeout_seconds for anything.
struct Rendezvous;
void comm_init(int rank, int world, const struct Rendezvous* rdv, double timeout_seconds);
void comm_free(void);
int comm_rank(void);  // 0 before comm_init
int comm_world(void); // 1 before comm_init
const char* comm_name(void); // "NCCL", "TCP through rank 0" or "one process"
// buf (count elements) = its sum over the ranks.
void comm_allreduce_sum(void* buf, size_t count, CommType type);
// buf holds world * shard elements; afterwards rank r's part buf[r*shard, (r+1)*shard) holds the
// sum over the ranks of that part (the other parts are left unspecified).
void comm_reduce_scatter_sum(void* buf, size_t shard, CommType type);
// out (world * shard elements) = the shard of every rank, rank r's at out + r*shard. shard_in may
// be out + rank*shard (in place).
void comm_allgather(void* out, const void* shard_in, size_t shard, CommType type);
// n host doubles combined over the ranks with op, in place.
void comm_allreduce_host(double* values, int n, CommOp op);
// Sums of pieces of buf over the ranks that run beside the work queued after them (the backward's
// next layers), unlike the calls above: each piece, count elements at offset, becomes on every rank
// (root < 0) or on rank root alone (ZeRO's shards) the sum of the ranks' values there. They run
// after the work queued so far, in the order queued, and the call returns at once; comm_sums_wait
// waits for all of them. On 2 ranks every sum is a + b, so a piece sums to the bits of the same
// elements in comm_allreduce_sum or comm_reduce_scatter_sum. Until the wait, nothing may write the
// pieces, nor read them on a rank that receives their sum.
typedef struct {
    size_t offset, count;
    int root;
} CommPiece;
void comm_sum_pieces_begin(void* buf, const CommPiece* pieces, int n, CommType type);
void comm_sums_wait(void);

#ifdef __cplusplus
}
#endif
