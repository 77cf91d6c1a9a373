# Builds of the GPT trainer. Flags (see docs/options.md, "Build variables"):
#   ATTN=flash|naive      attention compiled in (both backends)        default flash
#   PRECISION=BF16|FP16|FP32  GPU storage type (the CPU backend is fp32)  default BF16
#                         (FP16: with dynamic loss scaling; the one for sm_75, T4 / RTX 20xx)
#   GPU_ARCH="80 86 89 90" SASS to build for train_gpt (75 also, FP16 only) default 80 86 89 90 120
#                         (FP16: 75 80 86 89 90 120; 120 where the toolkit knows it)
#   GRADS=FP32|BF16       train_gpt's parameter gradients: fp32, or bf16 (PRECISION=BF16 only)   default FP32
#                         with an fp32 scratch of two layers and wte/wpe, rounded once a micro-step
#                         (train_gpt_cpu's are fp32 always)
#   BUILD=DIR             where objects and binaries go                default .
#   NCCL=1|0              multi-GPU train_gpt through NCCL             default 1 when nccl.h is found
#   MARCH=native|x86-64|x86-64-v3|...  gcc's -march for the C code    default native
#   PERTURB=attn-scale|ln-eps  tests only: the attention scale 1% high, or the layernorm epsilon
#                         1e-3 instead of 1e-5 (kernels/constants.h), built into BUILD/perturb-NAME
# Targets: train_gpt_cpu, train_gpt, prepare_data, setup (installs what test needs), test (what CI
# runs), test-gpu (needs a GPU).

ATTN ?= flash
PRECISION ?= BF16
CUDA_HOME ?= /usr/local/cuda
# The consumer Blackwell cards (RTX 50xx, sm_120), where the toolkit knows them (CUDA 12.8 and newer):
# with an older one the default builds the others, and train_gpt on such a card says to rebuild.
SM120 := $(if $(shell $(CUDA_HOME)/bin/nvcc --list-gpu-arch 2>/dev/null | grep -x compute_120),120)
# FP16 is the precision of Turing (sm_75), which BF16 cannot serve: its default includes it.
GPU_ARCH ?= $(if $(filter FP16,$(PRECISION)),75 80 86 89 90,80 86 89 90) $(SM120)
BUILD ?= .

# A relative GPT_DATA_DIR (the raw data, scripts/get_data.sh) is taken from the directory make was
# started in: $(PWD), the caller's shell directory; recipes run in $(CURDIR), another after make -C.
ifneq ($(filter-out /%,$(GPT_DATA_DIR)),)
override GPT_DATA_DIR := $(or $(PWD),$(CURDIR))/$(GPT_DATA_DIR)
export GPT_DATA_DIR
endif

ifeq ($(filter $(ATTN),flash naive),)
$(error ATTN must be flash or naive, not '$(ATTN)')
endif
ifeq ($(filter $(PRECISION),BF16 FP16 FP32),)
$(error PRECISION must be BF16, FP16 or FP32, not '$(PRECISION)')
endif
GRADS ?= FP32
ifeq ($(filter $(GRADS),FP32 BF16),)
$(error GRADS must be FP32 or BF16, not '$(GRADS)')
endif
# bf16 gradients fold into an array of floatX's type: the kernels that fold them and sum them over the
# ranks are BF16's.
ifneq ($(and $(filter BF16,$(GRADS)),$(filter-out BF16,$(PRECISION))),)
$(error GRADS=BF16 needs PRECISION=BF16, not PRECISION=$(PRECISION))
endif
# Only the CUDA build's sources see it (kernels/cuda/cuda.mk: train_gpt and its test programs); their
# objects and the stamp are named by it, and a GRADS=FP32 build keeps the names it had before.
GRADS_DEF = $(if $(filter BF16,$(GRADS)),-DGRADS_BF16)
GRADS_TAG = $(if $(filter BF16,$(GRADS)),-gradsBF16)
# Turing (sm_75) has fp16 tensor cores but no bf16 ones.
ifneq ($(and $(filter BF16,$(PRECISION)),$(filter 75,$(GPU_ARCH))),)
$(error PRECISION=BF16 needs bf16 tensor cores (sm_80 or newer): GPU_ARCH 75 (T4, RTX 20xx) builds with PRECISION=FP16)
endif

# A wrong constant that a recipe's verdict must refuse (tests/gpu/test_recipe_power.sh).
PERTURB ?=
PERTURB_DEF_attn-scale = -DATTENTION_SCALE_FACTOR=1.01f
PERTURB_DEF_ln-eps = -DLAYERNORM_EPS=1e-3f
ifneq ($(PERTURB),)
ifeq ($(PERTURB_DEF_$(PERTURB)),)
$(error PERTURB must be attn-scale or ln-eps, not '$(PERTURB)')
endif
# Its objects and programs go to a directory of their own, so they never mix with a true build's.
override BUILD := $(BUILD)/perturb-$(PERTURB)
endif

