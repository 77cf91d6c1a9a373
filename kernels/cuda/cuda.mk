# CUDA builds: included by the Makefile (`include kernels/cuda/cuda.mk`), which defines ATTN,
# PRECISION, GRADS_DEF, GRADS_TAG, GPU_ARCH, BUILD, OBJ, CFLAGS_BASE, ATTN_DEF, LIB_SRC, MODEL_SRC, TRAIN_SRC,
# COMMON_SRC, CUDA_HOME.
# Objects of each PRECISION x GRADS x GPU_ARCH go to their own directory, so variants never mix; those of
# the sources that depend on ATTN (CUDA_ATTN_SRC) to one per ATTN as well, the others are shared by
# both attention variants.
#   $(BUILD)/train_gpt                 the trainer
#   $(BUILD)/tests/test_attention_gpu  the flash kernels against the CPU flash reference
#   $(BUILD)/tests/test_kernels_gpu    every CUDA kernel against the CPU reference kernels
#   $(BUILD)/profile_step              per-kernel time split of one training step (scripts/profile_step.sh)
#   $(BUILD)/bench_attention           flash attention's speed (scripts/bench_attention.sh; ATTN=flash)
#   $(BUILD)/tests/dump_grads          the whole model's loss and gradients of one batch
#   $(BUILD)/tests/test_generate       greedy generation against the argmax of the logits
#   $(BUILD)/tests/dump_logits         the logits of a model file for some tokens (tests/gpu/test_hf_gpu.sh)
#   test-cuda-compile                  compiles every variant for sm 80 86 89 90 (BF16 also 120 where
#                                      the toolkit knows it; FP16: 75; GRADS=BF16: flash for 80 90),
#                                      warnings fatal
#   test-gpu                           the GPU tests (needs a GPU; the divergence guard's also on 2 GPUs
#                                      when there are 2)
#   test-multi-gpu                     data parallelism on 2 GPUs against 1 (needs 2 GPUs)
#   test-two-nodes                     2 GPUs as two nodes: TCP rendezvous, NCCL over sockets

NVCC ?= $(CUDA_HOME)/bin/nvcc
# The makefile that make was started with (the Makefile, which includes this file) for sub-makes.
TOP_MAKEFILE := $(firstword $(MAKEFILE_LIST))
PRECISION_DEF = -DPRECISION_$(PRECISION)
cuda_empty :=
cuda_space := $(cuda_empty) $(cuda_empty)
comma := ,
# The sources whose code tests ATTN_FLASH / ATTN_NAIVE: compiled with ATTN_DEF, into a directory per
# ATTN. Every other source of the CUDA builds is compiled without it, once for both variants (layernorm.cu
# and encoder.cu alone take some 2.5 minutes for the four architectures of test-cuda-compile), so a
# source that comes to depend on ATTN must be listed here.
CUDA_ATTN_SRC = kernels/cuda/backend.cu kernels/cuda/attention_flash.cu kernels/cuda/attention_naive.cu \
    tests/gpu/test_attention_gpu.cu
cuda_variant = $(PRECISION)$(GRADS_TAG)-sm$(subst $(cuda_space),_,$(strip $(GPU_ARCH)))
CUDA_OBJ = $(OBJ)/cuda-$(cuda_variant)
CUDA_ATTN_OBJ = $(OBJ)/cuda-$(ATTN)-$(cuda_variant)
cuda_obj = $(foreach s,$(1),$(if $(filter $(s),$(CUDA_ATTN_SRC)),$(CUDA_ATTN_OBJ),$(CUDA_OBJ))/$(basename $(s)).o)
# 90 builds as sm_90a: the same H100/H200 code plus their wgmma instructions (flash attention).
cuda_sass = $(if $(filter 90,$(1)),90a,$(1))
# The lowest of 75 and 80 in GPU_ARCH also carries its PTX, which the driver compiles for any newer
# card: a card the build has no SASS for (a newer architecture than its list) still runs, and a build
# for 75 or 80 alone runs a T4's or an A100's instructions on an H100/H200 (how the GPU machine tests
# that code). No CUDA_FORCE_PTX_JIT=1 is needed, as such a build holds no SASS for those cards; it
# would also force cuBLAS's kernels through PTX, which the library need not ship for them.
PTX_ARCH = $(firstword $(sort $(filter 75 80,$(GPU_ARCH))))
GENCODE = $(foreach arch,$(GPU_ARCH),-gencode arch=compute_$(call cuda_sass,$(arch)),code=sm_$(call cuda_sass,$(arch))) \
    $(if $(PTX_ARCH),-gencode arch=compute_$(PTX_ARCH)$(comma)code=compute_$(PTX_ARCH))
