# MARLaaS top-level Makefile.
#
#   make              build libraries, services, CLI, tools (build/bin/)
#   make test         unit tests (Criterion) + integration tests
#   make test SAN=1   the same under AddressSanitizer + UBSan (objects in build/san/)
#   make valgrind     unit tests under valgrind memcheck
#   make bench        benchmark suite (bench/run.sh; QUICK=1 for the short one), report in bench/results/
#   make bench-tokenizer  the tokenizer beside Hugging Face's (bench/tokenizer.sh)
#   make install      the CLI, the services and the models under PREFIX (default /usr/local)
#   make clean
#
# Settings: SAN=1, DEBUG=1, ARCH=<-march value> (default none: the x86-64 baseline, see "flags"),
# CUDA=1 (CUDA backend).

SAN   ?= 0
VG    ?= 0
DEBUG ?= 0
CUDA  ?= 0
ARCH  ?=

ifneq ($(filter-out 0 1,$(SAN)),)
$(error SAN must be 0 or 1, got '$(SAN)')
endif
ifneq ($(filter-out 0 1,$(CUDA)),)
$(error CUDA must be 0 or 1, got '$(CUDA)')
endif
ifeq ($(CUDA),1)
# The CUDA backend (kernels/cuda, tests/gpu): objects in their own tree, build/cuda, so that CPU
# and CUDA objects never mix (`override` wins over the BUILD assignments below). Flags, rules
# and targets are in the "CUDA backend" section at the end of this file.
ifneq ($(SAN)$(VG),00)
$(error CUDA=1 cannot be combined with SAN=1 or VG=1 (the CUDA runtime needs sanitizer options this build does not set))
endif
override BUILD := build/cuda
endif

ifeq ($(SAN),1)
BUILD := build/san
else ifeq ($(VG),1)
# valgrind 3.19 cannot decode AVX-512; its CPU does not report it either, so the CPU kernels
# choose their avx2 variant under it (kernels/cpu/cpu_host.c).
BUILD := build/vg
else
BUILD := build
endif

CC      ?= cc

# --- dependencies first --------------------------------------------------------------------
# On a machine that lacks packages, scripts/install-deps.sh installs them (scripts/packages.txt)
# before anything below asks the machine about its compiler and libraries. The stamp records a
# run; it is redone when the package list or the installer changes. `make clean` and
# `make print-VAR` install nothing.
DEPS_STAMP := build/.deps-ok
PROBING := $(if $(filter 0,$(MAKELEVEL)),$(filter-out clean print-%,$(or $(MAKECMDGOALS),all)))
ifneq ($(PROBING),)
ifneq ($(shell [ $(DEPS_STAMP) -nt scripts/packages.txt ] && [ $(DEPS_STAMP) -nt scripts/install-deps.sh ] && echo ok),ok)
ifneq ($(shell bash scripts/install-deps.sh >&2 && mkdir -p build && touch $(DEPS_STAMP) && echo ok),ok)
$(error scripts/install-deps.sh failed (its message is above); run it by hand to see why)
endif
endif
endif

# OpenBLAS must be the OpenMP build (Debian: libopenblas-openmp-dev): the engine's own loops use
# OpenMP, and with the pthread build two thread pools spin against each other on the same cores
# (measured: 3-10x slower decode on 2 cores). Debian installs the variants side by side, so the
# OpenMP one is linked by path, with an rpath so the run time loader picks the same one.
MULTIARCH        := $(shell $(CC) -dumpmachine 2>/dev/null)
OPENBLAS_OMP_DIR ?= /usr/lib/$(MULTIARCH)/openblas-openmp
BLAS_CFLAGS := -I/usr/include/$(MULTIARCH)/openblas-openmp
BLAS_LIBS   := -L$(OPENBLAS_OMP_DIR) -Wl,-rpath,$(OPENBLAS_OMP_DIR) -lopenblas

