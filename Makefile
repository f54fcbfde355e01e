# ddp.h build. `make` builds every example and test under build/; `make test` runs the CPU suite.
# Overrides: CC, CFLAGS, LDFLAGS, CUDA_HOME, PREFIX; CUDA=0 forces the CPU-only build, CBLAS=0
# the built-in matrix loop, MPI=0 skips the MPI variants (MPICC names another MPI compiler wrapper).

BUILD   ?= build
PREFIX  ?= /usr/local
CFLAGS  ?= -O2 -g
LDFLAGS ?=
WARN    := -std=c99 -Wall -Wextra -pedantic
VERSION := 0.1.0
.SUFFIXES:
.DELETE_ON_ERROR:

# ---- CUDA: nvcc on PATH, else CUDA_HOME, else /usr/local/cuda --------------------------------
CUDA ?= auto
ifneq ($(CUDA),0)
  ifeq ($(CUDA_HOME),)
    NVCC_PATH := $(shell command -v nvcc 2>/dev/null)
    ifneq ($(NVCC_PATH),)
      CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC_PATH))
    else ifneq ($(wildcard /usr/local/cuda/include/cuda_runtime.h),)
      CUDA_HOME := /usr/local/cuda
    endif
  endif
endif
find_lib = $(firstword $(wildcard $(CUDA_HOME)/lib64/lib$(1).so $(CUDA_HOME)/lib/lib$(1).so \
             /usr/lib/x86_64-linux-gnu/lib$(1).so /usr/lib/aarch64-linux-gnu/lib$(1).so /usr/lib64/lib$(1).so))
find_hdr = $(firstword $(wildcard $(CUDA_HOME)/include/$(1) /usr/include/$(1)))
ifeq ($(CUDA),0)
  CUDA_LINE := CUDA=0: building the CPU-only library (-DDDP_NO_CUDA)
else ifneq ($(CUDA_HOME),)
  CUDA_MISSING := $(strip \
    $(if $(call find_hdr,cuda_runtime.h),,cuda_runtime.h) $(if $(call find_lib,cudart),,libcudart) \
    $(if $(call find_hdr,cublas_v2.h),,cublas_v2.h) $(if $(call find_lib,cublas),,libcublas) \
    $(if $(call find_hdr,nvrtc.h),,nvrtc.h) $(if $(call find_lib,nvrtc),,libnvrtc) \
    $(if $(call find_hdr,nccl.h),,nccl.h) $(if $(call find_lib,nccl),,libnccl))
  ifeq ($(CUDA_MISSING),)
    CUDA_LIBDIR  := $(dir $(call find_lib,cudart))
    CUDA_CFLAGS  := -I$(CUDA_HOME)/include
    CUDA_LIBS    := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublas -lnvrtc -lnccl -lcudart
    CUDA_VERSION := $(shell v=$$(sed -n 's/^\#define CUDART_VERSION *\([0-9]*\)/\1/p' $(CUDA_HOME)/include/cuda_runtime_api.h 2>/dev/null); \
                      [ -n "$$v" ] && echo $$((v / 1000)).$$((v % 1000 / 10)))
    CUDA_LINE    := CUDA $(CUDA_VERSION) at $(CUDA_HOME) (cuBLAS, NVRTC and NCCL found)
    HAVE_CUDA    := 1
  else
    CUDA_LINE := CUDA at $(CUDA_HOME) lacks $(CUDA_MISSING): building the CPU-only library (-DDDP_NO_CUDA)
  endif
else
  CUDA_LINE := no CUDA (no nvcc on PATH, no CUDA_HOME, no /usr/local/cuda): building the CPU-only library (-DDDP_NO_CUDA)
endif
ifneq ($(HAVE_CUDA),1)
  HAVE_CUDA   := 0
  CUDA_CFLAGS := -DDDP_NO_CUDA
  CUDA_LIBS   :=
endif

# ---- CBLAS: OpenBLAS through pkg-config, else any libopenblas/libcblas that links ------------
CBLAS ?= auto
# Set here, never taken from the environment: `make test-portable` exports the host's OpenBLAS flags,
# which a CBLAS=0 cross build (aarch64, musl) started from it must not inherit.
BLAS_CFLAGS :=
BLAS_LIBS   :=
ifneq ($(CBLAS),0)
  ifeq ($(shell pkg-config --exists openblas 2>/dev/null && echo yes),yes)
    BLAS_CFLAGS := -DDDP_CBLAS $(shell pkg-config --cflags openblas)
    BLAS_LIBS   := $(shell pkg-config --libs openblas)
    BLAS_LINE   := CPU Linear through OpenBLAS (cblas_sgemm)
  else
    BLAS_TRY := $(shell printf '\043include <cblas.h>\nint main(void){float a=1,c=0;cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,1,1,1,1.f,&a,1,&a,1,0.f,&c,1);return (int)c-1;}\n' \
                 | $(CC) -x c - -o /dev/null -lopenblas 2>/dev/null && echo -lopenblas)
    ifneq ($(BLAS_TRY),)
      BLAS_CFLAGS := -DDDP_CBLAS
      BLAS_LIBS   := $(BLAS_TRY)
      BLAS_LINE   := CPU Linear through OpenBLAS (cblas_sgemm)
    endif
  endif
