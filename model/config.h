// GPT-2 configuration and the parameter layout shared by the model, the model file and the tests.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPT2_VOCAB_SIZE 50257
#define GPT2_EOT 50256          // <|endoftext|>
#define NUM_PARAMETER_TENSORS 16

typedef struct {
    int max_seq_len;       // maxT: rows of wpe
    int vocab_size;        // V: real vocabulary (50257)
    int padded_vocab_size; // Vp: V rounded up to a multiple of 128 (50304), rows of wte
    int num_layers;        // L
    int num_heads;         // NH
    int channels;          // C
} GPT2Config;

// The 16 parameter tensors in model-file order: wte (Vp, C), wpe (maxT, C), ln1w (L, C),
// ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C), ln2w (L, C),
// ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C), lnfw (C), lnfb (C).
enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB
};
extern const char* const parameter_tensor_names[NUM_PARAMETER_TENSORS];

// Fills sizes[16] (in elements) and returns the total number of parameters.
size_t gpt2_parameter_sizes(const GPT2Config* cfg, size_t sizes[NUM_PARAMETER_TENSORS]);

// Whether tensor i is a 2-D weight matrix (wte, wpe, qkvw, attprojw, fcw, fcprojw): initialised from
// normals, and the only tensors AdamW's weight decay applies to (not the biases and layernorm
// parameters).
int gpt2_is_weight_matrix(int tensor);

// The seed of tensor i's random numbers in AdamW (its stochastic rounding), from the run's seed.
unsigned long long gpt2_tensor_seed(unsigned long long seed, int tensor);

// Whether tensor i's gradient is a product's weight gradient, which the product can write without
// reading it (GRAD_WRITE, kernels.h): wte's (the head's), qkvw's, attprojw's, fcw's and fcprojw's,
// the weight matrices but wpe, whose gradient the encoder's backward adds into. The other gradients
// are added into, so they start from zeros.
int gpt2_gradient_written(int tensor);

// The gradients that gpt2_zero_grad zeroes: every tensor but those that a step's first product
// writes (gpt2_gradient_written), in runs of neighbours in
// model-file order. Fills start[] and count[] (elements, at most NUM_PARAMETER_TENSORS runs) and
// returns the number of runs: 5 in GPT-2's order, 0.1% of GPT-2 124M's gradients.
int gpt2_zeroed_gradient_runs(const size_t sizes[NUM_PARAMETER_TENSORS], size_t start[], size_t count[]);

// The first non-finite value of `count` parameters that start at parameter `offset` (model-file
// order): returns 1 and its tensor (an index into parameter_tensor_names) and index within that
// tensor, or 0 when every value is finite.
int gpt2_find_nonfinite(const GPT2Config* cfg, const float* values, size_t offset, size_t count,
                        int* tensor, size_t* index);
// The same for the first value that is NaN or whose magnitude is above max_abs (fp16's largest,
// 65504, when the FP16 build loads weights).
int gpt2_find_beyond(const GPT2Config* cfg, const float* values, size_t offset, size_t count, float max_abs,
                     int* tensor, size_t* index);

// GPT-2 sizes by depth, as in the GPT-2 paper: d12 (124M), d24 (350M), d36 (774M), d48 (1558M).
#define GPT2_NUM_PRESETS 4
extern const char* const gpt2_preset_names[GPT2_NUM_PRESETS];
// Sets the layers, heads and channels of a preset name and returns 1; returns 0 for another name.
int gpt2_preset(const char* name, GPT2Config* cfg);

// Vp for a vocabulary of V: the next multiple of 128.
int gpt2_padded_vocab(int V);

// The LM head (logits, classifier and, in a training forward, the head's backward) runs over slices
// of the batch, so that only one slice's logits are ever stored: GPT-2 124M at B 64, T 1024 keeps
// 824 MB of bf16 logits instead of 6.6 GB. Returns the sequences per slice for a batch of B
// sequences of T tokens whose gradients are summed in groups of `group` sequences (the
// group_sequences of --batch-invariant; 0: no groups): about slice_tokens tokens, at least one
// sequence; a multiple of group, or a divisor of group when one group is longer, so that every
// slice's products have a shape set by group and T alone (the same bits for every B, as
// --batch-invariant promises). group = 0 gives the largest slice.
// slice_tokens is GPT2_HEAD_SLICE_TOKENS times 1, 2 or 4 (or a half, a quarter or an eighth, below),
// the widest whose plan fits the memory (train_gpt: gpt2_fit_head_slice_tokens, model/fit.h): each
// slice's backward reads and writes the head's fp32 weight gradient (154 MB at GPT-2 124M), so at
// B 64, T 1024 slices of 16384 tokens move 1.2 GB a step less than 8192's for 0.8 GB more memory,
// and 32768 another 0.6 GB less for 1.6 GB more. The widest stops there: a next doubling would save
// 0.3 GB for 3.3 GB. Where a micro-batch fits only with narrower slices, and no --batch-invariant
// group is kept, -b auto halves them down to GPT2_HEAD_NARROWEST_SLICE_TOKENS before it halves B:
// slices of 1024 tokens pass over that gradient once per 1024 tokens (d36: 515 MB, 0.9% of a step
// on an H200, docs/options.md), where half the micro-batch costs several times that. Without
// --batch-invariant the slice changes the order of that gradient's sums, so the bits; with it, they
// stay: a slice is made of whole groups, and a group longer than GPT2_HEAD_SLICE_TOKENS is split as
// GPT2_HEAD_SLICE_TOKENS splits it.
#define GPT2_HEAD_SLICE_TOKENS 8192
#define GPT2_HEAD_WIDEST_SLICE_TOKENS (4 * GPT2_HEAD_SLICE_TOKENS)
#define GPT2_HEAD_NARROWEST_SLICE_TOKENS (GPT2_HEAD_SLICE_TOKENS / 8)
int gpt2_head_slice_sequences(int B, int T, int group, int slice_tokens);
// The sequences of each product and gradient sum within a head slice of `slice` sequences (as
// gpt2_head_slice_sequences gives for group > 0): the groups of `group` sequences, or the whole slice
// where it is part of a longer group.
int gpt2_head_group_sequences(int slice, int group);

// Checks that the configuration is possible (positive sizes, heads dividing channels, ...). Returns
// NULL if it is, else a static message naming the problem.
const char* gpt2_config_problem(const GPT2Config* cfg);

#ifdef __cplusplus
}
#endif
