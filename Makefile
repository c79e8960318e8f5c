# nas build. Every module folder's .c files go into build/libnas.a; cli/ makes bin/nas;
# each tests/test_*.c is its own cmocka binary. New files are picked up without edits here.
CC      ?= cc
BUILD   ?= build
BIN     ?= bin
PKGS    := gsl nlopt sqlite3 libpq yaml-0.1 jansson libmicrohttpd
CFLAGS  ?= -O2 -g
# Project flags stay separate so that `make CFLAGS=…` (as `asan` does) only changes
# optimisation and instrumentation.
NAS_CFLAGS := -std=c17 -D_GNU_SOURCE -Wall -Wextra -Werror -fopenmp -I. $(shell pkg-config --cflags $(PKGS) 2>/dev/null) -I$(shell pg_config --includedir 2>/dev/null)
LDLIBS  += $(shell pkg-config --libs $(PKGS) 2>/dev/null | sed 's/-lgslcblas//') -lopenblas -lz -lm -lpthread -fopenmp

MODULES := common spec storage runners metrics optimizer scheduler trainer serve
LIB_SRC := $(foreach m,$(MODULES),$(wildcard $(m)/*.c))

# CUDA is on where nvcc is found (`make CUDA=0` turns it off). Everything that touches the
# CUDA runtime, cuBLAS or NCCL lives in trainer/*.cu; with CUDA those are compiled by nvcc
# and the stand-ins trainer/*_nocuda.c (which report "built without CUDA") are left out,
# without CUDA the reverse. The default build and the test suite never need a GPU.
# cuBLAS and NCCL are not linked: they cost every process ~0.4 s and ~230 MB at start-up,
# so the engine and the NCCL communicators dlopen them when made (trainer/cuda_dl.h), first
# from NAS_CUDA_LIBDIR. Only the static CUDA runtime is linked; it costs nothing until used.
NVCC    ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
CUDA    ?= $(if $(NVCC),1,0)
ifeq ($(CUDA),1)
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# PTX for every GPU from Ampere on (JIT-compiled once by the driver), machine code for Hopper.
NVCC_ARCH  ?= -gencode arch=compute_80,code=compute_80 -gencode arch=compute_90,code=sm_90
NVCC_FLAGS := -std=c++17 -O2 -g -I. $(NVCC_ARCH) -Xcompiler -Wall,-Wextra,-Werror \
              -DNAS_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"'
LIB_SRC    := $(filter-out %_nocuda.c,$(LIB_SRC))
CU_OBJ     := $(patsubst %.cu,$(BUILD)/%.cu.o,$(wildcard trainer/*.cu))
NAS_CFLAGS += -DNAS_HAVE_CUDA
LDLIBS     += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
else
CU_OBJ     :=
endif
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_OBJ)
CLI_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard cli/*.c))
EX_SRC  := $(wildcard examples/*.c)
EX_BIN  := $(EX_SRC:examples/%.c=$(BIN)/%)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all deps deps-test test asan demo bench clean
all: $(BIN)/nas $(EX_BIN)

deps:
	@scripts/deps.sh

# The suite also starts a throwaway PostgreSQL and a single-node Slurm cluster of its own.
deps-test:
	@scripts/deps.sh postgres slurm

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(NAS_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(wildcard trainer/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(BUILD)/libnas.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BIN)/nas: $(CLI_OBJ) $(BUILD)/libnas.a
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) $(NAS_CFLAGS) -o $@ $^ $(LDLIBS)

$(BIN)/%: examples/%.c
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) $(NAS_CFLAGS) -o $@ $< -lm

$(BUILD)/tests/%: tests/%.c $(BUILD)/libnas.a $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(NAS_CFLAGS) -o $@ $< $(BUILD)/libnas.a $(LDLIBS) -lcmocka

$(BUILD)/bench/%: bench/%.c $(BUILD)/libnas.a $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(NAS_CFLAGS) -o $@ $< $(BUILD)/libnas.a $(LDLIBS)

# The whole suite: unit binaries, then end-to-end runs of bin/nas. NAS_BIN tells the
# e2e tests which binary to run, NAS_DATA_DIR where built-in trials find the digits data
# (wherever the binary was built); tests/run.sh prints one closing "N passed, N failed" line.
test: deps deps-test
	@$(MAKE) --no-print-directory all $(TEST_BIN)
	@NAS_BIN=$(abspath $(BIN)/nas) NAS_EXAMPLES_BIN=$(abspath $(BIN)) \
	  NAS_DATA_DIR=$(abspath tests/data) tests/run.sh $(TEST_BIN)

# Same tests under AddressSanitizer and UndefinedBehaviorSanitizer, in separate folders.
asan: deps
	@$(MAKE) --no-print-directory test BUILD=build-asan BIN=build-asan/bin \
	  CFLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"

demo: deps all
	@scripts/demo.sh

bench: all $(BENCH_BIN)

# bench-NAME runs bench/NAME.sh when there is one, else the binary built from bench/bench_NAME.c.
bench-%: all $(BENCH_BIN)
	@if [ -x bench/$*.sh ]; then BUILD=$(BUILD) bench/$*.sh; else $(BUILD)/bench/bench_$*; fi

clean:
	rm -rf build build-asan bin

-include $(filter-out %.cu.d,$(LIB_OBJ:.o=.d)) $(CLI_OBJ:.o=.d)