endif
BLAS_LINE ?= CPU Linear through the built-in blocked loop (no CBLAS found; install libopenblas-dev for speed)
ifeq ($(CBLAS),0)
  BLAS_LINE := CBLAS=0: CPU Linear through the built-in blocked loop
endif

# ---- MPI: mpicc on PATH adds MPI variants (-DDDP_MPI) of a few programs; the others never change ---
# The flags come from the wrapper (Open MPI: -showme:compile/-showme:link; MPICH: -show prints the
# whole compiler line) and are passed to $(CC), so CFLAGS and sanitizers apply as everywhere else.
MPI   ?= auto
MPICC ?= mpicc
HAVE_MPI   := 0
MPI_CFLAGS :=
MPI_LIBS   :=
ifneq ($(MPI),0)
  ifneq ($(shell command -v $(MPICC) 2>/dev/null),)
    MPI_CFLAGS := $(shell $(MPICC) -showme:compile 2>/dev/null)
    MPI_LIBS   := $(shell $(MPICC) -showme:link 2>/dev/null)
    MPI_NAME   := $(shell $(MPICC) -showme:version 2>/dev/null | sed -n 's/.*\(Open MPI [0-9.]*\).*/\1/p')
    ifeq ($(strip $(MPI_CFLAGS)$(MPI_LIBS)),)
      MPI_SHOW   := $(wordlist 2,9999,$(shell $(MPICC) -show 2>/dev/null))
      MPI_CFLAGS := $(filter -I% -D%,$(MPI_SHOW))
      MPI_LIBS   := $(filter -L% -l% -Wl%,$(MPI_SHOW))
      MPI_NAME   := $(shell $(MPICC) -v 2>/dev/null | sed -n 's/.*for \(MPICH\) version \([0-9.a-z]*\).*/\1 \2/p' | head -n 1)
    endif
    MPI_TRY := $(shell printf '\043include <mpi.h>\nint main(void){return MPI_Init(0,0);}\n' \
                 | $(CC) -x c - $(MPI_CFLAGS) -o /dev/null $(MPI_LIBS) 2>/dev/null && echo ok)
    ifeq ($(MPI_TRY),ok)
      HAVE_MPI := 1
      MPI_LINE := MPI backend: built with $(MPICC) ($(or $(MPI_NAME),an MPI library)): *_mpi programs take DDP_BACKEND=mpi under mpirun
    else
      MPI_LINE := $(MPICC) found, but a program with mpi.h does not compile and link: the MPI backend is not built (install libopenmpi-dev)
    endif
  endif
endif
MPI_LINE ?= no $(MPICC): the MPI backend is not built (install libopenmpi-dev)
ifeq ($(MPI),0)
  MPI_LINE := MPI=0: the MPI backend is not built
endif

ifeq ($(filter clean help,$(MAKECMDGOALS)),)
  $(info ddp.h build: $(CUDA_LINE); $(BLAS_LINE))
  $(info $(MPI_LINE))
endif

# ---- the GPU stand-in (tests/fakegpu): CUDA, cuBLAS, NVRTC and NCCL on the CPU, for make test ------
# Built whenever the CUDA toolkit is found. The programs under $(BUILD)/fakegpu/ are the same sources
# as everywhere else, compiled against NVIDIA's headers and linked with the stand-in instead of the
# real libraries; tests/run.sh runs them on fake GPUs (FAKEGPU_DEVICES=N).
FAKE_DIR := $(BUILD)/fakegpu
FAKE_LIB := $(FAKE_DIR)/libfakegpu.so
FAKE_SRC := tests/fakegpu/runtime.c tests/fakegpu/nvrtc.c tests/fakegpu/cublas.c tests/fakegpu/nccl.c
FAKE_PROGS :=
ifeq ($(HAVE_CUDA),1)
  FAKE_LIBS  := -L$(FAKE_DIR) -Wl,-rpath,$(abspath $(FAKE_DIR)) -lfakegpu
  FAKE_PROGS := $(FAKE_DIR)/tests/fakegpu/selftest $(FAKE_DIR)/tests/test_gpu $(FAKE_DIR)/tests/test_gpu_pg \
                $(FAKE_DIR)/tests/test_ddp $(FAKE_DIR)/tests/test_own_model $(FAKE_DIR)/tests/test_gpt \
                $(FAKE_DIR)/examples/ch12_gpt $(FAKE_DIR)/examples/ch01_single_gpu $(FAKE_DIR)/examples/ch03_multi_gpu \
                $(FAKE_DIR)/examples/ch04_multi_node $(FAKE_DIR)/examples/ch06_fault_tolerance $(FAKE_DIR)/examples/ch08_large_mlp \
                $(FAKE_DIR)/bench/large_mlp_launched $(FAKE_DIR)/tests/confusions/confusions $(FAKE_DIR)/allreduce_perf \
                $(FAKE_DIR)/gpt_op_times
  ifeq ($(HAVE_MPI),1)
    FAKE_PROGS += $(FAKE_DIR)/tests/test_mpi
  endif
