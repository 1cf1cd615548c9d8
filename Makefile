# ds4f — build, demo and tests. `make demo` and `make test` install missing system packages
# first (scripts/install-deps.sh), so a fresh Debian or macOS machine needs nothing else.

CC      ?= cc
BUILD   ?= build
PKGS    := libcjson libpcre2-8 libmicrohttpd libedit
OPT     ?= -O2
# GCC's -O2 vectorizes only loops that need no scalar epilogue ("very-cheap"); most of the
# elementwise loops between the products have a run-time length, so allow the cheap model
# (measured: +1.5% on a 512-token prefill). Vectorizing never reorders float operations without
# -ffast-math, so the results are the same bits. Clang vectorizes these at -O2 already.
VECT_FLAGS := $(if $(shell $(CC) -v 2>&1 | grep '^gcc version'),-fvect-cost-model=cheap)
# -ffp-contract=off: the scalar kernels are the reference that every SIMD variant must match bit
# for bit, so the compiler may not fuse a*b+c into an FMA behind our back.
CFLAGS  += -std=c11 $(OPT) $(VECT_FLAGS) -g -Wall -Wextra -Wno-unused-parameter -ffp-contract=off \
           -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Iinclude -Isrc -MMD -MP
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
LDLIBS  += $(PKG_LIBS) -lm -lpthread

UNAME_M := $(shell uname -m)
# SIMD variants are compiled with their own target flags and chosen at run time.
ifeq ($(filter x86_64 amd64,$(UNAME_M)),$(UNAME_M))
AVX2_FLAGS    := -mavx2 -mfma -mf16c
AVXVNNI_FLAGS := $(AVX2_FLAGS) -mavxvnni
AVX512_FLAGS  := -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vnni -mavx512vbmi -mavx512bf16 -mfma -mf16c
AMX_FLAGS     := $(AVX512_FLAGS) -mamx-tile -mamx-int8 -mamx-bf16
else
AVX2_FLAGS    :=
AVXVNNI_FLAGS :=
AVX512_FLAGS  :=
AMX_FLAGS     :=
endif