# --- what we found ----------------------------------------------------------------------
HAVE_PKG = $(shell pkg-config --exists $(1) 2>/dev/null && echo 1)
FOUND_OPENBLAS  := $(wildcard $(OPENBLAS_OMP_DIR)/libopenblas.so)
FOUND_CJSON     := $(call HAVE_PKG,libcjson)
FOUND_CRITERION := $(call HAVE_PKG,criterion)
FOUND_NVCC      := $(shell command -v nvcc >/dev/null 2>&1 && echo 1)
FOUND_REDIS     := $(shell command -v redis-server >/dev/null 2>&1 && echo 1)
mark = $(if $(1),✓,✗)
ifneq ($(PROBING),)
$(info MARLaaS build: $(call mark,$(FOUND_OPENBLAS)) OpenBLAS (OpenMP)  $(call mark,$(FOUND_CJSON)) cJSON  $(call mark,$(FOUND_CRITERION)) Criterion  $(call mark,$(FOUND_REDIS)) redis-server  $(call mark,$(FOUND_NVCC)) nvcc  (SAN=$(SAN) CUDA=$(CUDA)))
endif

# --- flags -------------------------------------------------------------------------------
# The binaries run on any x86-64 CPU: the code is compiled for the baseline ISA, except the CPU
# backend's ops (kernels/cpu/cpu.c), compiled once per variant below and chosen at run time.
# ARCH=<-march value> compiles the rest for that CPU instead (ARCH_CFLAGS); the variants keep
# their own -march.
WARN     := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wvla
OPT      := $(if $(filter 1,$(DEBUG)),-O0,-O2) -g
CFLAGS   := -std=c11 -D_GNU_SOURCE $(OPT) -fopenmp -MMD -MP $(WARN) -I. \
            $(BLAS_CFLAGS)
ARCH_CFLAGS := $(if $(strip $(ARCH)),-march=$(strip $(ARCH)))
LDLIBS   := -Wl,--as-needed -lczmq -lzmq -lhiredis -lmsgpackc -lsodium -lcjson -lmicrohttpd -larchive -lpcre2-8 -lutf8proc $(BLAS_LIBS) -fopenmp -lm -lpthread
ifeq ($(VG),1)
# memcheck cannot follow PCRE2's JIT-compiled code (it reports its reads as uninitialised): the
# valgrind build matches tokenizer regexes with PCRE2's interpreter.
CFLAGS   += -DMARLAAS_NO_PCRE2_JIT
endif
ifeq ($(SAN),1)
CFLAGS   += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDLIBS   += -fsanitize=address,undefined
endif

# The CPU kernel variants (kernels/cpu/cpu_variants.h): cpu.c compiled once per ISA into
# $(BUILD)/obj/kernels/cpu/cpu-<isa>.o, the best one the CPU runs picked at run time (or the one
# MARLAAS_CPU_ISA names). avx512 is -march=x86-64-v4 with the default tuning (generic): on the
# Xeons the recorded fingerprints come from (tests/unit/testfp.h) it compiles to what
# -march=native did (the same vector width in `omp simd` reductions), so its results are those
# of the native builds, bit for bit. Other targets than x86-64 get the scalar one only.
ifneq ($(filter x86_64-%,$(MULTIARCH)),)
CPU_ISAS := avx512 avx2 scalar
CPU_ISA_FLAGS_avx512 := -march=x86-64-v4 -DKERN_CPU_ISA=KERN_CPU_ISA_AVX512
CPU_ISA_FLAGS_avx2   := -march=x86-64-v3 -DKERN_CPU_ISA=KERN_CPU_ISA_AVX2
CPU_ISA_FLAGS_scalar := -march=x86-64 -DKERN_CPU_ISA=KERN_CPU_ISA_SCALAR
else
CPU_ISAS := scalar
CPU_ISA_FLAGS_scalar := -DKERN_CPU_ISA=KERN_CPU_ISA_SCALAR
endif
CPU_VARIANT_OBJ := $(CPU_ISAS:%=$(BUILD)/obj/kernels/cpu/cpu-%.o)