endif

DDP_CFLAGS := -I. $(CUDA_CFLAGS) $(BLAS_CFLAGS)
DDP_LIBS   := $(CUDA_LIBS) $(BLAS_LIBS) -lpthread -lm
export CC HAVE_CUDA CUDA_CFLAGS CUDA_LIBS BLAS_CFLAGS BLAS_LIBS HAVE_MPI MPI_CFLAGS MPI_LIBS

EXAMPLES := $(BUILD)/examples/ch01_single_gpu $(BUILD)/examples/ch03_multi_gpu $(BUILD)/examples/ch04_multi_node
EXAMPLES += $(BUILD)/examples/ch06_fault_tolerance $(BUILD)/examples/ch08_large_mlp $(BUILD)/examples/ch09_hang
EXAMPLES += $(BUILD)/examples/ch07_accumulate $(BUILD)/examples/ch11_sharding $(BUILD)/examples/ch12_own_model
EXAMPLES += $(BUILD)/examples/ch12_gpt
EXAMPLES += $(BUILD)/examples/ch02_sampler_demo $(BUILD)/examples/ch02_ring_bytes
TOOLS    := $(BUILD)/ddprun $(BUILD)/allreduce_perf
TESTS    := $(BUILD)/tests/test_basics $(BUILD)/tests/test_nn $(BUILD)/tests/test_data $(BUILD)/tests/test_gpu \
            $(BUILD)/tests/test_store $(BUILD)/tests/test_env $(BUILD)/tests/test_pg $(BUILD)/tests/test_gpu_pg $(BUILD)/tests/test_ddp $(BUILD)/tests/test_own_model $(BUILD)/tests/test_gpt $(BUILD)/tests/test_sampler \
            $(BUILD)/tests/test_snapshot $(BUILD)/tests/snapshot_dump

TESTS    += $(BUILD)/tests/snapshot_writer $(BUILD)/tests/test_desync $(BUILD)/tests/test_cycles
TESTS    += $(BUILD)/tests/sampler_dump
# learners' mistakes as small programs, run by tests/multiproc/test_confusions.sh (built by the
# tests/multiproc rule)
TESTS    += $(BUILD)/tests/confusions/confusions
# the same sources built with the mpi backend (-DDDP_MPI), when mpicc was found
MPI_PROGS := $(BUILD)/allreduce_perf_mpi $(BUILD)/examples/ch04_multi_node_mpi $(BUILD)/tests/test_mpi
ifneq ($(HAVE_MPI),1)
  MPI_PROGS :=
endif

.PHONY: all demo test test-portable test-faults test-gpu diffs sanitize tsan fuzz install uninstall clean help
all: $(EXAMPLES) $(TOOLS) $(BUILD)/gpt_op_times $(TESTS) $(MPI_PROGS) $(FAKE_PROGS)

# ddp.h's implementation is compiled once per configuration and linked into every program here.
# Each program's source starts with #define DDP_IMPLEMENTATION and #include "ddp.h", and compiles
# alone like that, as a student's does; make compiles it with -include $(DECLS) instead: ddp.h
# without its function bodies (tools/ddp_decls.awk writes it), so the program sees the same types,
# macros, system headers and prototypes, and its own #include "ddp.h" then adds nothing. The
# examples, tools and bench programs link $(OBJ)/ddp.o (ddp_mpi.o with -DDDP_MPI). The tests and
# ddprun, which call internals (ddp__ names), link ddp_internals.o (ddp_internals_mpi.o): the
# implementation compiled with -DDDP__EXPORT_INTERNALS, which gives those external linkage.
OBJ   := $(BUILD)/obj
DECLS := $(OBJ)/ddp_decls.h
$(DECLS): ddp.h tools/ddp_decls.awk
	@mkdir -p $(@D)
	awk -f tools/ddp_decls.awk ddp.h > $@
