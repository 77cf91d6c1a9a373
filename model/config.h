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

// Vp for a vocabulary of V: the next multiple of 128.
int gpt2_padded_vocab(int V);

// Checks that the configuration is possible (positive sizes, heads dividing channels, ...). Returns
// NULL if it is, else a static message naming the problem.
const char* gpt2_config_problem(const GPT2Config* cfg);

#ifdef __cplusplus
}
#endif
