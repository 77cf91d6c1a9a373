#include "model/config.h"

#include <float.h>
#include <math.h>
#include <string.h>

const char* const parameter_tensor_names[NUM_PARAMETER_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

size_t gpt2_parameter_sizes(const GPT2Config* cfg, size_t sizes[NUM_PARAMETER_TENSORS]) {
    size_t Vp = (size_t)cfg->padded_vocab_size, C = (size_t)cfg->channels;
    size_t L = (size_t)cfg->num_layers, maxT = (size_t)cfg->max_seq_len;
    sizes[P_WTE] = Vp * C;
    sizes[P_WPE] = maxT * C;
    sizes[P_LN1W] = L * C;
    sizes[P_LN1B] = L * C;
    sizes[P_QKVW] = L * 3 * C * C;
    sizes[P_QKVB] = L * 3 * C;
    sizes[P_ATTPROJW] = L * C * C;
    sizes[P_ATTPROJB] = L * C;
    sizes[P_LN2W] = L * C;
    sizes[P_LN2B] = L * C;
    sizes[P_FCW] = L * 4 * C * C;
    sizes[P_FCB] = L * 4 * C;
    sizes[P_FCPROJW] = L * C * 4 * C;
    sizes[P_FCPROJB] = L * C;
    sizes[P_LNFW] = C;
    sizes[P_LNFB] = C;
    size_t total = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) total += sizes[i];
    return total;
}

int gpt2_is_weight_matrix(int tensor) {
    return tensor == P_WTE || tensor == P_WPE || tensor == P_QKVW || tensor == P_ATTPROJW || tensor == P_FCW ||
           tensor == P_FCPROJW;
}

unsigned long long gpt2_tensor_seed(unsigned long long seed, int tensor) {
    return seed + 1000003ull * (unsigned)tensor;
}

int gpt2_gradient_written(int tensor) {
    return gpt2_is_weight_matrix(tensor) && tensor != P_WPE;
}

int gpt2_zeroed_gradient_runs(const size_t sizes[NUM_PARAMETER_TENSORS], size_t start[], size_t count[]) {
    int runs = 0;
    size_t offset = 0, run = 0; // the run being gathered: [run, offset)
    for (int i = 0; i < NUM_PARAMETER_TENSORS; offset += sizes[i], i++) {
        if (!gpt2_gradient_written(i)) continue;
        if (offset > run) start[runs] = run, count[runs++] = offset - run;
        run = offset + sizes[i];
    }
    if (offset > run) start[runs] = run, count[runs++] = offset - run;
    return runs;
}

int gpt2_find_nonfinite(const GPT2Config* cfg, const float* values, size_t offset, size_t count,
                        int* tensor, size_t* index) {
    return gpt2_find_beyond(cfg, values, offset, count, FLT_MAX, tensor, index);
}

int gpt2_find_beyond(const GPT2Config* cfg, const float* values, size_t offset, size_t count, float max_abs,
                     int* tensor, size_t* index) {
    size_t i = 0;
    while (i < count && fabsf(values[i]) <= max_abs) i++; // false for NaN
    if (i == count) return 0;
    size_t sizes[NUM_PARAMETER_TENSORS], position = offset + i;
    gpt2_parameter_sizes(cfg, sizes);
    int t = 0;
    while (t < NUM_PARAMETER_TENSORS - 1 && position >= sizes[t]) position -= sizes[t++];
    *tensor = t;
    *index = position;
    return 1;
}

const char* const gpt2_preset_names[GPT2_NUM_PRESETS] = {"d12", "d24", "d36", "d48"};

int gpt2_preset(const char* name, GPT2Config* cfg) {
    static const struct { int L, C, NH; } sizes[GPT2_NUM_PRESETS] = {
        {12, 768, 12}, {24, 1024, 16}, {36, 1280, 20}, {48, 1600, 25}};
    for (int i = 0; i < GPT2_NUM_PRESETS; i++) {
        if (strcmp(name, gpt2_preset_names[i]) == 0) {
            cfg->num_layers = sizes[i].L;
            cfg->channels = sizes[i].C;
            cfg->num_heads = sizes[i].NH;
            return 1;
        }
    }
    return 0;
}

int gpt2_padded_vocab(int V) { return (V + 127) / 128 * 128; }

int gpt2_head_slice_sequences(int B, int T, int group, int slice_tokens) {
    // A group longer than GPT2_HEAD_SLICE_TOKENS is split into the same parts whatever slice_tokens
    // is: its parts' products are its gradient sums, whose bits --batch-invariant keeps on every card.
    if (group > 0 && (long long)group * T > GPT2_HEAD_SLICE_TOKENS) slice_tokens = GPT2_HEAD_SLICE_TOKENS;
    int fit = T < slice_tokens ? slice_tokens / T : 1;
    int s = fit;
    if (group > 0 && group <= fit) s = fit / group * group;
    else if (group > fit)
        while (group % s != 0) s--;
    return s < B ? s : B;
}

int gpt2_head_group_sequences(int slice, int group) { return slice < group ? slice : group; }

const char* gpt2_config_problem(const GPT2Config* cfg) {
    if (cfg->max_seq_len < 1 || cfg->max_seq_len > (1 << 20)) return "max sequence length must be in 1..1048576";
    if (cfg->vocab_size < 1 || cfg->vocab_size > 65536) return "vocabulary size must be in 1..65536 (tokens are uint16)";
    if (cfg->padded_vocab_size < cfg->vocab_size) return "padded vocabulary is smaller than the vocabulary";
    if (cfg->padded_vocab_size > (1 << 20)) return "padded vocabulary size is impossibly large";
    if (cfg->num_layers < 1 || cfg->num_layers > 1024) return "number of layers must be in 1..1024";
    if (cfg->num_heads < 1) return "number of heads must be at least 1";
    if (cfg->channels < 1 || cfg->channels > 65536) return "channels must be in 1..65536";
    if (cfg->channels % cfg->num_heads != 0) return "the number of heads must divide the channels";
    return NULL;
}