# The flags the implementation is compiled with, in a file rewritten only when they change: an
# object compiled before OpenBLAS, CUDA or Open MPI was installed, or with other CFLAGS, is compiled
# again (otherwise a `make` after apt-get install libopenblas-dev says "through OpenBLAS" and keeps
# the old object's built-in loop, about 18 times slower on chapter 8's model).
OBJ_FLAGS := $(OBJ)/flags.txt
OBJ_FLAGS_TEXT = $(CC) $(WARN) $(CFLAGS) $(DDP_CFLAGS) $(MPI_CFLAGS)
$(OBJ_FLAGS): FORCE
	@mkdir -p $(@D); echo '$(OBJ_FLAGS_TEXT)' | cmp -s - $@ || echo '$(OBJ_FLAGS_TEXT)' > $@
.PHONY: FORCE
FORCE:
# $(call IMPL,MORE CFLAGS): the implementation alone, into the object $@
IMPL = $(CC) $(WARN) $(CFLAGS) $(DDP_CFLAGS) $(1) -DDDP_IMPLEMENTATION -x c -c ddp.h -o $@
$(OBJ)/ddp.o: ddp.h $(OBJ_FLAGS)
	@mkdir -p $(@D)
	$(call IMPL,)
$(OBJ)/ddp_mpi.o: ddp.h $(OBJ_FLAGS)
	@mkdir -p $(@D)
	$(call IMPL,-DDDP_MPI $(MPI_CFLAGS))
$(OBJ)/ddp_internals.o: ddp.h $(OBJ_FLAGS)
	@mkdir -p $(@D)
	$(call IMPL,-DDDP__EXPORT_INTERNALS)
$(OBJ)/ddp_internals_mpi.o: ddp.h $(OBJ_FLAGS)
	@mkdir -p $(@D)
	$(call IMPL,-DDDP_MPI $(MPI_CFLAGS) -DDDP__EXPORT_INTERNALS)
# $(call PROG,OBJECT,LIBRARIES[,MORE CFLAGS]): the program $< against $(DECLS), linked with OBJECT
PROG = $(CC) $(WARN) $(CFLAGS) $(DDP_CFLAGS) $(3) -include $(DECLS) $< $(1) -o $@ $(LDFLAGS) $(2)
# $(call ONE_FILE,LIBRARIES): the program $< with the whole implementation compiled into it
ONE_FILE = $(CC) $(WARN) $(CFLAGS) $(DDP_CFLAGS) $< -o $@ $(LDFLAGS) $(1)
MPI_FLAGS := -DDDP_MPI $(MPI_CFLAGS)

$(BUILD)/%: tools/%.c $(DECLS) $(OBJ)/ddp.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp.o,$(DDP_LIBS))
$(BUILD)/ddprun: tools/ddprun.c $(DECLS) $(OBJ)/ddp_internals.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp_internals.o,$(DDP_LIBS))

$(BUILD)/examples/%: examples/%.c $(DECLS) $(OBJ)/ddp.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp.o,$(DDP_LIBS))
# chapter 12's GPT: the model in a header of its own, which its program and its test include
$(BUILD)/examples/ch12_gpt $(BUILD)/tests/test_gpt $(FAKE_DIR)/examples/ch12_gpt $(FAKE_DIR)/tests/test_gpt: examples/gpt.h
# and its program at -O3, where GCC turns gpt.h's elementwise loops (GELU's erf and exp above all)
# into vector instructions; at -O2 it does not (clang does at -O2 too). The library stays at CFLAGS.
$(BUILD)/examples/ch12_gpt: examples/ch12_gpt.c $(DECLS) $(OBJ)/ddp.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp.o,$(DDP_LIBS),-O3)
# where a step of that GPT spends its time, operation by operation (make gpu-check runs it on a GPU);
# at -O3 as the chapter's program is, so that its figures are that program's
$(BUILD)/gpt_op_times $(FAKE_DIR)/gpt_op_times: examples/gpt.h
$(BUILD)/gpt_op_times: tools/gpt_op_times.c $(DECLS) $(OBJ)/ddp.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp.o,$(DDP_LIBS),-O3)

# The test programs' sources lie in tests/unit, tests/multiproc (the helpers its scripts drive, and
# confusions/) and tests/crosscheck (the dump programs the Python cross-checks read); every binary
# lands in $(BUILD)/tests/ whatever its source folder.
$(BUILD)/tests/%: tests/unit/%.c tests/unit/harness.h $(DECLS) $(OBJ)/ddp_internals.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp_internals.o,$(DDP_LIBS))
$(BUILD)/tests/%: tests/multiproc/%.c $(DECLS) $(OBJ)/ddp_internals.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp_internals.o,$(DDP_LIBS))
$(BUILD)/tests/%: tests/crosscheck/%.c $(DECLS) $(OBJ)/ddp_internals.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp_internals.o,$(DDP_LIBS))
# Three compile the implementation into themselves, as a student's program does: test_sampler and
# sampler_dump give it their own allocator (DDP_MALLOC), test_desync a hook inside its shared-memory
# wait (DDP__TEST_SHM_GAP); an object compiled once has neither.
$(BUILD)/tests/test_sampler $(BUILD)/tests/test_desync: $(BUILD)/tests/%: tests/unit/%.c ddp.h tests/unit/harness.h
	@mkdir -p $(@D)
	$(call ONE_FILE,$(DDP_LIBS))
