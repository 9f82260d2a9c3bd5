# Build for the YOLOv3 trainer. `make` builds ./train_yolo and the tools a user runs next
# (build/bench_kernels, build/bench_loader, build/scaling_model) on every core; `make test` builds
# the test binaries (build/tests, build/tests_emu, build/train_yolo_emu, the fuzz targets) and
# runs them. See README.md for the knobs.

# `make` with no target means `all`, whatever the included makefiles define first.
.DEFAULT_GOAL := all

# ---- knobs -----------------------------------------------------------------------------
CUDA_HOME   ?= /usr/local/cuda
NVCC        ?= $(shell command -v nvcc 2>/dev/null || ls $(CUDA_HOME)/bin/nvcc 2>/dev/null)
# CUDA=1 builds the CUDA backend (needs nvcc), CUDA=0 a CPU-only build; default: CUDA if nvcc is here.
CUDA        ?= $(if $(NVCC),1,0)
# GPU targets as compute capabilities: 75 = T4, 80 = A100 (its SASS also runs on 8.6 and 8.9,
# and its PTX, embedded with it, on every newer GPU: B200, RTX 50), 90 = H100/H200 (sm_90a code:
# wgmma and setmaxnreg, kernels/wgmma.cuh; it runs on 9.0 exactly). Default: the architectures of
# the GPUs nvidia-smi reports (tools/gpu_arch.sh), all three where there is none.
ifeq ($(origin ARCH),undefined)
  ARCH := $(shell tools/gpu_arch.sh)
endif
STB_INC     ?= /usr/include/stb
DOCTEST_INC ?= /usr/include
NCCL_HOME   ?= $(firstword $(foreach d,$(CUDA_HOME) /usr/local /usr,$(if $(wildcard $(d)/include/nccl.h),$(d))))
WERROR      ?= 1
CXX         ?= g++
BUILD       ?= build
# Parallel jobs: every core unless the command line says. GNU make 4.3 does not show a command
# line -j to the makefile (4.4 does), and the -j set here wins over it: `make JOBS=1` is serial.
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)
ifeq ($(filter -j%,$(MAKEFLAGS)),)
  MAKEFLAGS += -j$(JOBS)
endif

ifeq ($(CUDA),1)
  ifeq ($(NVCC),)
    $(error CUDA=1 but nvcc was not found; put it on PATH, set NVCC=, or build with CUDA=0)
  endif
endif

# ---- flags -----------------------------------------------------------------------------
# -isystem for overridden header folders only: naming /usr/include would break #include_next.
sysinc = $(addprefix -isystem ,$(filter-out /usr/include,$(1)))
WARN      := -Wall -Wextra -Wshadow $(if $(filter 1,$(WERROR)),-Werror)
BASEFLAGS := -std=c++20 -I. -MMD -MP -pthread
CXXFLAGS_NATIVE := $(BASEFLAGS) -O2 -g $(WARN) -DYOLO_CUDA=$(CUDA) -DYOLO_EMU=0 $(call sysinc,$(STB_INC) $(DOCTEST_INC))
ifeq ($(CUDA),1)
  CXXFLAGS_NATIVE += $(call sysinc,$(CUDA_HOME)/include $(filter-out $(CUDA_HOME)/include,$(NCCL_HOME:%=%/include)))
  ifneq ($(NCCL_HOME),)
    CXXFLAGS_NATIVE += -DYOLO_NCCL_HEADER=1
  endif
endif
# The emulated build: every .cu compiled as C++ against runtime/emu, under ASan and UBSan.
SANITIZE  ?= -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# Optimisation and debug info of the emulated build. Under the sanitizers, -O2 -g is half of CI's
# build time; line tables (-g1) are all a sanitizer report needs to name file:line
# (`make EMU_OPT="-O2 -g"` for gdb sessions with variables).
EMU_OPT   ?= -O1 -g1
CXXFLAGS_EMU := $(BASEFLAGS) $(EMU_OPT) $(WARN) $(SANITIZE) -DYOLO_CUDA=0 -DYOLO_EMU=1 $(call sysinc,$(STB_INC) $(DOCTEST_INC))