LIB_SRC  := $(filter-out src/app/main.c,$(wildcard src/*/*.c))
ifneq ($(filter x86_64 amd64,$(UNAME_M)),$(UNAME_M))
LIB_SRC  := $(filter-out %_avx2.c %_avxvnni.c %_avx512.c %_amx.c,$(LIB_SRC))
endif
ifeq ($(filter arm64 aarch64,$(UNAME_M)),)
LIB_SRC  := $(filter-out %_neon.c,$(LIB_SRC))
endif
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/unit/*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
FUZZ_SRC := $(wildcard tests/fuzz/*.c)
# Test-only command-line tools (used by tests/cli/*.sh), linked with the golden comparison code.
TOOLS    := $(patsubst tests/tools/%.c,$(BUILD)/tools/%,$(wildcard tests/tools/*.c))

.PHONY: all deps demo test clean fuzz bench neon-test

all: $(BUILD)/ds4f

deps: $(BUILD)/.deps-ok
$(BUILD)/.deps-ok: scripts/install-deps.sh
	@./scripts/install-deps.sh
	@mkdir -p $(BUILD) && touch $@

$(BUILD)/%.o: %.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -c $< -o $@

$(BUILD)/%_avx2.o: %_avx2.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) $(AVX2_FLAGS) -c $< -o $@

$(BUILD)/%_avxvnni.o: %_avxvnni.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) $(AVXVNNI_FLAGS) -c $< -o $@

$(BUILD)/%_avx512.o: %_avx512.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) $(AVX512_FLAGS) -c $< -o $@

$(BUILD)/%_amx.o: %_amx.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) $(AMX_FLAGS) -c $< -o $@

$(BUILD)/libds4f.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/ds4f: $(BUILD)/src/app/main.o $(BUILD)/libds4f.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/unit_tests: $(TEST_OBJ) $(BUILD)/libds4f.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tools/%: $(BUILD)/tests/tools/%.o $(BUILD)/tests/unit/golden.o $(BUILD)/libds4f.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The embedded default: synthesize a tiny model, stream a few tokens from it, print the report.
demo: $(BUILD)/ds4f
	./scripts/demo.sh $(BUILD)/ds4f

# Unit tests (C), golden numerics, CLI tests; prints one closing line "N passed, N failed".
test: $(BUILD)/ds4f $(BUILD)/unit_tests $(TOOLS)
	./tests/run.sh $(BUILD)

bench: $(BUILD)/ds4f
	@echo "benchmarks live in bench/; see bench/README.md"

# The NEON kernels on x86 hosts: cross-compiled (Debian: gcc-aarch64-linux-gnu) and run under
# qemu-user (Debian: qemu-user) with the kernel equivalence tests (every variant vs scalar,
# bitwise). Needs no arm64 libraries: the kernels and their tests use libc only.
NEON_CC      ?= aarch64-linux-gnu-gcc
QEMU_AARCH64 ?= qemu-aarch64
NEON_TEST_SRC := tests/unit/main.c tests/unit/test_kernels.c src/format/dtype.c src/format/matrix.c \
                 $(filter-out %_avx2.c %_avxvnni.c %_avx512.c %_amx.c,$(wildcard src/kernels/*.c))
neon-test:
	@mkdir -p $(BUILD)/arm64
	$(NEON_CC) -std=c11 -O2 -g -Wall -Wextra -Wno-unused-parameter -ffp-contract=off -D_GNU_SOURCE -Iinclude -Isrc \
	    -static $(NEON_TEST_SRC) -lm -lpthread -o $(BUILD)/arm64/kernel_tests
	$(QEMU_AARCH64) $(BUILD)/arm64/kernel_tests kernels

clean:
	rm -rf $(BUILD)

# libFuzzer harnesses (tests/fuzz/*.c), each linked against the whole library built with clang and
# the address and undefined-behaviour sanitizers into $(BUILD)/fuzz/. Not part of `make test`.
# Needs clang and its fuzzer runtime (Debian: apt-get install clang libclang-rt-14-dev).
FUZZ_CC     ?= clang
FUZZ_BUILD  := $(BUILD)/fuzz
FUZZ_CFLAGS  = $(filter-out $(OPT),$(CFLAGS)) -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
               -fno-sanitize-recover=undefined
FUZZ_BIN    := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ_BUILD)/%)
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_BUILD)/%.o)

fuzz: $(FUZZ_BIN)
	@echo "fuzz harnesses built in $(FUZZ_BUILD)/: $(notdir $(FUZZ_BIN))"
	@echo "run one from the repository root (a scratch corpus first, then its seeds; see its header):"
	@echo "  mkdir -p $(FUZZ_BUILD)/corpus/NAME"
	@echo "  $(FUZZ_BUILD)/fuzz_NAME -max_total_time=600 -jobs=1 [-dict=tests/fuzz/corpus/NAME.dict] \\"
	@echo "      $(FUZZ_BUILD)/corpus/NAME tests/fuzz/corpus/NAME"

$(FUZZ_BUILD)/%.o: %.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(PKG_CFLAGS) -c $< -o $@

$(FUZZ_BUILD)/%_avx2.o: %_avx2.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(PKG_CFLAGS) $(AVX2_FLAGS) -c $< -o $@

$(FUZZ_BUILD)/%_avxvnni.o: %_avxvnni.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(PKG_CFLAGS) $(AVXVNNI_FLAGS) -c $< -o $@

$(FUZZ_BUILD)/%_avx512.o: %_avx512.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(PKG_CFLAGS) $(AVX512_FLAGS) -c $< -o $@

$(FUZZ_BUILD)/%_amx.o: %_amx.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(PKG_CFLAGS) $(AMX_FLAGS) -c $< -o $@

$(FUZZ_BUILD)/libds4f.a: $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_BUILD)/libds4f.a | $(BUILD)/.deps-ok
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(PKG_CFLAGS) $< $(FUZZ_BUILD)/libds4f.a $(LDLIBS) -o $@

-include $(LIB_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(BUILD)/src/app/main.d $(FUZZ_LIB_OBJ:.o=.d)