$(BUILD)/tests/sampler_dump: tests/crosscheck/sampler_dump.c ddp.h
	@mkdir -p $(@D)
	$(call ONE_FILE,$(DDP_LIBS))

$(BUILD)/%_mpi: tools/%.c $(DECLS) $(OBJ)/ddp_mpi.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp_mpi.o,$(DDP_LIBS) $(MPI_LIBS),$(MPI_FLAGS))
$(BUILD)/examples/%_mpi: examples/%.c $(DECLS) $(OBJ)/ddp_mpi.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp_mpi.o,$(DDP_LIBS) $(MPI_LIBS),$(MPI_FLAGS))
$(BUILD)/tests/test_mpi: tests/unit/test_mpi.c tests/unit/test_pg.c tests/unit/test_own_model.c tests/unit/harness.h $(DECLS) $(OBJ)/ddp_internals_mpi.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp_internals_mpi.o,$(DDP_LIBS) $(MPI_LIBS),$(MPI_FLAGS))

# The stand-in library (C, warning-free; visibility hidden but for the API calls it implements), and
# programs linked with it in place of cudart, cuBLAS, NVRTC and NCCL: the same objects as above
# (compiled against the same CUDA headers), linked with other libraries.
FAKE_LINK := $(FAKE_LIBS) $(BLAS_LIBS) -lpthread -lm
# The real NVRTC, which the stand-in also compiles every kernel program with (tests/fakegpu/nvrtc.c);
# not in the sanitizer builds: the plain build checks the same sources, and libnvrtc is not built
# for ASan's or TSan's runtime.
FAKE_REAL_NVRTC := $(if $(findstring -fsanitize,$(CFLAGS)),,$(call find_lib,nvrtc))
$(FAKE_LIB): $(FAKE_SRC) tests/fakegpu/fakegpu.h tests/fakegpu/kernel_shim.h
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -Wall -Wextra $(CFLAGS) -fPIC -shared -fvisibility=hidden $(CUDA_CFLAGS) \
	  -DFAKEGPU_SHIM='"$(abspath tests/fakegpu/kernel_shim.h)"' -DFAKEGPU_REAL_NVRTC_LIB='"$(FAKE_REAL_NVRTC)"' \
	  $(FAKE_SRC) -o $@ $(LDFLAGS) -lpthread -ldl -lrt
$(FAKE_DIR)/tests/fakegpu/selftest: tests/fakegpu/selftest.c tests/unit/harness.h $(FAKE_LIB)
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -Wall -Wextra $(CFLAGS) $(CUDA_CFLAGS) -DFG_REAL_NVRTC_LIB='"$(FAKE_REAL_NVRTC)"' $< -o $@ $(LDFLAGS) $(FAKE_LIBS) -lpthread
$(FAKE_DIR)/tests/%: tests/unit/%.c tests/unit/harness.h $(DECLS) $(OBJ)/ddp_internals.o $(FAKE_LIB)
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp_internals.o,$(FAKE_LINK))
$(FAKE_DIR)/tests/%: tests/multiproc/%.c $(DECLS) $(OBJ)/ddp_internals.o $(FAKE_LIB)
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp_internals.o,$(FAKE_LINK))
$(FAKE_DIR)/examples/%: examples/%.c $(DECLS) $(OBJ)/ddp.o $(FAKE_LIB)
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp.o,$(FAKE_LINK))
$(FAKE_DIR)/allreduce_perf: tools/allreduce_perf.c $(DECLS) $(OBJ)/ddp.o $(FAKE_LIB)
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp.o,$(FAKE_LINK))
$(FAKE_DIR)/gpt_op_times: tools/gpt_op_times.c $(DECLS) $(OBJ)/ddp.o $(FAKE_LIB)
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp.o,$(FAKE_LINK))
$(FAKE_DIR)/tests/test_mpi: tests/unit/test_mpi.c tests/unit/test_pg.c tests/unit/test_own_model.c tests/unit/harness.h $(DECLS) $(OBJ)/ddp_internals_mpi.o $(FAKE_LIB)
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp_internals_mpi.o,$(FAKE_LIBS) $(BLAS_LIBS) $(MPI_LIBS) -lpthread -lm,$(MPI_FLAGS))
$(FAKE_DIR)/bench/large_mlp_launched: bench/large_mlp_launched.c examples/ch08_large_mlp.c $(DECLS) $(OBJ)/ddp.o $(FAKE_LIB)
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp.o,$(FAKE_LINK))