# --- sources -----------------------------------------------------------------------------
LIB_SRC   := $(wildcard common/util/*.c common/formats/*.c common/engine/*.c common/tasks/*.c common/rl/*.c common/net/*.c common/svc/*.c common/sim/*.c) \
             $(wildcard kernels/*.c) $(filter-out kernels/cpu/cpu.c,$(wildcard kernels/cpu/*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CPU_VARIANT_OBJ) $(BUILD)/obj/gen/sim_params.o
LIB       := $(BUILD)/lib/libmarlaas.a
UNIT_SRC  := $(wildcard tests/unit/*.c)
UNIT_OBJ  := $(UNIT_SRC:%.c=$(BUILD)/obj/%.o)
UNIT_BIN  := $(BUILD)/bin/marlaas-unit-tests
BENCH_BIN := $(BUILD)/bin/marlaas-bench-engine
TENANCY_BIN := $(BUILD)/bin/marlaas-bench-tenancy
TOKBENCH_BIN := $(BUILD)/bin/marlaas-bench-tokenizer
SIMCAL_BIN := $(BUILD)/bin/marlaas-sim-calibrate
CLI_SRC   := $(wildcard cli/*.c)
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
CLI_BIN   := $(BUILD)/bin/marlaas
SERVICES  := scheduler rollout verifier trainer
SVC_SRC   := $(wildcard $(SERVICES:%=services/%/*.c))
SVC_OBJ   := $(SVC_SRC:%.c=$(BUILD)/obj/%.o)
SVC_BINS  := $(SERVICES:%=$(BUILD)/bin/marlaas-%)

.PHONY: all test unit integration valgrind valgrind-run bench bench-tokenizer demo clean install
all: $(LIB) $(BENCH_BIN) $(TENANCY_BIN) $(TOKBENCH_BIN) $(SIMCAL_BIN) $(CLI_BIN) $(SVC_BINS)

# Objects depend on a stamp named after the compile flags: a build tree made with other flags
# (another ARCH, an older Makefile) is recompiled instead of linked with stale objects.
FLAGS_STAMP := $(BUILD)/.flags-$(shell printf '%s' '$(CC) $(CFLAGS) $(ARCH_CFLAGS)' | md5sum | cut -c1-16)
$(FLAGS_STAMP):
	@mkdir -p $(dir $@)
	@rm -f $(BUILD)/.flags-*
	@touch $@

$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ARCH_CFLAGS) -c $< -o $@

# A CPU kernel variant: no ARCH_CFLAGS (an -march=native before the variant's own -march would
# leave its extensions enabled, e.g. AVX-512 in the scalar variant).
$(CPU_VARIANT_OBJ): $(BUILD)/obj/kernels/cpu/cpu-%.o: kernels/cpu/cpu.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CPU_ISA_FLAGS_$*) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

$(BENCH_BIN): $(BUILD)/obj/bench/bench_engine.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(TENANCY_BIN): $(BUILD)/obj/bench/bench_tenancy.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(SIMCAL_BIN): $(BUILD)/obj/bench/sim_calibrate.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(TOKBENCH_BIN): $(BUILD)/obj/bench/bench_tokenizer.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(CLI_BIN): $(CLI_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# One binary per service, from the .c files of its directory.
define svc_rule
$(BUILD)/bin/marlaas-$(1): $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard services/$(1)/*.c)) $(LIB)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $$^ -o $$@ $$(LDLIBS)
endef
$(foreach s,$(SERVICES),$(eval $(call svc_rule,$(s))))

# The web console's files (services/scheduler/console/) compiled into the scheduler: a generated C
# file of their bytes (scripts/embed_assets.sh, xxd), so the binary serves them with no file around.
CONSOLE_FILES := $(sort $(wildcard services/scheduler/console/*))
$(BUILD)/gen/console_assets.c: $(CONSOLE_FILES) scripts/embed_assets.sh
	@mkdir -p $(dir $@)
	bash scripts/embed_assets.sh $@ $(CONSOLE_FILES)
$(BUILD)/obj/gen/console_assets.o: $(BUILD)/gen/console_assets.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/bin/marlaas-scheduler: $(BUILD)/obj/gen/console_assets.o

# The simulated backend's parameters (common/sim/params.json) compiled into the library.
$(BUILD)/gen/sim_params.c: common/sim/params.json
	@mkdir -p $(dir $@)
	{ echo '// Generated from common/sim/params.json; do not edit.'; echo '#include <stddef.h>'; \
	  echo 'const unsigned char sim_params_json[] = {'; xxd -i < $<; echo '};'; \
	  echo 'const size_t sim_params_json_len = sizeof sim_params_json;'; } > $@.tmp && mv $@.tmp $@
$(BUILD)/obj/gen/sim_params.o: $(BUILD)/gen/sim_params.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(UNIT_BIN): $(UNIT_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lcriterion

# Unit tests run from the repository root (they read models/ and write under build/).
# Criterion runs tests in parallel processes; each test keeps to one thread so two
# parallel tests do not fight over the two cores.
# Under the sanitizers the runner takes one test at a time: with two parallel workers
# Criterion's runner (libcriterion 2.4) leaves 48 bytes of its own bookkeeping unfreed, which
# LeakSanitizer reports at exit (the stack is all inside libcriterion).
UNIT_JOBS := $(if $(filter 1,$(SAN)),1,2)
unit: $(UNIT_BIN)
	MARLAAS_THREADS=1 $(UNIT_BIN) --jobs $(UNIT_JOBS)

# Integration tests start real processes from $(BUILD)/bin (sanitized binaries with SAN=1).
integration: all
	MARLAAS_BIN=$(BUILD)/bin bash tests/integration/run.sh

test: all unit integration cuda-check

valgrind:
	$(MAKE) VG=1 valgrind-run

valgrind-run: $(UNIT_BIN)
	MARLAAS_THREADS=1 valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect \
	  --show-leak-kinds=definite,indirect --trace-children=yes --trace-children-skip='*redis-server*' -q $(UNIT_BIN) --jobs 1

# The benchmark suite (bench/run.sh): N jobs async vs one by one, rollout, trainer, memory, the
# engine; report in bench/results/<date>-<host>/. QUICK=1: N in {1, 32}, under 10 minutes.
bench: all
	bash bench/run.sh $(if $(QUICK),--quick)

# The tokenizer alone: ours beside Hugging Face's JavaScript tokenizer (bench/tokenizer.sh).
bench-tokenizer: all
	bash bench/tokenizer.sh

# The local multi-tenant demo: a private cluster, four jobs of two tenants, live progress,
# a before/after table, everything stopped at the end (also on Ctrl-C).
demo: all
	$(CLI_BIN) demo

clean:
	rm -rf build

# make install [PREFIX=/usr/local] [DESTDIR=]: the CLI and the four services in PREFIX/bin, the
# shipped models in PREFIX/share/marlaas/models (the CLI's default model when the current
# directory has no models/tiny).
PREFIX ?= /usr/local
install: $(CLI_BIN) $(SVC_BINS)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/marlaas
	install -m 755 $(CLI_BIN) $(SVC_BINS) $(DESTDIR)$(PREFIX)/bin/
	rm -rf $(DESTDIR)$(PREFIX)/share/marlaas/models
	cp -r models $(DESTDIR)$(PREFIX)/share/marlaas/models

-include $(LIB_OBJ:.o=.d) $(UNIT_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(SVC_OBJ:.o=.d) $(BUILD)/obj/bench/bench_engine.d \
            $(BUILD)/obj/bench/bench_tenancy.d $(BUILD)/obj/bench/bench_tokenizer.d $(BUILD)/obj/bench/sim_calibrate.d

# --- examples and test tools ---------------------------------------------------------------
# One binary per .c file, linked like the services against the library:
#   examples/reward_service.c   -> $(BUILD)/bin/reward_service       (an external reward service)
#   examples/env_service.c      -> $(BUILD)/bin/env_service          (an external environment)
#   tools/marlaas-fuzz-send.c   -> $(BUILD)/bin/marlaas-fuzz-send    (sends hostile frames; tests)
#   tools/marlaas-reward-stub.c -> $(BUILD)/bin/marlaas-reward-stub  (a reward service that spoofs; tests)
EXAMPLE_SRC  := $(wildcard examples/*.c)
TOOL_SRC     := $(wildcard tools/*.c)
EXAMPLE_BINS := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/bin/%)
TOOL_BINS    := $(TOOL_SRC:tools/%.c=$(BUILD)/bin/%)

all: $(EXAMPLE_BINS) $(TOOL_BINS)

$(EXAMPLE_BINS): $(BUILD)/bin/%: $(BUILD)/obj/examples/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(TOOL_BINS): $(BUILD)/bin/%: $(BUILD)/obj/tools/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

-include $(EXAMPLE_SRC:%.c=$(BUILD)/obj/%.d) $(TOOL_SRC:%.c=$(BUILD)/obj/%.d)

# --- CUDA backend ------------------------------------------------------------------------------
# make CUDA=1           everything above plus the CUDA backend: kernels/cuda/*.cu compiled by nvcc
#                       into the same library, -DMARLAAS_CUDA=1 for the C code, cuBLAS/cudart
#                       linked everywhere, and the GPU tests $(BUILD)/bin/marlaas-gpu-tests; all
#                       of it under build/cuda (see the CUDA=1 block at the top)
# make CUDA=1 gpu-test  builds and runs the GPU tests: every op of the CUDA table against the CPU
#                       backend; without a visible GPU every test is skipped, with the reason
# make cuda-check       (no CUDA=1 needed) builds everything with CUDA=1 into build/cuda; prints a
#                       skip line and succeeds when nvcc is not installed
# tests/gpu/run.sh      the GPU check for a machine with a GPU (builds, runs, reports)
CUDA_HOME ?= /usr/local/cuda
ifeq ($(origin NVCC),undefined)
NVCC := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/nvcc))
endif
CUDA_ARCHS   := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
NVCCFLAGS    := -O2 -g -lineinfo -std=c++17 $(CUDA_ARCHS) -Xcompiler -fPIC,-Wall -I. -MMD -MP
CUDA_SRC     := $(wildcard kernels/cuda/*.cu)
GPU_TEST_SRC := $(wildcard tests/gpu/*.c)
GPU_TEST_BIN := $(BUILD)/bin/marlaas-gpu-tests

.PHONY: cuda-check gpu-build gpu-test
ifeq ($(CUDA),1)
ifeq ($(NVCC),)
ifneq ($(MAKECMDGOALS),cuda-check)
$(error CUDA=1: nvcc not found (neither on PATH nor in $(CUDA_HOME)/bin); set NVCC=... or CUDA_HOME=...)
endif
endif
CUDA_OBJ     := $(CUDA_SRC:%.cu=$(BUILD)/obj/%.o)
GPU_TEST_OBJ := $(GPU_TEST_SRC:%.c=$(BUILD)/obj/%.o)
CFLAGS       += -DMARLAAS_CUDA=1 -I$(CUDA_HOME)/include
LDLIBS       += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lcublas -lcudart -lstdc++

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# The CUDA objects go into the one library (its rule archives all its prerequisites).
$(LIB): $(CUDA_OBJ)

$(GPU_TEST_BIN): $(GPU_TEST_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lcriterion

all: $(GPU_TEST_BIN)
gpu-build: $(GPU_TEST_BIN)
gpu-test: $(GPU_TEST_BIN)
	$(GPU_TEST_BIN)

-include $(CUDA_OBJ:.o=.d) $(GPU_TEST_OBJ:.o=.d)
else
# Without CUDA=1 these build (and run) the CUDA tree.
gpu-build gpu-test:
	$(MAKE) CUDA=1 $@
endif

# `make test` ends with cuda-check: wherever nvcc is installed the CUDA build is compiled (a compile
# error fails the tests) and the GPU tests run (each skipped, with the reason, without a GPU).
cuda-check:
ifeq ($(NVCC),)
	@echo "cuda-check: SKIPPED: nvcc not found (neither on PATH nor in $(CUDA_HOME)/bin); the CUDA backend was not built"
else
	$(MAKE) CUDA=1 SAN=0 VG=0 all gpu-test
endif

# The GPU tests against a CPU emulation of the CUDA kernels (no GPU, no nvcc needed; about 2
# minutes): a development aid for the kernels' logic, see tests/gpu/emu/run.sh.
.PHONY: gpu-emu
gpu-emu:
	bash tests/gpu/emu/run.sh
# --- end of CUDA backend ----------------------------------------------------------------------

# make print-VAR: the value of a variable (tests/integration/test_deps.sh reads LDLIBS)
print-%:
	@echo '$($*)'