CC ?= gcc
# The CPU the C code is built for: native uses every instruction of this one (FMA, AVX-512, ...); another
# CPU sums in another order (scripts/write_envelope.sh builds x86-64 and x86-64-v3 to show it).
MARCH ?= native
NCCL ?= $(if $(wildcard $(CUDA_HOME)/include/nccl.h $(NCCL_HOME)/include/nccl.h),1,0)
STB_INCLUDE ?= /usr/include/stb
ATTN_DEF = -DATTN_$(shell echo $(ATTN) | tr a-z A-Z)
WARN = -Wall -Wextra
CFLAGS_BASE = -std=gnu11 -O3 -march=$(MARCH) -fopenmp $(WARN) -I. -I$(STB_INCLUDE) -I$(CUDA_HOME)/include -MMD -MP \
    $(PERTURB_DEF_$(PERTURB))
CFLAGS_CPU = $(CFLAGS_BASE) $(ATTN_DEF)
LDLIBS_CPU = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcurand -lm -fopenmp

OBJ = $(BUILD)/obj
CONFIG_STAMP = $(OBJ)/config-$(ATTN)-$(PRECISION)$(GRADS_TAG)-nccl$(NCCL).stamp

COMMON_SRC = common/util.c common/config_file.c common/crc32c.c common/gpu_peaks.c model/config.c
DATA_SRC = data/tokenfile.c data/dataloader.c data/tokenizer.c data/jsonl.c data/hellaswag.c
CKPT_SRC = $(wildcard checkpoints/*.c)
MODEL_SRC = model/gpt2.c model/init.c model/generate.c model/fit.c
# The trainer: the program and the evaluations it runs.
TRAIN_SRC = train.c eval/evaluate.c eval/hellaswag.c
CPU_KERNEL_SRC = $(wildcard kernels/cpu/*.c)
LIB_SRC = $(COMMON_SRC) common/atomic_file.c common/dist.c common/rendezvous.c common/tcp.c $(DATA_SRC) $(CKPT_SRC)

# CPU objects live in a directory per attention variant so variants never overwrite each other.
CPU_OBJ = $(OBJ)/cpu-$(ATTN)
cpu_obj = $(patsubst %.c,$(CPU_OBJ)/%.o,$(1))

.PHONY: all setup test test-programs test-gpu clean
all: $(BUILD)/train_gpt_cpu $(BUILD)/prepare_data

# Short names for the programs of another BUILD (with BUILD=. they are the files themselves).
ifneq ($(abspath $(BUILD)),$(CURDIR))
train_gpt_cpu: $(BUILD)/train_gpt_cpu
prepare_data: $(BUILD)/prepare_data
endif

# The stamp changes whenever the flags of this BUILD change, so binaries relink on a switch.
$(CONFIG_STAMP):
	@mkdir -p $(OBJ) && rm -f $(OBJ)/config-*.stamp && touch $@

$(CPU_OBJ)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_CPU) -c $< -o $@

$(BUILD)/train_gpt_cpu: $(call cpu_obj,$(TRAIN_SRC) $(MODEL_SRC) $(CPU_KERNEL_SRC) $(LIB_SRC)) $(CONFIG_STAMP)
	$(CC) $(filter %.o,$^) $(LDLIBS_CPU) -o $@

$(BUILD)/prepare_data: $(call cpu_obj,data/prepare_data.c $(LIB_SRC))
	$(CC) $^ $(LDLIBS_CPU) -o $@

# ---- tests -------------------------------------------------------------------------------
# Each test links only the parts it tests, so parts can be built and tested on their own.
TEST_BIN = $(BUILD)/tests
CPU_TESTS = test_kernels_cpu test_attention_cpu test_tokenizer test_jsonl test_data test_checkpoint test_dist test_memory_fit test_gpt2 \
    test_gpu_peaks
TEST_BASE = tests/lib/testutil.c $(COMMON_SRC)
LAYER_SRC = $(filter-out kernels/cpu/attention% kernels/cpu/comm.c,$(CPU_KERNEL_SRC))
ATTN_SRC = $(filter kernels/cpu/attention%,$(CPU_KERNEL_SRC))
test_kernels_cpu_SRC = $(LAYER_SRC)
test_attention_cpu_SRC = $(ATTN_SRC) kernels/cpu/matmul.c # the qkv bias gradient: matmul_backward's column sums
test_tokenizer_SRC = data/tokenizer.c data/jsonl.c
test_jsonl_SRC = data/jsonl.c
test_data_SRC = data/tokenfile.c data/dataloader.c common/atomic_file.c
test_checkpoint_SRC = data/tokenfile.c data/dataloader.c common/atomic_file.c $(CKPT_SRC)
# How ranks meet (the rendezvous, over TCP or through a file): test_dist's subject, and what
# kernels/cpu/comm.c needs besides
RANKS_SRC = common/dist.c common/rendezvous.c common/tcp.c common/atomic_file.c
test_dist_SRC = $(RANKS_SRC)
test_memory_fit_SRC = $(MODEL_SRC) $(CPU_KERNEL_SRC) $(RANKS_SRC)
test_gpt2_SRC = $(MODEL_SRC) $(CPU_KERNEL_SRC) $(RANKS_SRC)

# Whole-model test programs linked like train_gpt_cpu: one forward + backward dumped for
# tests/gpu/test_gpu_grads.sh, greedy generation against the argmax of the logits, and the logits of a
# model file for tests/e2e/test_hf.sh.
$(TEST_BIN)/dump_grads_cpu: $(call cpu_obj,tests/lib/dump_grads.c)
$(TEST_BIN)/test_generate_cpu: $(call cpu_obj,tests/unit/test_generate.c)
$(TEST_BIN)/dump_logits_cpu: $(call cpu_obj,tests/lib/dump_logits.c)
$(TEST_BIN)/dump_grads_cpu $(TEST_BIN)/test_generate_cpu $(TEST_BIN)/dump_logits_cpu: $(call cpu_obj,$(MODEL_SRC) $(CPU_KERNEL_SRC) $(LIB_SRC) tests/lib/testutil.c) $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(filter %.o,$^) $(LDLIBS_CPU) -o $@

.SECONDEXPANSION:
$(TEST_BIN)/%: $$(call cpu_obj,tests/unit/%.c $$(TEST_BASE) $$($$*_SRC))
	@mkdir -p $(dir $@)
	$(CC) $(filter %.o,$^) $(LDLIBS_CPU) -o $@

# Sanitizer and fuzzer builds (clang): bad input must give a clean message and no report.
SAN_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1
$(BUILD)/san/train_gpt_cpu $(BUILD)/san/prepare_data: $(wildcard *.c */*.c */*/*.c *.h */*.h */*/*.h)
	@mkdir -p $(BUILD)/san
	clang -std=gnu11 $(WARN) -I. -I$(STB_INCLUDE) -I$(CUDA_HOME)/include $(ATTN_DEF) $(SAN_FLAGS) -fopenmp \
	    $(TRAIN_SRC) $(MODEL_SRC) $(CPU_KERNEL_SRC) $(LIB_SRC) $(LDLIBS_CPU) -o $(BUILD)/san/train_gpt_cpu
	clang -std=gnu11 $(WARN) -I. -I$(STB_INCLUDE) $(SAN_FLAGS) -fopenmp \
	    data/prepare_data.c $(LIB_SRC) $(LDLIBS_CPU) -o $(BUILD)/san/prepare_data

FUZZERS = fuzz_tokenfile fuzz_modelfile fuzz_statefile fuzz_tokenizer fuzz_jsonl
fuzz_tokenfile_SRC = data/tokenfile.c common/atomic_file.c
fuzz_modelfile_SRC = data/tokenfile.c data/dataloader.c common/atomic_file.c $(CKPT_SRC)
fuzz_statefile_SRC = $(fuzz_modelfile_SRC)
fuzz_tokenizer_SRC = data/tokenizer.c data/jsonl.c
fuzz_jsonl_SRC = data/jsonl.c
$(BUILD)/fuzz/%: tests/fuzz/%.c $$($$*_SRC) $(COMMON_SRC) $(wildcard */*.h)
	@mkdir -p $(BUILD)/fuzz
	clang -std=gnu11 $(WARN) -I. -I$(STB_INCLUDE) -fsanitize=fuzzer,address,undefined -g -O1 \
	    $< $($*_SRC) $(COMMON_SRC) -lm -o $@

# tests/run_cpu_tests.sh checks the prerequisites and fetches the data before it builds
# test-programs, so that a missing piece stops `make test` before any build.
FUZZ_SECONDS ?= 60
test:
	@BUILD=$(BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) tests/run_cpu_tests.sh
test-programs: all $(addprefix $(TEST_BIN)/,$(CPU_TESTS)) $(TEST_BIN)/test_generate_cpu $(TEST_BIN)/dump_logits_cpu $(BUILD)/san/train_gpt_cpu $(addprefix $(BUILD)/fuzz/,$(FUZZERS))

setup:
	scripts/setup.sh

include kernels/cuda/cuda.mk

# Keep intermediate objects of the chained pattern rules. (Not `.SECONDARY:` for everything: that
# made the config stamp intermediate too, so a missing stamp did not relink after a flag change.)
.PRECIOUS: %.o

clean:
	rm -rf $(OBJ) $(TEST_BIN) $(BUILD)/san $(BUILD)/fuzz $(BUILD)/train_gpt_cpu $(BUILD)/train_gpt $(BUILD)/prepare_data

-include $(shell find $(OBJ) -name '*.d' 2>/dev/null)