# The main job: the chapter-3 program (examples/ch03_multi_gpu.c) on 4 ranks (CPU backend) on the bundled wine data.
# It builds that one program only, so that a fresh clone trains within a minute; `make` builds the rest.
# Alone on the command line, it compiles the program in one file, a little sooner on a fresh clone
# than the generated header and ddp.o first (a later `make` links it like the others).
ifeq ($(MAKECMDGOALS),demo)
$(BUILD)/examples/ch03_multi_gpu: examples/ch03_multi_gpu.c ddp.h
	@mkdir -p $(@D)
	$(call ONE_FILE,$(DDP_LIBS))
endif
demo: $(BUILD)/examples/ch03_multi_gpu
	@$(BUILD)/examples/ch03_multi_gpu --nproc 4 --device cpu --save-every 0

# The CPU suite: unit tests, compile modes, the chapter-1 example's accuracy bars.
test: all
	@BUILD=$(BUILD) bash tests/run.sh

# What a student's laptop runs that this machine would not, checked here (tests/portable/test_portable.sh):
# the header with its Linux-only code off (-DDDP_PORTABLE) under a preload library that gives shared
# memory macOS's 16 KiB pages, and the shell scripts with a macOS-like shell; musl (musl-gcc); aarch64
# under qemu-user, with TUTORIAL.md's chapters 1-7. Builds its own folders under $(BUILD)/; each part
# is skipped, with the reason, where its tools are missing. About 4-5 minutes on 2 cores.
test-portable:
	@bash tests/portable/test_portable.sh $(BUILD)

# The kill-and-resume drill over 20 random kills (make test runs 5), plus the other fault cases,
# and 200 init/destroy cycles on one port (make test runs 20); last line: N passed, N failed, N skipped.
test-faults: all
	@BUILD=$(BUILD) bash tests/run.sh --faults

# The GPU tests; on a machine without a GPU they fail (make test skips them instead).
test-gpu: all
	@BUILD=$(BUILD) bash tests/run.sh --gpu

# The diffs between the chapters' programs that TUTORIAL.md shows, regenerated from the files
# (make test fails when one is stale).
diffs:
	@python3 tools/docs.py diffs

# The CPU suite again under AddressSanitizer and UndefinedBehaviorSanitizer, in its own folder.
# protect_shadow_gap=0 lets the CUDA runtime map its memory under ASan; the suppressions cover
# allocations the CUDA and Open MPI libraries keep for the life of the process. The build takes
# make's -j (make -j2 sanitize); the tests run one at a time, as in make test.
SAN := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
sanitize:
	@export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=0 \
	 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
	 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1; \
	 $(MAKE) --no-print-directory BUILD=$(BUILD)/sanitize CFLAGS="$(SAN)" LDFLAGS="$(SAN)" all && \
	 $(MAKE) -j1 --no-print-directory BUILD=$(BUILD)/sanitize CFLAGS="$(SAN)" LDFLAGS="$(SAN)" test

# The CPU suite again under ThreadSanitizer, in its own folder, CPU-only (the uninstrumented CUDA
# runtime only adds noise; the unset keeps this make's exported CUDA settings from overriding
# CUDA=0). A report fails its program (exit 66) and goes to a file under $(BUILD)/tsan/reports:
# checks that only read a program's output cannot miss it, the reports are printed at the end and
# fail the target. tests/tsan.supp: the uninstrumented libraries' own races. DDP_TSAN=1 tells
# tests/run.sh which checks cannot run under TSan.
TSAN := -O1 -g -fsanitize=thread -fno-omit-frame-pointer
TSAN_LOG = $(abspath $(BUILD))/tsan/reports
tsan:
	@rm -rf $(TSAN_LOG); mkdir -p $(TSAN_LOG); unset HAVE_CUDA CUDA_CFLAGS CUDA_LIBS; \
	 export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:log_path=$(TSAN_LOG)/tsan:suppressions=$(CURDIR)/tests/tsan.supp:print_suppressions=0"; \
	 $(MAKE) --no-print-directory BUILD=$(BUILD)/tsan CUDA=0 CFLAGS="$(TSAN)" LDFLAGS="$(TSAN)" all && \
	 DDP_TSAN=1 $(MAKE) -j1 --no-print-directory BUILD=$(BUILD)/tsan CUDA=0 CFLAGS="$(TSAN)" LDFLAGS="$(TSAN)" test; rc=$$?; \
	 if [ -n "$$(ls -A $(TSAN_LOG))" ]; then cat $(TSAN_LOG)/*; \
	   echo "make tsan: ThreadSanitizer reports above (kept in $(TSAN_LOG))"; exit 1; fi; exit $$rc

