# nas build. Every module folder's .c files go into build/libnas.a; cli/ makes bin/nas;
# each tests/test_*.c is its own cmocka binary. New files are picked up without edits here.
CC      ?= cc
BUILD   ?= build
BIN     ?= bin
PKGS    := gsl nlopt sqlite3 libpq yaml-0.1 jansson libmicrohttpd libcurl
CFLAGS  ?= -O2 -g
# Project flags stay separate so that `make CFLAGS=…` (as `asan` does) only changes
# optimisation and instrumentation.
NAS_CFLAGS := -std=c17 -D_GNU_SOURCE -Wall -Wextra -Werror -fopenmp -I. $(shell pkg-config --cflags $(PKGS) 2>/dev/null) -I$(shell pg_config --includedir 2>/dev/null)
LDLIBS  += $(shell pkg-config --libs $(PKGS) 2>/dev/null | sed 's/-lgslcblas//') -lopenblas -lz -lm -lpthread -fopenmp

MODULES := common spec storage runners metrics optimizer notify scheduler trainer builtin serve
# A module's sources are its folder's .c files and those of its subfolders (trainer/core, ...).
LIB_SRC := $(foreach m,$(MODULES),$(wildcard $(m)/*.c $(m)/*/*.c))

# CUDA is on where nvcc is found (`make CUDA=0` turns it off). Everything that touches the
# CUDA runtime, cuBLAS or NCCL lives in trainer/*/*.cu; with CUDA those are compiled by nvcc
# and the stand-ins trainer/*/*_nocuda.c (which report "built without CUDA") are left out,
# without CUDA the reverse. The default build and the test suite never need a GPU.
# cuBLAS and NCCL are not linked: they cost every process ~0.4 s and ~230 MB at start-up,
# so the engine and the NCCL communicators dlopen them when made (trainer/cuda/cuda_dl.h), first
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
CU_OBJ     := $(patsubst %.cu,$(BUILD)/%.cu.o,$(wildcard trainer/*/*.cu))
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

.PHONY: all deps deps-test deps-fuzz test asan fuzz demo bench bench-nas-fashion bench-engine-gpu clean install uninstall deb
all: $(BIN)/nas $(EX_BIN)

deps:
	@scripts/deps.sh

# The suite also starts a throwaway PostgreSQL and a single-node Slurm cluster of its own,
# and runs the fuzzers briefly.
deps-test:
	@scripts/deps.sh postgres slurm fuzz browser

deps-fuzz:
	@scripts/deps.sh fuzz

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(NAS_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(wildcard trainer/*.h trainer/*/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

# The dashboard's files (serve/web/) and Debian's Chart.js (libjs-chart.js) are built into
# the binary by serve/assets.c (.incbin), so nas serve and nas plot need nothing beside it.
CHARTJS ?= /usr/share/javascript/chart.js/chart.min.js
$(BUILD)/serve/assets.o: $(wildcard serve/web/*) $(CHARTJS)
$(BUILD)/serve/assets.o: NAS_CFLAGS += -DNAS_CHARTJS='"$(CHARTJS)"'
$(CHARTJS):
	@echo "Chart.js is not at $@: 'make deps' installs Debian's libjs-chart.js (or set CHARTJS=PATH)" >&2; exit 1

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
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(FUZZ_TEST_SECONDS)
	@NAS_BIN=$(abspath $(BIN)/nas) NAS_EXAMPLES_BIN=$(abspath $(BIN)) \
	  NAS_DATA_DIR=$(abspath tests/data) tests/run.sh $(TEST_BIN)

# Same tests under AddressSanitizer and UndefinedBehaviorSanitizer, in separate folders.
asan: deps
	@$(MAKE) --no-print-directory test BUILD=build-asan BIN=build-asan/bin \
	  CFLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"

# libFuzzer harnesses (tests/fuzz/fuzz_NAME.c), compiled by clang with ASan and UBSan in
# $(FUZZ_BUILD)/ against the only sources they need (common/, spec/, metrics/metrics.c and
# the request parsers of serve/: the rest of the library wants OpenMP, CUDA and more). `make fuzz` runs each for FUZZ_SECONDS
# from its seed corpus tests/fuzz/corpus/NAME/, keeping what it finds new in
# $(FUZZ_BUILD)/corpus/NAME/; a crash, leak or abort fails it, leaving the input as
# $(FUZZ_BUILD)/crash-*. `make test` runs each for FUZZ_TEST_SECONDS.
FUZZ_CC           ?= clang
FUZZ_SECONDS      ?= 60
FUZZ_TEST_SECONDS ?= 10
FUZZ_BUILD        ?= build-fuzz
FUZZ_CFLAGS := -std=c17 -D_GNU_SOURCE -Wall -Wextra -Werror -g -O1 -fno-omit-frame-pointer \
               -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
               $(shell pkg-config --cflags yaml-0.1 jansson libmicrohttpd 2>/dev/null)
FUZZ_LIBS   := $(shell pkg-config --libs yaml-0.1 jansson 2>/dev/null) -lm
FUZZ_OBJ    := $(patsubst %.c,$(FUZZ_BUILD)/%.o,$(wildcard common/*.c spec/*.c) metrics/metrics.c \
                 serve/parse.c serve/auth.c)
FUZZ_BIN    := $(patsubst tests/fuzz/%.c,$(FUZZ_BUILD)/%,$(wildcard tests/fuzz/fuzz_*.c))

# Kept between runs (make would delete them as intermediate files of the harnesses).
.SECONDARY: $(FUZZ_OBJ)

$(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $^ $(FUZZ_LIBS)

fuzz: deps deps-fuzz
	@$(MAKE) --no-print-directory $(FUZZ_BIN)
	@for bin in $(FUZZ_BIN); do \
	  name=$${bin##*/fuzz_}; mkdir -p $(FUZZ_BUILD)/corpus/$$name; \
	  echo "fuzz: $$name for $(FUZZ_SECONDS) s"; \
	  $$bin -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=$(FUZZ_BUILD)/ -print_final_stats=1 \
	    $(FUZZ_BUILD)/corpus/$$name tests/fuzz/corpus/$$name 2>$(FUZZ_BUILD)/$$name.log \
	    || { tail -n 60 $(FUZZ_BUILD)/$$name.log; echo "fuzz: $$name failed"; exit 1; }; \
	  grep -E '^stat::number_of_executed_units' $(FUZZ_BUILD)/$$name.log; \
	done

demo: deps all
	@scripts/demo.sh

bench: all $(BENCH_BIN)

# The built-in NAS on full Fashion-MNIST (issue 19): bench/nas_fashion.sh, knobs there.
bench-nas-fashion: all
	BUILD=$(BUILD) bench/nas_fashion.sh

# The engine against PyTorch eager on CUDA device 0 (issue 21): bench/engine_gpu.sh, knobs there.
bench-engine-gpu: all $(BUILD)/bench/bench_engine
	BUILD=$(BUILD) bench/engine_gpu.sh

# bench-NAME runs bench/NAME.sh when there is one, else the binary built from bench/bench_NAME.c.
bench-%: all $(BENCH_BIN)
	@if [ -x bench/$*.sh ]; then BUILD=$(BUILD) bench/$*.sh; else $(BUILD)/bench/bench_$*; fi

# `make install [PREFIX=/usr/local] [DESTDIR=…]`: bin/nas, the man page nas(1) made from
# docs/cli.md by go-md2man, bash and zsh completion, and under PREFIX/share/nas (where the
# installed nas looks for named datasets) the digits data, the example specs of the built-in
# trials and the Python client; PYTHONDIR (e.g. /usr/lib/python3/dist-packages, as `make
# deb` sets it) also links the client there. `make uninstall` with the same variables
# removes exactly these.
PREFIX    ?= /usr/local
PYTHONDIR ?=
VERSION   := $(shell sed -n 's/^\#define NAS_VERSION "\(.*\)"/\1/p' cli/main.c)
SHARE_NAS := $(DESTDIR)$(PREFIX)/share/nas
INSTALLED := bin/nas share/man/man1/nas.1.gz share/bash-completion/completions/nas \
             share/zsh/site-functions/_nas share/nas/digits.csv.gz share/nas/python/nas_client.py \
             $(addprefix share/nas/,$(shell grep -l builtin: examples/*.yaml))

$(BUILD)/nas.1.gz: docs/cli.md
	@mkdir -p $(BUILD)
	{ printf '%% NAS 1 "" "nas $(VERSION)" "User Commands"\n\n# NAME\nnas - multi-objective '\
	'Bayesian optimisation of experiments (HPO, NAS)\n\n'; \
	  sed '1s/.*/# SYNOPSIS/; s/^## /# /; s/^### /## /' $<; } | go-md2man >$(BUILD)/nas.1
	gzip -9nf $(BUILD)/nas.1

install: $(BIN)/nas $(BUILD)/nas.1.gz
	install -Dm755 $(BIN)/nas $(DESTDIR)$(PREFIX)/bin/nas
	install -Dm644 $(BUILD)/nas.1.gz $(DESTDIR)$(PREFIX)/share/man/man1/nas.1.gz
	install -Dm644 scripts/completion/nas.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/nas
	install -Dm644 scripts/completion/_nas $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_nas
	install -Dm644 tests/data/digits.csv.gz $(SHARE_NAS)/digits.csv.gz
	install -Dm644 -t $(SHARE_NAS)/examples $(shell grep -l builtin: examples/*.yaml)
	install -Dm644 clients/python/nas_client.py $(SHARE_NAS)/python/nas_client.py
	$(if $(PYTHONDIR),install -d $(DESTDIR)$(PYTHONDIR) && \
	  ln -sf $(PREFIX)/share/nas/python/nas_client.py $(DESTDIR)$(PYTHONDIR)/nas_client.py)

uninstall:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/,$(INSTALLED))
	$(if $(PYTHONDIR),rm -f $(DESTDIR)$(PYTHONDIR)/nas_client.py)
	rmdir $(SHARE_NAS)/examples $(SHARE_NAS)/python $(SHARE_NAS) 2>/dev/null || true

# `make deb`: $(BUILD)/nas_VERSION_ARCH.deb, built by dpkg-deb from `make install` into a
# staging folder (PREFIX=/usr); dpkg-shlibdeps declares the libraries it needs.
deb: $(BIN)/nas $(BUILD)/nas.1.gz
	@BUILD=$(BUILD) BIN=$(BIN) VERSION=$(VERSION) scripts/deb.sh

clean:
	rm -rf build build-asan build-fuzz bin

-include $(filter-out %.cu.d,$(LIB_OBJ:.o=.d)) $(CLI_OBJ:.o=.d) $(FUZZ_OBJ:.o=.d)