# .cu files as C++: g++ does not know `#pragma unroll` (nvcc's), which is only a hint.
EMU_CU_FLAGS := -Wno-unknown-pragmas

comma := ,
ARCH_CODES := $(sort $(foreach a,$(ARCH),$(if $(filter 90 90a,$(a)),90a,$(a))))
# PTX rides with sm_80's SASS: what GPUs newer than the build run (runtime/gpu_code.h).
PTX_ARCH  := $(if $(filter 80,$(ARCH_CODES)),80,0)
GENCODE   := $(foreach a,$(ARCH_CODES),-gencode=arch=compute_$(a),code=sm_$(a)) \
             $(if $(filter 80,$(PTX_ARCH)),-gencode=arch=compute_80$(comma)code=compute_80)
NVCCFLAGS := -std=c++20 -O3 -g -lineinfo -I. -MMD -MP $(GENCODE) -DYOLO_CUDA=1 -DYOLO_EMU=0 \
             $(if $(filter 1,$(WERROR)),-Werror all-warnings) -Xcompiler -Wall,-Wextra \
             $(call sysinc,$(filter-out $(CUDA_HOME)/include,$(NCCL_HOME:%=%/include))) \
             $(if $(NCCL_HOME),-DYOLO_NCCL_HEADER=1)
LDLIBS_NATIVE := -pthread -ldl -static-libstdc++ -static-libgcc
ifeq ($(CUDA),1)
  # The CUDA runtime is linked statically so the binary starts without a driver (and says so).
  LDLIBS_NATIVE += -L$(CUDA_HOME)/lib64 -lcudart_static -lrt
endif

