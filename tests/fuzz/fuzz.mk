# libFuzzer targets for every parser of user input (docs/testing.md, "Fuzzing"). Included by the
# Makefile after BINARIES; defines FUZZ_BINARIES (empty when clang cannot be had) and `make fuzz`.
# Objects are built by clang under $(BUILD)/fuzz/, apart from the g++ objects.

FUZZ_CXX ?= $(or $(shell command -v clang++-14 2>/dev/null),$(shell command -v clang++ 2>/dev/null),clang++)
FUZZ_SECONDS ?= 60
# Without clang and its libFuzzer runtime the targets are skipped, unless tools/ensure_deps.sh
# (the `deps` step) can install them: then they are built after it has.
FUZZ_CAN_INSTALL := $(shell command -v apt-get >/dev/null 2>&1 && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; } && echo 1)
FUZZ_FOUND   := $(shell command -v $(FUZZ_CXX) 2>/dev/null)
FUZZ_RUNTIME := $(if $(FUZZ_FOUND),$(wildcard $(shell $(FUZZ_CXX) -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a))
FUZZ_ENABLED := $(if $(FUZZ_RUNTIME),1,$(if $(or $(FUZZ_FOUND),$(filter clang++,$(FUZZ_CXX))),$(FUZZ_CAN_INSTALL)))

FUZZ_DIR      := $(BUILD)/fuzz
FUZZ_SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_CXXFLAGS := -std=c++20 -O1 -g -I. -MMD -MP -Wall -Wextra -fno-omit-frame-pointer -DYOLO_CUDA=0 -DYOLO_EMU=0 \
                 $(call sysinc,$(STB_INC) $(DOCTEST_INC))

# Parser units: instrumented for coverage (fuzzer-no-link) and checked by ASan and UBSan.
fuzz_obj = $(patsubst %,$(FUZZ_DIR)/obj/%.o,$(1))
FUZZ_CHECK   := $(call fuzz_obj,runtime/check.cpp)
FUZZ_STB     := $(call fuzz_obj,data/stb_impl.cpp)
FUZZ_IMAGE   := $(call fuzz_obj,data/image.cpp) $(FUZZ_STB)
# open_dataset (data/dataset.cpp) names every reader, so any target linking the shared
# label/names code needs them all; they are all parsers we fuzz anyway.
FUZZ_READERS := $(call fuzz_obj,data/dataset.cpp data/darknet.cpp data/folders.cpp data/voc.cpp data/coco.cpp \
                  data/verify.cpp data/xml.cpp data/json.cpp) $(FUZZ_IMAGE)
# graph/cfg.cpp calls activation_from_name (kernels/activation.cu) and parse_precision_choice
# (kernels/precision.cpp), which share their units with kernels and the emulator (and clang 14
# cannot compile runtime/stream_queue.cpp: lambdas capturing structured bindings). Those two
# units are built uninstrumented, one section per function, and the link keeps only what is
# reached (--gc-sections), so the cfg target needs nothing else of kernels/ or runtime/.
FUZZ_SUPPORT := $(FUZZ_DIR)/support/kernels/activation.cu.o $(FUZZ_DIR)/support/kernels/precision.cpp.o

FUZZ_TARGETS := cfg labels darknet voc coco image weights checkpoint
fuzz_deps_cfg        := $(call fuzz_obj,graph/cfg.cpp) $(FUZZ_SUPPORT)
fuzz_deps_labels     := $(FUZZ_READERS)
fuzz_deps_darknet    := $(FUZZ_READERS)
fuzz_deps_voc        := $(FUZZ_READERS)
fuzz_deps_coco       := $(FUZZ_READERS)
fuzz_deps_image      := $(call fuzz_obj,data/verify.cpp) $(FUZZ_IMAGE)
fuzz_deps_weights    := $(call fuzz_obj,graph/weights.cpp) tests/fuzz/fuzz_layers.h
fuzz_deps_checkpoint := $(call fuzz_obj,graph/weights.cpp)

ifeq ($(FUZZ_ENABLED),1)
FUZZ_BINARIES := $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)
else
FUZZ_BINARIES :=
endif

$(FUZZ_DIR)/obj/%.cpp.o: %.cpp | deps
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) $(FUZZ_SANITIZE) -fsanitize=fuzzer-no-link -c $< -o $@

# stb_image is third-party C: UBSan's findings there (shifts of negative values its decoders
# rely on) are not ours to fix, as in the emulated build; ASan still covers it.
$(FUZZ_STB): data/stb_impl.cpp | deps
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) -fsanitize=fuzzer-no-link,address -c $< -o $@

$(FUZZ_DIR)/support/%.cpp.o: %.cpp | deps
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) -ffunction-sections -fdata-sections -c $< -o $@

$(FUZZ_DIR)/support/%.cu.o: %.cu | deps
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) -Wno-unknown-pragmas -ffunction-sections -fdata-sections -x c++ -c $< -o $@

# Each target: its harness and the units it tests (fuzz_deps_NAME), with libFuzzer's main.
define fuzz_target
$(FUZZ_DIR)/fuzz_$(1): tests/fuzz/fuzz_$(1).cpp tests/fuzz/fuzz_support.h $(fuzz_deps_$(1)) $(FUZZ_CHECK) | deps
	$$(FUZZ_CXX) $$(FUZZ_CXXFLAGS) $$(FUZZ_SANITIZE) -fsanitize=fuzzer $$(filter %.cpp %.o,$$^) -o $$@ -Wl,--gc-sections -pthread
endef
$(foreach t,$(FUZZ_TARGETS),$(eval $(call fuzz_target,$(t))))

# Writes the binary seeds (.weights, .ckpt, images) of tests/fuzz/corpus/ from our own writers;
# run once by hand (`make fuzz-seeds`), its output is committed.
$(FUZZ_DIR)/make_seeds: tests/fuzz/make_seeds.cpp tests/fuzz/fuzz_layers.h $(call fuzz_obj,graph/weights.cpp) $(FUZZ_IMAGE) $(FUZZ_CHECK) | deps
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) $(FUZZ_SANITIZE) $(filter %.cpp %.o,$^) -o $@ -pthread

.PHONY: fuzz fuzz-seeds
# `make fuzz FUZZ_SECONDS=N`: each target N seconds on a growing corpus under $(FUZZ_DIR)/work/,
# new crashes in $(FUZZ_DIR)/crashes/NAME/.
fuzz: $(FUZZ_BINARIES)
	@BUILD=$(BUILD) tools/fuzz_tests.sh --seconds $(FUZZ_SECONDS)

fuzz-seeds: $(FUZZ_DIR)/make_seeds
	$(FUZZ_DIR)/make_seeds tests/fuzz/corpus