# Fuzzing with libFuzzer (clang): the snapshot reader (tests/fuzz/fuzz_snapshot.c) and the store
# server's message handling (tests/fuzz/fuzz_store.c), FUZZ_TIME seconds each (default 60), under
# ASan and UBSan. Seeds: tests/fuzz/corpus_*/ and valid inputs each fuzzer writes for itself
# (DDP_FUZZ_WRITE_SEEDS). New inputs are kept in $(BUILD)/fuzz/corpus_*; a crash's input is written
# to $(BUILD)/fuzz/crash-* and ends that fuzzer's run. `make test` runs a short fixed-seed round of both.
FUZZ_CC    ?= clang
FUZZ_TIME  ?= 60
FUZZ_FLAGS := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
              -std=c99 -DDDP_NO_CUDA -I.
$(BUILD)/fuzz/%: tests/fuzz/%.c ddp.h
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) $< -o $@ -lpthread -lm
fuzz: $(BUILD)/fuzz/fuzz_snapshot $(BUILD)/fuzz/fuzz_store
	@rc=0; for f in snapshot store; do \
	  mkdir -p $(BUILD)/fuzz/corpus_$$f $(BUILD)/fuzz/seeds_$$f; \
	  DDP_FUZZ_WRITE_SEEDS=$(BUILD)/fuzz/seeds_$$f $(BUILD)/fuzz/fuzz_$$f || rc=1; \
	  echo "== fuzz_$$f for $(FUZZ_TIME) s"; \
	  $(BUILD)/fuzz/fuzz_$$f -max_total_time=$(FUZZ_TIME) -print_final_stats=1 -artifact_prefix=$(BUILD)/fuzz/ \
	    $(BUILD)/fuzz/corpus_$$f tests/fuzz/corpus_$$f $(BUILD)/fuzz/seeds_$$f || rc=1; \
	done; exit $$rc

# Side-by-side benchmarks (bench/run.py): the all-reduce against Open MPI and PyTorch gloo, DDP
# training steps against PyTorch DDP, one table at the end and a CSV under $(BUILD)/bench/.
# About 9 minutes on 2 cores; BENCH_QUICK=1 for a smoke run of about 3; BENCH_SMOKE=1 runs every
# program and parser once (about a minute; make test does, and fails when a cell has no figure).
# bench-gpu: the large model on one GPU, ddp.h against PyTorch, NCCL with one rank, and the CPU
# backend with GPU buffers; every row says why it is skipped on a machine without a GPU.
.PHONY: bench bench-gpu
bench: $(BUILD)/ddprun $(BUILD)/allreduce_perf $(BUILD)/examples/ch08_large_mlp $(BUILD)/examples/ch01_single_gpu \
       $(BUILD)/examples/ch03_multi_gpu $(BUILD)/examples/ch12_gpt
	@python3 bench/run.py $(BUILD)

$(BUILD)/bench/large_mlp_launched: bench/large_mlp_launched.c examples/ch08_large_mlp.c $(DECLS) $(OBJ)/ddp.o
	@mkdir -p $(@D)
	$(call PROG,$(OBJ)/ddp.o,$(DDP_LIBS))

bench-gpu: $(BUILD)/ddprun $(BUILD)/examples/ch08_large_mlp $(BUILD)/bench/large_mlp_launched $(BUILD)/examples/ch01_single_gpu
	@BENCH_HAVE_CUDA=$(HAVE_CUDA) python3 bench/run.py --gpu $(BUILD)

# make gpu-check: on a machine with a GPU, everything a first real run must show, in one report
# (BUILD/gpu-check/report.txt; tools/gpu_check.sh says what it runs). It rebuilds nothing, so a
# build made elsewhere can be carried to a GPU machine that has no compiler or toolkit:
#   make BUILD=build-gpu gpu-check-build      (here: the programs gpu-check runs, about 8 MB)
#   make BUILD=build-gpu gpu-check            (there)
# make gpu-check-standin runs the same flow on the GPU stand-in, so that the first real run can
# only fail on the GPU itself.
GPU_CHECK_PROGS := $(BUILD)/tests/test_gpu $(BUILD)/tests/test_gpu_pg $(BUILD)/tests/test_ddp $(BUILD)/tests/test_own_model \
                   $(BUILD)/tests/test_gpt $(BUILD)/examples/ch12_gpt \
                   $(BUILD)/examples/ch01_single_gpu $(BUILD)/examples/ch03_multi_gpu $(BUILD)/examples/ch06_fault_tolerance \
                   $(BUILD)/examples/ch08_large_mlp \
                   $(BUILD)/bench/large_mlp_launched $(BUILD)/ddprun $(BUILD)/allreduce_perf $(BUILD)/gpt_op_times