# ---- sources ---------------------------------------------------------------------------
# ONLY="conv gemm" limits the op families built (kernels/NAME.cu and NAME_cpu.cpp,
# tests/test_kernel_NAME.cpp, tools/bench_NAME.cu): for working on one family while others are
# unfinished.
RUNTIME_SRC := $(wildcard runtime/*.cpp)
EMU_SRC     := $(wildcard runtime/emu/*.cpp) $(wildcard runtime/emu/*.S)
KERNEL_CPP  := $(wildcard kernels/*.cpp)
ifeq ($(ONLY),)
  KERNEL_CU   := $(wildcard kernels/*.cu)
  TEST_KERNEL := $(wildcard tests/test_kernel*.cpp)
  BENCH_CU    := $(wildcard tools/bench_*.cu)
else
  KERNEL_CU   := $(sort $(wildcard $(ONLY:%=kernels/%.cu)) kernels/hopper.cu kernels/tma.cu)
  TEST_KERNEL := tests/test_kernel_emulation.cpp $(wildcard $(ONLY:%=tests/test_kernel_%.cpp))
  BENCH_CU    := tools/bench_copy.cu $(wildcard $(ONLY:%=tools/bench_%.cu))
  # The one dispatch point needs every family; a family's fast CPU unit (NAME_cpu.cpp) goes with it.
  KERNEL_CPP  := $(filter-out kernels/ops.cpp $(filter-out $(ONLY:%=kernels/%_cpu.cpp),$(wildcard kernels/*_cpu.cpp)),$(KERNEL_CPP))
endif
# DATA="image transform" limits the input-pipeline units built (data/NAME.cpp and
# tests/test_data_NAME.cpp) the same way.
ifeq ($(DATA),)
  DATA_SRC  := $(wildcard data/*.cpp)
  TEST_DATA := $(wildcard tests/test_data_*.cpp)
else
  DATA_SRC  := $(wildcard $(DATA:%=data/%.cpp) data/stb_impl.cpp)
  TEST_DATA := $(wildcard $(DATA:%=tests/test_data_%.cpp))
endif
# GRAPH="cfg weights" does the same for graph/NAME.cpp and tests/test_graph_NAME.cpp.
ifeq ($(GRAPH),)
  GRAPH_SRC  := $(wildcard graph/*.cpp)
  TEST_GRAPH := $(wildcard tests/test_graph_*.cpp)
else
  GRAPH_SRC  := $(wildcard $(GRAPH:%=graph/%.cpp))
  TEST_GRAPH := $(wildcard $(GRAPH:%=tests/test_graph_%.cpp))
endif
TEST_CPP    := $(filter-out tests/test_kernel% tests/test_data_% tests/test_graph_%,$(wildcard tests/*.cpp)) \
               $(TEST_DATA) $(TEST_GRAPH)
TEST_CU     := $(wildcard tests/*.cu)

obj = $(patsubst %,$(BUILD)/$(1)/%.o,$(2))
# Native build: .cu through nvcc when CUDA=1; with CUDA=0 they compile as C++ against the
# emulation (their fast CPU versions are what the CPU backend runs; the kernels run emulated).
NATIVE_LIB  := $(call obj,native,$(RUNTIME_SRC) $(DATA_SRC) $(GRAPH_SRC) $(KERNEL_CPP) $(KERNEL_CU) $(if $(filter 0,$(CUDA)),$(EMU_SRC)))
NATIVE_TEST := $(call obj,native,$(TEST_CPP) $(TEST_KERNEL) $(TEST_CU))
EMU_LIB     := $(call obj,emu,$(RUNTIME_SRC) $(EMU_SRC) $(DATA_SRC) $(GRAPH_SRC) $(KERNEL_CPP) $(KERNEL_CU))
EMU_TEST    := $(call obj,emu,$(TEST_CPP) $(TEST_KERNEL) $(TEST_CU))

# What `make` builds: the trainer (TRAINER: ./train_yolo, elsewhere for the GPU bundle) and the
# tools a user runs next.
TRAINER     ?= train_yolo
TOOLS       := $(BUILD)/bench_kernels $(BUILD)/bench_loader $(BUILD)/scaling_model
# What `make test` builds and runs; train_yolo_emu is the real CLI over emulated GPUs
# (--devices emu:0,1), for tools/emu_cli_check.sh and for debugging the GPU path.
TEST_BINARIES := $(BUILD)/tests $(BUILD)/tests_emu $(BUILD)/train_yolo_emu $(TRAINER)
# The libFuzzer targets (clang): FUZZ_BINARIES, `make fuzz FUZZ_SECONDS=N` (tests/fuzz/fuzz.mk).
include tests/fuzz/fuzz.mk
TEST_BINARIES += $(FUZZ_BINARIES)

.PHONY: all test test-binaries deps clean gpu-bundle FORCE
all: $(TRAINER) $(TOOLS)
test-binaries: $(TEST_BINARIES)

# Objects depend on the flags they were built with: `make ARCH=90` after `make` rebuilds the
# native objects (the emulated build has a stamp of its own, so it stays).
FLAGS_STAMP := $(BUILD)/flags.native
EMU_FLAGS_STAMP := $(BUILD)/flags.emu
$(FLAGS_STAMP): FORCE
	@mkdir -p $(BUILD)
	@echo '$(CXXFLAGS_NATIVE) | $(NVCCFLAGS)' | cmp -s - $@ || echo '$(CXXFLAGS_NATIVE) | $(NVCCFLAGS)' > $@
$(EMU_FLAGS_STAMP): FORCE
	@mkdir -p $(BUILD)
	@echo '$(CXXFLAGS_EMU)' | cmp -s - $@ || echo '$(CXXFLAGS_EMU)' > $@

# Installs missing Debian packages (or prints the command) before anything compiles; clang and
# libFuzzer only when a goal builds the fuzz targets (`make` alone does not need them).
DEPS_FUZZ = $(if $(filter test test-binaries fuzz fuzz-seeds $(FUZZ_DIR)/%,$(MAKECMDGOALS)),1,0)
deps:
	@STB_INC='$(STB_INC)' DOCTEST_INC='$(DOCTEST_INC)' FUZZ=$(DEPS_FUZZ) tools/ensure_deps.sh

$(BUILD)/native/%.cpp.o: %.cpp $(FLAGS_STAMP) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_NATIVE) $(EXTRA_FLAGS) -c $< -o $@

ifeq ($(CUDA),1)
$(BUILD)/native/%.cu.o: %.cu $(FLAGS_STAMP) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(NVCC_EXTRA_FLAGS) -c $< -o $@
else
$(BUILD)/native/%.cu.o: %.cu $(FLAGS_STAMP) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_NATIVE) $(EMU_CU_FLAGS) $(EXTRA_FLAGS) -x c++ -c $< -o $@

$(BUILD)/native/%.S.o: %.S $(FLAGS_STAMP) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_NATIVE) -c $< -o $@
endif

$(BUILD)/emu/%.cpp.o: %.cpp $(EMU_FLAGS_STAMP) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_EMU) $(EXTRA_FLAGS) -c $< -o $@

# The CPU micro-kernels' AVX variants (kernels/cpu_micro.h): only these files get the instruction
# sets; kernels/cpu_isa.cpp runs them where the CPU has them.
# -O3: their channel loops (cpu_micro_channels.inc) are written for the vectoriser.
# -fno-exceptions: nothing there throws or calls out, and under AddressSanitizer the stack arrays'
# cleanups otherwise made GCC define the weak DW.ref.__gxx_personality_v0 (tools/isa_objects_check.sh).
AVX2_FLAGS   := -O3 -mavx2 -mfma -fno-exceptions
AVX512_FLAGS := -O3 -mavx512f -mfma -mprefer-vector-width=512 -fno-exceptions
$(BUILD)/native/kernels/cpu_micro_baseline.cpp.o $(BUILD)/emu/kernels/cpu_micro_baseline.cpp.o: EXTRA_FLAGS := -O3
# The fast gemm's copy and write-out loops, for the vectoriser (baseline x86-64 code).
$(BUILD)/native/kernels/gemm_cpu.cpp.o $(BUILD)/emu/kernels/gemm_cpu.cpp.o: EXTRA_FLAGS := -O3
$(BUILD)/native/kernels/cpu_micro_avx2.cpp.o $(BUILD)/emu/kernels/cpu_micro_avx2.cpp.o: EXTRA_FLAGS := $(AVX2_FLAGS)
$(BUILD)/native/kernels/cpu_micro_avx512.cpp.o $(BUILD)/emu/kernels/cpu_micro_avx512.cpp.o: EXTRA_FLAGS := $(AVX512_FLAGS)

# The optimizer's CPU update must give the same bits on every x86-64 machine (CPU ranks on
# different hosts keep identical parameters): no FMA contraction in its host code, whatever the
# compiler's defaults (kernels/cpu_isa.h).
$(BUILD)/native/kernels/sgd.cu.o $(BUILD)/emu/kernels/sgd.cu.o: EXTRA_FLAGS := -ffp-contract=off
$(BUILD)/native/kernels/sgd.cu.o: NVCC_EXTRA_FLAGS := -Xcompiler -ffp-contract=off

# Batchnorm's and the activations' 16-bit ops must compute the FP32 op's values, rounded once
# (kernels/exact_math.cuh): no FMA contraction in their device code or its emulation, so every FMA
# there is one the source writes (__fmaf_rn) and no instantiation fuses differently.
BN_ACT_CU := batchnorm.cu activation.cu
$(foreach f,$(BN_ACT_CU),$(BUILD)/native/kernels/$(f).o $(BUILD)/emu/kernels/$(f).o): EXTRA_FLAGS := -ffp-contract=off
$(BN_ACT_CU:%=$(BUILD)/native/kernels/%.o): NVCC_EXTRA_FLAGS := --fmad=false

# The build's GPU targets, for runtime/gpu_code.cpp alone (which device runs which code).
ifeq ($(CUDA),1)
$(BUILD)/native/runtime/gpu_code.cpp.o: EXTRA_FLAGS := -DYOLO_GPU_SASS='"$(ARCH_CODES)"' -DYOLO_GPU_PTX=$(PTX_ARCH)
endif

# stb_image is third-party C compiled from the system header: UBSan's findings there (shifts
# of negative values that its decoders rely on) are not ours to fix; ASan still covers it.
$(BUILD)/emu/data/stb_impl.cpp.o: CXXFLAGS_EMU += -fno-sanitize=undefined

$(BUILD)/emu/%.cu.o: %.cu $(EMU_FLAGS_STAMP) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_EMU) $(EMU_CU_FLAGS) $(EXTRA_FLAGS) -x c++ -c $< -o $@

$(BUILD)/emu/%.S.o: %.S $(EMU_FLAGS_STAMP) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_EMU) -c $< -o $@

$(TRAINER): $(call obj,native,tools/train_yolo.cpp) $(NATIVE_LIB)
	$(CXX) $^ -o $@ $(LDLIBS_NATIVE)

$(BUILD)/tests: $(NATIVE_TEST) $(NATIVE_LIB)
	$(CXX) $^ -o $@ $(LDLIBS_NATIVE)

$(BUILD)/tests_emu: $(EMU_TEST) $(EMU_LIB)
	$(CXX) $(SANITIZE) $^ -o $@ -pthread -ldl

$(BUILD)/train_yolo_emu: $(call obj,emu,tools/train_yolo.cpp) $(EMU_LIB)
	$(CXX) $(SANITIZE) $^ -o $@ -pthread -ldl

$(BUILD)/bench_kernels: $(call obj,native,tools/bench_kernels.cpp tools/ceilings.cu tools/cublas_loader.cpp $(BENCH_CU)) $(NATIVE_LIB)
	$(CXX) $^ -o $@ $(LDLIBS_NATIVE)

$(BUILD)/bench_loader: $(call obj,native,tools/bench_loader.cpp) $(NATIVE_LIB)
	$(CXX) $^ -o $@ $(LDLIBS_NATIVE)

$(BUILD)/scaling_model: $(call obj,native,tools/scaling_model.cpp) $(NATIVE_LIB)
	$(CXX) $^ -o $@ $(LDLIBS_NATIVE)

test: $(TEST_BINARIES)
	@BUILD=$(BUILD) tools/run_tests.sh tools/sharded_tests.sh $(BUILD)/tests tools/adversarial_tests.sh tools/emu_cli_check.sh tools/checkpoint_check.sh tools/gpu_check_emulated_test.sh tools/gpu_arch_test.sh tools/sass_test.sh tools/fuzz_tests.sh tools/isa_objects_check.sh tools/readme_commands_check.sh

# The GPU bundle (tools/pack_gpu_bundle.sh): what a device run of tools/gpu_check.sh needs, built
# here for sm_90a alone in a folder of its own (BUNDLE_ARCH=80 for other GPUs), with the sources,
# the scripts and, where ../shared has it, the NCCL build that lets two ranks share one GPU; one
# archive that compiles nothing where it runs.
BUNDLE_ARCH  ?= 90
BUNDLE_BUILD := $(BUILD)/bundle-sm$(BUNDLE_ARCH)
BUNDLE       ?= $(BUILD)/gpu-bundle.tar.xz
BUNDLE_NCCL  ?= ../shared/nccl-2.30.7-sm90/libnccl.so.2
gpu-bundle:
	$(MAKE) BUILD=$(BUNDLE_BUILD) ARCH=$(BUNDLE_ARCH) TRAINER=$(BUNDLE_BUILD)/train_yolo \
	  $(BUNDLE_BUILD)/train_yolo $(BUNDLE_BUILD)/tests $(BUNDLE_BUILD)/bench_kernels $(BUNDLE_BUILD)/bench_loader \
	  $(BUNDLE_BUILD)/scaling_model
	tools/pack_gpu_bundle.sh $(BUNDLE_BUILD) $(BUNDLE) $(BUNDLE_NCCL)

clean:
	rm -rf $(BUILD) train_yolo

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