# CUDA_WERROR=1 (set by test-cuda-compile) makes every warning of our code an error.
CUDA_WERROR ?= 0
NVCC_WERROR = $(if $(filter 1,$(CUDA_WERROR)),-Werror all-warnings -Xcompiler -Werror)
GCC_WERROR = $(if $(filter 1,$(CUDA_WERROR)),-Werror)
NVCCFLAGS = -std=c++17 -O3 $(GENCODE) -I. -I$(CUDA_HOME)/include $(PRECISION_DEF) $(GRADS_DEF) $(PERTURB_DEF_$(PERTURB)) \
    -Xcompiler -Wall,-Wextra $(NVCC_WERROR) -MMD -MP
CFLAGS_CUDA_HOST = $(CFLAGS_BASE) $(PRECISION_DEF) $(GRADS_DEF) $(GCC_WERROR)
LDLIBS_CUDA = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcurand \
    -lcudart -lstdc++ -lm -fopenmp
# One attention file per variant, like kernels/cpu/attention_{naive,flash}.c. The data-parallel
# communication (comm.cu, NCCL) is linked only where the model is: the kernel tests do not need it.
CUDA_KERNEL_SRC = $(filter-out kernels/cuda/attention_%.cu kernels/cuda/comm.cu,$(wildcard kernels/cuda/*.cu)) \
    kernels/cuda/attention_$(ATTN).cu
# NCCL=1 (the Makefile's default when nccl.h is found) links NCCL for several GPUs; NCCL=0 builds a
# train_gpt whose ranks add over TCP through rank 0, with the CPU build's kernels/cpu/comm.c.
ifeq ($(NCCL),1)
COMM_SRC = kernels/cuda/comm.cu
NCCL_LIBDIR = $(if $(NCCL_HOME),$(NCCL_HOME)/lib,$(CUDA_HOME)/lib64)
LDLIBS_NCCL = -L$(NCCL_LIBDIR) -Wl,-rpath,$(NCCL_LIBDIR) -lnccl
else
COMM_SRC = kernels/cpu/comm.c
LDLIBS_NCCL =
endif

.PHONY: train_gpt test-cuda-compile test-gpu test-multi-gpu test-two-nodes
train_gpt: $(BUILD)/train_gpt

# The CUDA objects depend on this file, whose GENCODE says which architectures' code (and PTX) they
# hold: a change here rebuilds them.
$(CUDA_OBJ)/%.o: %.cu kernels/cuda/cuda.mk
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(CUDA_ATTN_OBJ)/%.o: %.cu kernels/cuda/cuda.mk
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(ATTN_DEF) -c $< -o $@

$(CUDA_OBJ)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_CUDA_HOST) -c $< -o $@

$(BUILD)/train_gpt: $(call cuda_obj,$(TRAIN_SRC) $(MODEL_SRC) $(LIB_SRC) $(CUDA_KERNEL_SRC) $(COMM_SRC)) $(CONFIG_STAMP)
	$(CC) $(filter %.o,$^) $(LDLIBS_NCCL) $(LDLIBS_CUDA) -o $@

# Whole-model test programs linked like train_gpt: the loss and gradients of one batch for
# tests/gpu/test_gpu_grads.sh, greedy generation against the argmax of the logits, and the logits of a
# model file for tests/gpu/test_hf_gpu.sh.
$(TEST_BIN)/dump_grads: $(call cuda_obj,tests/lib/dump_grads.c)
$(TEST_BIN)/test_generate: $(call cuda_obj,tests/unit/test_generate.c)
$(TEST_BIN)/dump_logits: $(call cuda_obj,tests/lib/dump_logits.c)
$(TEST_BIN)/dump_grads $(TEST_BIN)/test_generate $(TEST_BIN)/dump_logits: $(call cuda_obj,$(MODEL_SRC) $(LIB_SRC) $(CUDA_KERNEL_SRC) $(COMM_SRC) tests/lib/testutil.c) $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(filter %.o,$^) $(LDLIBS_NCCL) $(LDLIBS_CUDA) -o $@

# The CPU reference kernels, renamed cpu_<name> (kernels/cpu_reference_names.h), fp32 as always.
CPU_REF_OBJ = $(OBJ)/cpu-reference-$(ATTN)
$(CPU_REF_OBJ)/%.o: %.c kernels/cpu_reference_names.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_CPU) -include kernels/cpu_reference_names.h -c $< -o $@

$(TEST_BIN)/test_kernels_gpu: $(call cuda_obj,tests/gpu/test_kernels_gpu.cu tests/lib/testutil.c $(COMMON_SRC) $(CUDA_KERNEL_SRC)) \
                              $(patsubst %.c,$(CPU_REF_OBJ)/%.o,$(filter-out kernels/cpu/comm.c,$(CPU_KERNEL_SRC)))
	@mkdir -p $(dir $@)
	$(CC) $^ $(LDLIBS_CUDA) -o $@

# The flash kernels against the CPU flash reference (its own names, attention_flash_*_cpu); backend.cu
# for the column sums of the qkv bias gradient.
$(TEST_BIN)/test_attention_gpu: $(call cuda_obj,tests/gpu/test_attention_gpu.cu tests/lib/testutil.c $(COMMON_SRC) kernels/cuda/attention_flash.cu kernels/cuda/backend.cu) \
                                $(CPU_REF_OBJ)/kernels/cpu/attention_flash.o
	@mkdir -p $(dir $@)
	$(CC) $^ $(LDLIBS_CUDA) -o $@

# Flash attention's speed beside PyTorch's (scripts/bench_attention.sh; ATTN=flash only); backend.cu
# for the column sums of the qkv bias gradient.
$(BUILD)/bench_attention: $(call cuda_obj,scripts/bench_attention.cu $(COMMON_SRC) kernels/cuda/attention_flash.cu kernels/cuda/backend.cu)
	$(CC) $^ $(LDLIBS_CUDA) -o $@

# Times every kernel call of one training step; the model's shapes come from its options (its token
# ids from a token file with --tokens). libdl for NVML's energy counter, opened at run time, and
# pthreads for the thread that polls it.
$(BUILD)/profile_step: $(call cuda_obj,scripts/profile_step.cu $(COMMON_SRC) model/init.c data/tokenfile.c common/atomic_file.c \
    $(CUDA_KERNEL_SRC)) $(CONFIG_STAMP)
	$(CC) $(filter %.o,$^) $(LDLIBS_CUDA) -ldl -lpthread -o $@

# Every ATTN x PRECISION for all four architectures without a warning in our code. A target per
# PRECISION, so that `make -j` builds the two side by side, each in a BUILD dir of its own where the
# naive variant follows the flash one and reuses its objects of the sources that do not depend on
# ATTN (the two variants' programs have the same names there: the naive ones are left, and the flash
# train_gpt as train_gpt-flash, whose --dry-run tests/e2e/test_offload_plan.sh asks).
# FP16 for sm 75 alone, its own code (plain copies for cp.async, m16n8k8 products): elsewhere it
# compiles BF16's source with the other element type. Its sm_90a code (fp16 wgmma) is compiled by
# test-gpu: measured 2026-12-02, FP16 for 75 takes 97 s of CPU (about 50 s of CI's 2 cores), and 90
# would add 66 s of CPU more.
# BF16-grads, GRADS=BF16 on PRECISION=BF16, compiles the flash variant for sm 80 and 90 alone (2 minutes
# of CPU): what it changes (the folds of the gradients, AdamW and the norm reading them) depends
# neither on the attention nor on the architecture. BF16, the RTX 50xx's precision, also for sm 120.
CUDA_CHECK_ARCH = 80 86 89 90
CUDA_CHECK_ARCH_BF16 = 80 86 89 90 $(SM120)
CUDA_CHECK_ARCH_FP16 = 75
CUDA_CHECK_ARCH_BF16-grads = 80 90
CUDA_CHECK_ATTN = flash naive
CUDA_CHECK_ATTN_BF16-grads = flash
CUDA_CHECK_TARGETS = $(addprefix cuda-compile-,BF16 FP32 FP16 BF16-grads)
.PHONY: $(CUDA_CHECK_TARGETS)
test-cuda-compile: $(CUDA_CHECK_TARGETS)
$(CUDA_CHECK_TARGETS): cuda_check_arch = $(or $(CUDA_CHECK_ARCH_$*),$(CUDA_CHECK_ARCH))
$(CUDA_CHECK_TARGETS): cuda_check_attn = $(or $(CUDA_CHECK_ATTN_$*),$(CUDA_CHECK_ATTN))
$(CUDA_CHECK_TARGETS): cuda_check_flags = PRECISION=$(firstword $(subst -, ,$*)) GRADS=$(if $(filter %-grads,$*),BF16,FP32)
$(CUDA_CHECK_TARGETS): cuda-compile-%:
	@dir=$(BUILD)/cuda-compile/$*; \
	for a in $(cuda_check_attn); do \
	    tests="$$dir/tests/test_kernels_gpu $$dir/tests/dump_grads $$dir/tests/test_generate $$dir/tests/dump_logits"; \
	    [ $$a = flash ] && tests="$$tests $$dir/tests/test_attention_gpu $$dir/bench_attention"; \
	    $(MAKE) -f $(TOP_MAKEFILE) --no-print-directory BUILD=$$dir ATTN=$$a $(cuda_check_flags) GPU_ARCH="$(cuda_check_arch)" \
	        CUDA_WERROR=1 $$dir/train_gpt $$dir/profile_step $$tests || exit 1; \
	    if [ $$a = flash ]; then cp $$dir/train_gpt $$dir/train_gpt-flash; fi; \
	    echo "PASS ATTN=$$a $(cuda_check_flags) compiles for sm $(cuda_check_arch) without warnings"; \
	done

# On a GPU machine: the kernel tests in every precision (the flash kernels under every tile
# configuration), FP16 also from a build for sm_75 alone and BF16 from one for sm_80 alone, whose
# PTX the driver compiles for a newer GPU (the instructions a T4 and an A100 or RTX 30xx run, which
# an sm_90a build does not hold even where KERNEL_PATH picks those cards' kernels), and the kernel
# tests of BF16 with GRADS=BF16 (the fold of bf16 gradients, AdamW and the norm reading them; its
# attention is BF16's), then the whole-model checks.
test-gpu:
	@for v in FP32 BF16 FP16 FP16-sm75 BF16-sm80 BF16-grads; do \
	    p=$${v%-*}; dir=$(BUILD)/gpu-$$v; \
	    case $$v in *-sm*) arch=$${v#*-sm} ;; *) arch="$(GPU_ARCH)" ;; esac; \
	    grads=FP32; tests="$$dir/tests/test_kernels_gpu $$dir/tests/test_attention_gpu"; \
	    if [ $$v = BF16-grads ]; then grads=BF16; tests=$$dir/tests/test_kernels_gpu; fi; \
	    $(MAKE) -f $(TOP_MAKEFILE) --no-print-directory BUILD=$$dir ATTN=flash PRECISION=$$p GRADS=$$grads \
	        GPU_ARCH="$$arch" $$tests || exit 1; \
	    for t in $$tests; do $$t || exit 1; done; \
	done
	BUILD=$(BUILD) tests/gpu/test_gpu_model.sh
	BUILD=$(BUILD) tests/gpu/test_fp16_gpu.sh
	BUILD=$(BUILD) tests/gpu/test_gpu_grads.sh
	BUILD=$(BUILD) tests/gpu/test_cross_resume.sh
	BUILD=$(BUILD) tests/gpu/test_offload_gpu.sh
	BUILD=$(BUILD) tests/gpu/test_long_context.sh
	BUILD=$(BUILD) tests/gpu/test_gpu_divergence.sh
	BUILD=$(BUILD) tests/gpu/test_recipe_gpu.sh

# On a machine with 2 or more GPUs: data parallelism through NCCL against one GPU.
test-multi-gpu:
	BUILD=$(BUILD)/multi tests/gpu/test_multi_gpu.sh

# On a machine with 2 GPUs: each GPU a node of its own, the ranks meeting over TCP and NCCL on its
# socket transport (the binaries of test-multi-gpu).
test-two-nodes:
	BUILD=$(BUILD)/multi tests/gpu/test_two_nodes.sh