.PHONY: gpu-check gpu-check-build gpu-check-standin
gpu-check-build: $(GPU_CHECK_PROGS)
gpu-check:
	@bash tools/gpu_check.sh $(BUILD)
gpu-check-standin: all
	@GPU_CHECK_STANDIN=1 bash tools/gpu_check.sh $(BUILD)

-include labs/labs.mk
-include docs/figures/figures.mk
# Installs ddp.h and two pkg-config files, so a student's build line is
#   cc train.c $(pkg-config --cflags --libs ddp)        this build's flavour (CUDA when make found it)
#   cc train.c $(pkg-config --cflags --libs ddp-cpu)    CPU only (-DDDP_NO_CUDA): links no CUDA library
# pkg-config searches only its own folders (pkg-config --variable pc_path pkg-config): for another
# PREFIX, PKG_CONFIG_PATH=$(PREFIX)/lib/pkgconfig, which install prints when it is needed.
PC_FILE = printf '%s\n' 'prefix=$(PREFIX)' 'includedir=$${prefix}/include' '' 'Name: $(1)' \
	  'Description: Distributed Data Parallel training in one C header$(2)' 'Version: $(VERSION)' \
	  'Cflags: -I$${includedir} $(3)' 'Libs: $(4)' > $(DESTDIR)$(PREFIX)/lib/pkgconfig/$(1).pc
install: $(TOOLS)
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 ddp.h $(DESTDIR)$(PREFIX)/include/ddp.h
	install -m 755 $(TOOLS) $(DESTDIR)$(PREFIX)/bin/
	$(call PC_FILE,ddp,,$(CUDA_CFLAGS) $(BLAS_CFLAGS),$(DDP_LIBS))
	$(call PC_FILE,ddp-cpu, (CPU only),-DDDP_NO_CUDA $(BLAS_CFLAGS),$(BLAS_LIBS) -lpthread -lm)
	@case ":$$(pkg-config --variable pc_path pkg-config 2>/dev/null):$${PKG_CONFIG_PATH:-}:" in \
	  *":$(PREFIX)/lib/pkgconfig:"*) ;; \
	  *) echo "make install: pkg-config does not look in $(PREFIX)/lib/pkgconfig; to build with it, set"; \
	     echo "  export PKG_CONFIG_PATH=$(PREFIX)/lib/pkgconfig$${PKG_CONFIG_PATH:+:$$PKG_CONFIG_PATH}"; \
	     echo "then: cc train.c \$$(pkg-config --cflags --libs ddp)   (ddp-cpu: the CPU-only flavour)" ;; \
	esac

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/include/ddp.h $(DESTDIR)$(PREFIX)/lib/pkgconfig/ddp.pc \
	      $(DESTDIR)$(PREFIX)/lib/pkgconfig/ddp-cpu.pc $(addprefix $(DESTDIR)$(PREFIX)/bin/,$(notdir $(TOOLS)))

clean:
	rm -rf $(BUILD)

help:
	@echo "make            build examples and tests under $(BUILD)/"
	@echo "make demo       train the chapter-3 example on 4 CPU ranks"
	@echo "make test       run the CPU test suite (last line: N passed, N failed, N skipped)"
	@echo "make test-portable  the macOS paths (-DDDP_PORTABLE, 16 KiB shared memory), musl, aarch64 under qemu"
	@echo "make diffs      regenerate the chapter diffs that TUTORIAL.md shows"
	@echo "make figures   measure and draw the tutorial's figures (gnuplot); figures-render: draw only"
	@echo "make bench      ddp.h beside Open MPI, gloo and PyTorch DDP (~9 min; BENCH_QUICK=1: ~3), CSV in $(BUILD)/bench/"
	@echo "make bench-gpu  the large model on one GPU: ddp.h vs PyTorch, NCCL with one rank (skips without a GPU)"
	@echo "make gpu-check  on a GPU machine: versions, test-gpu, chapters 1 and 3, equivalence, bench-gpu, one report"
	@echo "make gpu-check-standin  the same flow on the GPU stand-in (no GPU needed)"
	@echo "make test-faults kill-and-resume over 20 random kills, stopped and dead ranks, 200 init/destroy cycles"
	@echo "make test-gpu   run the GPU tests (needs a GPU)"
	@echo "make lab-NAME   run a classroom lab's tests on labs/NAME/starter.c (labs/README.md)"
	@echo "make lab-handout  pack the committed labs for students, without the solutions"
	@echo "make sanitize   run the CPU suite under ASan and UBSan"
	@echo "make tsan       run the CPU suite under ThreadSanitizer (CPU-only build)"
	@echo "make fuzz       fuzz the snapshot reader and the store server with libFuzzer (clang), FUZZ_TIME=60 s each"
	@echo "make install    install ddp.h, ddp.pc and ddp-cpu.pc (CPU only) under PREFIX ($(PREFIX))"
