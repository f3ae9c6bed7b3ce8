# tpk — build, test, install.
#   make            build/libtpk_host.a (+ build/libtpk_cuda.a when nvcc is found)
#   make test       install missing Debian packages (as root), build what the suite runs, run it:
#                   each behaviour in one configuration (under 10 minutes on 2 cores)
#   make test-long  CI: what make test leaves out (other rank counts, the emulator's race schedules
#                   and variants, the trainer scripts' long cases)
#   make test-sanitize  the host suite built with AddressSanitizer + UBSan (in build/san)
#   make test-gpu   the CUDA checks (skipped, exit 0, where no GPU is present)
#   make test-slurm the trainer under a single-node Slurm started on localhost (as root; SKIP otherwise)
#   make cuda-check build the CUDA archive, the GPU tests and the GPU benchmarks (needs nvcc)
#   make cuda-report  registers, spills, occupancy and SASS per HMMA of every CUDA kernel, against tools/cuda-budget.txt
#   make bench-gpu  bench/gemm and bench/kernels (on the GPU where one is present, else the host)
#   make bench-gpt2 GPT-2 124M and 350M training steps: tpk's trainer next to PyTorch eager and torch.compile
#   make bench-families  the same for a Llama 1B and GPT-NeoX (Pythia) 410M and 1B at S=2048
#   make bench-families-check  the CPU check of that benchmark's PyTorch models at tiny shapes (not timed)
#   make gpu-report a GPU's first hour in one command: build, test-gpu with compute-sanitizer, bench-gpu,
#                   bench-gpt2 and bench-families, one Markdown report ($(B)/gpu-report.md) with every
#                   figure against its target
#   make bench      the host benchmarks (bench/), PyTorch on the CPU beside them: a block, the ops, whole steps
#   make bench-setup model setup time at 1k/4k/16k layers (linear in the parameters)
#   make bench-pipeline the pipeline's bubble and activation memory per stage at 2 and 4 stages
#   make bench-cp   context parallelism: the longest sequence in a memory budget, the step against CP
#   make bench-moe  the mixture of experts' all-to-all bytes a step against the theory, at EP 1, 2, 4
#   make bench-zero ZeRO 0-3 at DP 4: peak per rank in a budget and planned, the step, gathers hidden
#   make bench-plan the planner's step times next to measured ones (this machine calibrated)
#   make bench-tokenizer the tokenizer's MB/s on one core next to Hugging Face tokenizers'
#   make format-check  the C, C++, CUDA and Python sources' format: <= 100 columns, spaces, line ends
#   make install PREFIX=/usr/local
#   make clean

PREFIX   ?= /usr/local
# the build directory (make test-sanitize builds into build/san)
B        ?= build
CC       ?= cc
MPICC    ?= mpicc
NVCC     ?= $(shell command -v nvcc 2>/dev/null)
CFLAGS   ?= -O2
WARN      = -std=c11 -Wall -Wextra -Werror
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
# the version, written once in include/tpk/base/version.h (tpk.pc, tpk-cuda.pc, the CMake package)
TPK_VERSION := $(shell awk '/^\#define TPK_VERSION_(MAJOR|MINOR|PATCH) /{v = v s $$3; s = "."} END {print v}' include/tpk/base/version.h)
CPPFLAGS += -Iinclude

HOST_SRC  = $(wildcard kernels/host/*.c)
HOST_OBJ  = $(HOST_SRC:kernels/host/%.c=$(B)/host/%.o)
CUDA_SRC  = $(wildcard kernels/cuda/*.cu)
CUDA_OBJ  = $(CUDA_SRC:kernels/cuda/%.cu=$(B)/cuda/%.o)
NVCCFLAGS ?= -O3 -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -Xcompiler -Wall,-Wextra,-Werror -Iinclude
# CUDA: HAVE_CUDA is non-empty when nvcc is found. A program that uses the GPU adds
#   -DTPK_WITH_CUDA build/libtpk_cuda.a $(CUDA_LIBS)
# (the CUDA archive carries the host backend too, so it replaces build/libtpk_host.a).
HAVE_CUDA := $(NVCC)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
HAVE_NCCL := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/local/include/nccl.h /usr/include/nccl.h))
ifeq ($(HAVE_NCCL),)
NVCCFLAGS += -DTPK_NO_NCCL
endif
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart $(if $(HAVE_NCCL),-lnccl) -lstdc++ -lm
GPU_TESTS  = $(patsubst tests/gpu/%.c,$(B)/tests/gpu/%,$(wildcard tests/gpu/*.c))
GPU_BENCH  = $(patsubst bench/%.c,$(B)/bench/%,$(wildcard bench/gemm.c bench/kernels.c))
TESTS     = $(patsubst tests/%.c,$(B)/tests/%,$(wildcard tests/test_*.c)) $(B)/tests/test_cxx $(B)/tests/gpu_emu_ops $(B)/tests/gpu_emu_layers
# the programs only make test-long runs (the emulation's checked build and its own test, the
# trainer on the emulated backend)
TESTS_LONG = $(B)/tests/gpu_emu_race $(B)/tests/gpu_emu_ops_chk $(B)/tests/gpu_emu_layers_chk $(B)/tests/train_cuda_emu
MPICXX   ?= mpicxx
CXXWARN   = -std=c++17 -Wall -Wextra -Werror -pedantic
HEADERS   = $(wildcard include/tpk/*.h include/tpk/*/*.h)

# The default backend (tpk_ops_default, tpk/runtime/init.h) is a weak reference in the headers: ask the
# linker to take it from the archive, so a context made with .ops = NULL gets the host backend.
DEFAULT_OPS = -Wl,-u,tpk_ops_default

LIBS = $(B)/libtpk_host.a
ifneq ($(NVCC),)
LIBS += $(B)/libtpk_cuda.a
endif

.PHONY: format-check all deps test test-long test-sanitize test-gpu test-slurm cuda-check cuda-report bench bench-setup bench-pipeline bench-cp bench-moe bench-zero bench-plan bench-tokenizer bench-gpu bench-gpt2 bench-families bench-families-check gpu-report demo install clean $(B)/tpk.pc $(B)/tpk-cuda.pc fuzz
all: $(LIBS) $(if $(HAVE_CUDA),$(GPU_TESTS) $(GPU_BENCH) $(B)/tests/cuda_cxx)

# The host kernels: sqrtf and the like as the instruction, without errno (the same results; the
# vector loops of kernels/host/vec.h stay vector loops); no note on the vector ABI (every function
# passing vectors is inlined). Their headers are private to kernels/host.
HOST_CFLAGS = -fno-math-errno -Wno-psabi
$(B)/host/%.o: kernels/host/%.c kernels/host/host_private.h kernels/host/vec.h $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CFLAGS) $(HOST_CFLAGS) $(CPPFLAGS) $(BLAS_CFLAGS) -c $< -o $@

$(B)/libtpk_host.a: $(HOST_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

# ptxas's resource usage (-Xptxas -v: registers, spills, stack, shared memory per kernel and architecture) is
# kept beside each object in %.res.txt for make cuda-report (tools/cuda_report.py), which reads the
# SASS from the object itself: the report compiles nothing again. Other compiler output is shown.
$(B)/cuda/%.o $(B)/cuda/%.res.txt: kernels/cuda/%.cu $(HEADERS) kernels/cuda/common.cuh kernels/cuda/flash.cuh
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -Xptxas -v -c $< -o $(B)/cuda/$*.o > $(B)/cuda/$*.res.tmp 2>&1; rc=$$?; \
	  grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' -e '^ptxas.*Compile time' $(B)/cuda/$*.res.tmp >&2; \
	  [ $$rc -eq 0 ] && mv $(B)/cuda/$*.res.tmp $(B)/cuda/$*.res.txt

# The CUDA archive: the CUDA backend, the NCCL communicator and the host backend's objects, so a
# GPU program links this one archive (+ $(CUDA_LIBS) and OpenBLAS).
$(B)/libtpk_cuda.a: $(CUDA_OBJ) $(HOST_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

# GPU test programs (tests/gpu, not run by the CPU driver) and benchmarks that can use the GPU.
$(B)/tests/gpu/%: tests/gpu/%.c tests/gpu/gpu_test.h tests/test.h $(HEADERS) $(B)/libtpk_cuda.a
	@mkdir -p $(@D)
	$(MPICC) $(WARN) $(CFLAGS) $(CPPFLAGS) -Itests -DTPK_WITH_CUDA $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_cuda.a $(BLAS_LIBS) $(CUDA_LIBS)
$(GPU_BENCH): $(B)/bench/%: bench/%.c $(HEADERS) $(B)/libtpk_host.a $(if $(HAVE_CUDA),$(B)/libtpk_cuda.a) $(B)/backend
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) $(BLAS_CFLAGS) $(if $(HAVE_CUDA),-DTPK_WITH_CUDA) $< -o $@ \
	  $(DEFAULT_OPS) $(if $(HAVE_CUDA),$(B)/libtpk_cuda.a,$(B)/libtpk_host.a) $(BLAS_LIBS) $(if $(HAVE_CUDA),$(CUDA_LIBS)) -lm

# The objects are prerequisites, not a second make's targets: `make -j cuda-check build/train`
# then builds each object once (a recursive make would compile them twice at the same time).
cuda-check: $(if $(HAVE_CUDA),$(B)/libtpk_cuda.a $(GPU_TESTS) $(GPU_BENCH) $(B)/tests/cuda_cxx)
	@if [ -z "$(HAVE_CUDA)" ]; then echo "cuda-check: nvcc not found: nothing to build"; exit 1; fi
	@echo "cuda-check: the CUDA archive, $(words $(GPU_TESTS)) GPU test programs, the CUDA C++ test (tests/cuda_cxx.cu) and the GPU benchmarks compile"
	@py=; for c in python3 /usr/bin/python3; do $$c -c 'import numpy' 2>/dev/null && { py=$$c; break; }; done; \
	 if [ -z "$$py" ]; then echo "cuda-check: numpy not found: tests/gpu/emulate.py skipped"; \
	 else out=$$($$py tests/gpu/emulate.py) || { echo "$$out"; exit 1; }; \
	 echo "cuda-check: CPU emulation of the attention tiling and the GEMM mapping (tests/gpu/emulate.py): $$(echo "$$out" | tail -1)"; fi

# The static budget of the CUDA archive (tools/cuda_report.py, tools/cuda-budget.txt): per kernel and
# architecture (sm_80, sm_90) registers, spills, shared memory, threads and blocks per SM at the
# launch configuration the code uses, and for the tensor-core attention kernels SASS instructions and
# shared-memory bytes per HMMA in the main loop; fails on any figure past its limit in the budget.
# Reads the objects (and ptxas's log beside them) that cuda-check builds: nothing is compiled twice.
CUDA_REPORT_OBJ = $(filter-out $(B)/cuda/comm_%,$(CUDA_OBJ))
cuda-report: $(if $(HAVE_CUDA),$(CUDA_REPORT_OBJ:.o=.res.txt))
	@if [ -z "$(HAVE_CUDA)" ]; then echo "cuda-report: nvcc not found: nothing to report"; exit 1; fi
	$(PYTHON) tools/cuda_report.py --budget tools/cuda-budget.txt --nvcc $(NVCC) --workdir $(B)/cuda-report \
	  --nvccflags="$(filter -D%,$(NVCCFLAGS))" $(CUDA_REPORT_OBJ)

# The test programs at -O0 where CFLAGS says -O2 (TEST_CFLAGS: a third of -O1's compile time, most
# of make test's build; their arithmetic is the kernels', in the archive at CFLAGS, and the kit's
# headers are compiled at CFLAGS, with its warnings, by the trainer, the planner and the examples;
# the tools and the benchmarks stay at CFLAGS too, and so do other levels and the sanitizers' flags).
TEST_CFLAGS ?= $(patsubst -O2,-O0,$(CFLAGS))
# (but at -O1 the two whose own code computes: the planner's dry runs, the counting backend in the
# program, take 2.4 times as long at -O0, and the cross-entropy op test's vector reference 1.6)
$(B)/tests/test_plan_depth $(B)/tests/test_ops_xent: TEST_CFLAGS = $(patsubst -O2,-O1,$(CFLAGS))
$(B)/tests/%: tests/%.c tests/test.h tests/tp_layer.h $(HEADERS) $(B)/libtpk_host.a
	@mkdir -p $(@D)
	$(MPICC) $(WARN) $(TEST_CFLAGS) $(CPPFLAGS) -Itests $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_host.a $(BLAS_LIBS) -lm

# A program with its own ops table: linked without any tpk archive (the headers name no backend).
$(B)/tests/test_custom_ops: tests/test_custom_ops.c tests/test.h $(HEADERS)
	@mkdir -p $(@D)
	$(MPICC) $(WARN) $(TEST_CFLAGS) $(CPPFLAGS) -Itests $< -o $@ -lm

# The kit from C++17: a test program built with mpicxx (g++), run like the C tests.
$(B)/tests/test_cxx: tests/test_cxx.cpp $(HEADERS) $(B)/libtpk_host.a
	@mkdir -p $(@D)
	$(MPICXX) $(CXXWARN) $(TEST_CFLAGS) $(CPPFLAGS) $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_host.a $(BLAS_LIBS) -lm

# The CUDA backend run on the CPU: kernels/cuda/*.cu (NCCL off) converted by tests/gpu/emu/cu2cpp.pl
# (kernel launches, __shared__) into $(B)/emu/src and compiled by g++ as C++17 against the CUDA
# emulation in tests/gpu/emu/ (runtime, cuBLASLt, cuBLAS's grouped GEMM, CUB's sort; each thread a
# fiber); tests/gpu/ops.c linked with it as with the real backend. Needs neither nvcc nor a GPU. The kernels' automatic
# variables start as a pattern (-ftrivial-auto-var-init), so a read of an unset register shows.
# Warnings: cu2cpp.pl turns off one -Wextra warning in the converted kernels (it says which and why);
# gcc 12 at -O1 with sanitizers (make test-sanitize) warns of a maybe-uninitialized buffer in
# gpu_test.h's pair_randn, which test_randn fills, hence -Wno-maybe-uninitialized for ops.c.
EMU       = tests/gpu/emu
EMU_CU    = $(CUDA_SRC:kernels/cuda/%.cu=%)
EMU_OBJ   = $(EMU_CU:%=$(B)/emu/%.o) $(B)/emu/runtime.o $(B)/emu/cublaslt.o $(B)/emu/cublas.o
EMU_HDRS  = $(wildcard $(EMU)/*.h) $(EMU)/cub/device/device_radix_sort.cuh
EMU_CXX   = $(CXX) -std=c++17 -Wall -Wextra -Werror -fno-strict-aliasing -pthread $(CFLAGS) $(CPPFLAGS) -I$(EMU) -DTPK_NO_NCCL -DTPK_FLASH_EMU
EMU_INIT := $(shell $(CXX) -ftrivial-auto-var-init=pattern -x c++ -c /dev/null -o /dev/null 2>/dev/null && echo -ftrivial-auto-var-init=pattern)
# The checked build (libtpk_cuda_emu_chk.a, the tests' *_chk programs): the kernels' loads and
# stores call the emulation's access hooks (the thread sanitizer's instrumentation, its callbacks
# defined in runtime.cpp: shared memory to the race detector, global memory against the live
# allocations), about 2.3 times slower than the plain build; not with AddressSanitizer (make
# test-sanitize), which the instrumentation excludes: there the checked build is the plain one.
EMU_INSTR := $(if $(findstring -fsanitize,$(CFLAGS)),,$(shell $(CXX) -fsanitize=thread --param tsan-instrument-func-entry-exit=0 -x c++ -c /dev/null \
               -o /dev/null 2>/dev/null && echo -fsanitize=thread --param tsan-instrument-func-entry-exit=0))
$(B)/emu/src/%: kernels/cuda/% $(EMU)/cu2cpp.pl
	@mkdir -p $(@D)
	perl $(EMU)/cu2cpp.pl $< $@ $<
$(EMU_CU:%=$(B)/emu/%.o): $(B)/emu/%.o: $(B)/emu/src/%.cu $(B)/emu/src/common.cuh $(B)/emu/src/flash.cuh $(EMU_HDRS) $(HEADERS)
	@mkdir -p $(@D)
	$(EMU_CXX) $(EMU_INIT) -x c++ -c $< -o $@
$(EMU_CU:%=$(B)/emu/chk/%.o): $(B)/emu/chk/%.o: $(B)/emu/src/%.cu $(B)/emu/src/common.cuh $(B)/emu/src/flash.cuh $(EMU_HDRS) $(HEADERS)
	@mkdir -p $(@D)
	$(EMU_CXX) $(EMU_INIT) $(EMU_INSTR) -x c++ -c $< -o $@
$(B)/emu/runtime.o $(B)/emu/cublaslt.o $(B)/emu/cublas.o: $(B)/emu/%.o: $(EMU)/%.cpp $(EMU_HDRS)
	@mkdir -p $(@D)
	$(EMU_CXX) -c $< -o $@
$(B)/libtpk_cuda_emu.a: $(EMU_OBJ) $(HOST_OBJ)
	rm -f $@ && ar rcs $@ $^
# (without the instrumentation, under AddressSanitizer, the checked build's objects are the plain
# ones: not compiled twice)
EMU_CHK_OBJ = $(if $(EMU_INSTR),$(EMU_CU:%=$(B)/emu/chk/%.o),$(EMU_CU:%=$(B)/emu/%.o))
$(B)/libtpk_cuda_emu_chk.a: $(EMU_CHK_OBJ) $(B)/emu/runtime.o $(B)/emu/cublaslt.o $(B)/emu/cublas.o $(HOST_OBJ)
	rm -f $@ && ar rcs $@ $^
# the emulation's own test (tests/gpu/emu/race_test.cu): faulty kernels it must catch, their correct variants
$(B)/emu/src/race_test.cu: $(EMU)/race_test.cu $(EMU)/cu2cpp.pl
	@mkdir -p $(@D)
	perl $(EMU)/cu2cpp.pl $< $@ $<
$(B)/emu/race_test.o: $(B)/emu/src/race_test.cu $(B)/emu/src/flash.cuh $(B)/emu/src/common.cuh $(EMU_HDRS) $(HEADERS)
	$(EMU_CXX) $(EMU_INIT) $(EMU_INSTR) -x c++ -c $< -o $@
$(B)/tests/gpu_emu_race: $(B)/emu/race_test.o $(B)/emu/runtime.o
	@mkdir -p $(@D)
	$(EMU_CXX) $^ -o $@
# gpu_emu_ops and gpu_emu_layers (tests/gpu/layers.c; at 2 and 3 ranks, over MPI: 1 rank needs NCCL), both in the suite,
# and the same on the checked build (gpu_emu_ops_chk, gpu_emu_layers_chk: the race detector, the global-address checks)
# (the layers' program at TEST_CFLAGS: 3 s to compile at -O0, 14 s at -O2, and it runs in the same
# time, its work the emulated kernels' and the host's; the ops' program at -O0 runs 8% slower)
GPU_EMU_CFLAGS = $(CFLAGS)
$(B)/tests/gpu_emu_layers $(B)/tests/gpu_emu_layers_chk: GPU_EMU_CFLAGS = $(TEST_CFLAGS)
$(B)/tests/gpu_emu_%: tests/gpu/%.c tests/gpu/gpu_test.h tests/test.h $(HEADERS) $(B)/libtpk_cuda_emu.a
	@mkdir -p $(@D)
	$(MPICC) $(WARN) -Wno-maybe-uninitialized $(GPU_EMU_CFLAGS) $(CPPFLAGS) -Itests -DTPK_WITH_CUDA $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_cuda_emu.a $(BLAS_LIBS) -lstdc++ -lm -pthread
$(B)/tests/gpu_emu_%_chk: tests/gpu/%.c tests/gpu/gpu_test.h tests/test.h $(HEADERS) $(B)/libtpk_cuda_emu_chk.a
	@mkdir -p $(@D)
	$(MPICC) $(WARN) -Wno-maybe-uninitialized $(GPU_EMU_CFLAGS) $(CPPFLAGS) -Itests -DTPK_WITH_CUDA $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_cuda_emu_chk.a $(BLAS_LIBS) -lstdc++ -lm -pthread

# The trainer on the emulated CUDA backend (tests/train_emu.sh: its losses against the host's)
$(B)/tests/train_cuda_emu: examples/train.c $(HEADERS) $(B)/libtpk_cuda_emu.a
	@mkdir -p $(@D)
	$(MPICC) $(WARN) $(CFLAGS) $(CPPFLAGS) -DTPK_WITH_CUDA $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_cuda_emu.a $(BLAS_LIBS) -lstdc++ -lm -pthread

# The kit from a CUDA C++ file: compiled by nvcc, linked like a C++ program (tests/run.sh runs it).
$(B)/tests/cuda_cxx: tests/cuda_cxx.cu $(HEADERS) $(B)/libtpk_cuda.a
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@.o
	$(CXX) $@.o -o $@ $(DEFAULT_OPS) $(B)/libtpk_cuda.a $(BLAS_LIBS) $(CUDA_LIBS)

# The README's C example, cut out of README.md so it cannot drift.
$(B)/readme_example.c: README.md
	@mkdir -p $(@D)
	awk '/^```c readme-example/{f=1;next} /^```/{f=0} f' README.md > $@
	@test -s $@ || { echo "README.md has no \`\`\`c readme-example block"; exit 1; }
$(B)/readme_example: $(B)/readme_example.c $(HEADERS) $(B)/libtpk_host.a
	$(MPICC) $(WARN) $(CFLAGS) $(CPPFLAGS) $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_host.a $(BLAS_LIBS) -lm

$(B)/bench/%: bench/%.c $(HEADERS) $(B)/libtpk_host.a
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_host.a $(BLAS_LIBS) -lm
$(B)/bench/pipeline $(B)/bench/cp $(B)/bench/moe: $(B)/bench/%: bench/%.c $(HEADERS) $(B)/libtpk_host.a
	@mkdir -p $(@D)
	$(MPICC) $(WARN) $(CFLAGS) $(CPPFLAGS) $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_host.a $(BLAS_LIBS) -lm

# The pipeline's bubble and activation memory per stage (bench/pipeline.c): a GPT-2 over 2 and 4
# stages, 1F1B and interleaved at 4, 8 and 16 micro-batches, measured next to the schedule played
# and the theory. Figures, not a timed test (4 stages on fewer cores wait for the CPU too).
bench-pipeline: $(B)/bench/pipeline
	$(subst -np 2,-np 2,$(DEMO_MPI)) $(B)/bench/pipeline
	$(subst -np 2,-np 4,$(DEMO_MPI)) $(B)/bench/pipeline

# Context parallelism on the host (bench/cp.c, 4 ranks): the longest sequence whose activations a
# rank fit a budget at CP 1, 2, 4 (the context's memory counters), and a step against CP with the
# time in the CP group's messages (the profiler); the step again on 2 ranks (a core each here).
# Figures, not a timed test (4 ranks on fewer cores time-share them: the program says so).
bench-cp: $(B)/bench/cp
	$(subst -np 2,-np 4,$(DEMO_MPI)) $(B)/bench/cp
	$(DEMO_MPI) $(B)/bench/cp --part b

# The mixture of experts' all-to-all on the host (bench/moe.c, 4 ranks): a Mixtral at EP 1, 2, 4,
# the bytes its all-to-alls send a step (the EP group's counters) against the theory from the
# routing's counts, the share leaving each rank against a balanced router's, and their time.
# Figures, not a timed test.
bench-moe: $(B)/bench/moe
	$(subst -np 2,-np 4,$(DEMO_MPI)) $(B)/bench/moe

# ZeRO 0 to 3 on the host (bench/zero.sh, 4 ranks): a GPT-2 whose ZeRO-0 peak per rank is past a
# budget (ZERO_BUDGET_MB), each stage's measured peak and its split, whether it fits, the median
# step and the planner's peak beside it; the share of ZeRO-3's all-gather time hidden under compute
# (the profiler's all-gather waits against the same gathers run exposed, --zero3-no-prefetch), on 4
# ranks and on 2. Figures, not a timed test (4 ranks on fewer cores time-share them).
bench-zero: $(B)/train $(B)/plan
	TPK_BUILD=$(B) sh bench/zero.sh

# The planner's step times against the trainer's on this machine (bench/plan.sh: --calibrate first).
bench-plan: $(B)/plan $(B)/train
	TPK_BUILD=$(B) sh bench/plan.sh

# The tokenizer's encoding speed on one core next to Hugging Face tokenizers' on the same text
# (bench/tokenizer.py: a byte-level BPE trained on the license texts; build/pylib from make deps).
bench-tokenizer: $(B)/bench/tokenizer
	PYTHONPATH=build/pylib $(PYTHON) bench/tokenizer.py $(B)/bench/tokenizer

# The host benchmarks, PyTorch on the CPU alongside where Debian's python3-torch is installed:
# one GPT-2 block at one thread (bench/host_block.c); the memory-bound ops against copy bandwidth
# and the cross-entropy against F.cross_entropy at CPU_THREADS threads (bench/kernels.c --host);
# whole training steps of two small GPT-2s at CPU_THREADS threads next to PyTorch with either
# OpenMP wait policy (bench/gpt2_step.py --device cpu). Figures, not a timed test.
CPU_THREADS ?= $(shell nproc 2>/dev/null || echo 1)
bench: $(B)/bench/host_block $(B)/bench/kernels $(B)/demo/train
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(B)/bench/host_block
	OPENBLAS_NUM_THREADS=$(CPU_THREADS) $(B)/bench/kernels --host --n 67108864 --xent-rows 1024 --vocab 50257
	$(PYTHON) bench/gpt2_step.py --model L4C256 --device cpu --dtype f32 --threads $(CPU_THREADS) --trainer $(B)/demo/train
	$(PYTHON) bench/gpt2_step.py --model L6C384 --device cpu --dtype f32 --threads $(CPU_THREADS) --trainer $(B)/demo/train

# Model setup time against depth (a tiny GPT-2 at 1k, 4k, 16k layers): linear when the time per
# layer stays flat (bench/setup.c; figures, not a timed test).
bench-setup: $(B)/bench/setup
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(B)/bench/setup

# The trainer (every model family: --arch), the project's main job (examples/train.c).
# Where nvcc is found it links the CUDA archive and uses a GPU per rank when one is present.
$(B)/train: examples/train.c $(HEADERS) $(B)/libtpk_host.a $(if $(HAVE_CUDA),$(B)/libtpk_cuda.a) $(B)/backend
	@mkdir -p $(@D)
	$(MPICC) $(WARN) $(CFLAGS) $(CPPFLAGS) $(if $(HAVE_CUDA),-DTPK_WITH_CUDA) $< -o $@ \
	  $(DEFAULT_OPS) $(if $(HAVE_CUDA),$(B)/libtpk_cuda.a,$(B)/libtpk_host.a) $(BLAS_LIBS) $(if $(HAVE_CUDA),$(CUDA_LIBS)) -lm

# The configuration planner (examples/plan.c, tpk/plan): a dry run of the kit's code per TP x PP x DP,
# micro-batch, recompute, ZeRO-1 and SP choice on a hardware profile; --calibrate measures this machine.
# examples/custom_model.c: a model of one's own from the kit's public parts (tests/custom_model.sh)
$(B)/custom_model: examples/custom_model.c $(HEADERS) $(B)/libtpk_host.a
	@mkdir -p $(@D)
	$(MPICC) $(WARN) $(CFLAGS) $(CPPFLAGS) $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_host.a $(BLAS_LIBS) -lm

$(B)/plan: examples/plan.c $(HEADERS) $(B)/libtpk_host.a
	@mkdir -p $(@D)
	$(MPICC) $(WARN) $(CFLAGS) $(CPPFLAGS) $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_host.a $(BLAS_LIBS) -lm

# The Unicode support of the tokenizer (tpk/text/unicode.h) as a filter for tests/unicode.sh, which
# checks it against Python's unicodedata. Plain C: no MPI, no backend.
$(B)/tests/unicode_check: tests/unicode_check.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) $< -o $@

# The tokenizer tool (examples/tokenize.c, tpk/text/tokenizer.h): text files to llm.c token shards,
# --print FILE (ids), --decode FILE (text). Plain C: no MPI, no backend.
$(B)/tokenize: examples/tokenize.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) $< -o $@ -lm

# The trainer on the host backend alone: what make demo runs where no GPU is present, so a machine
# with nvcc but no GPU does not spend minutes compiling the CUDA archive for a run that cannot use it.
$(B)/demo/train: examples/train.c $(HEADERS) $(B)/libtpk_host.a
	@mkdir -p $(@D)
	$(MPICC) $(WARN) $(CFLAGS) $(CPPFLAGS) $< -o $@ $(DEFAULT_OPS) $(B)/libtpk_host.a $(BLAS_LIBS) -lm

# make demo: a 4-layer GPT-2 (hidden 128, 4 heads) trained at t = 2 on 2 ranks on the license
# texts every Debian system ships (byte vocabulary), saved and sampled; with the CUDA trainer
# ($(B)/train) where nvcc is found and nvidia-smi lists a GPU, else the host one.
DEMO_MPI = mpirun --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root) -np 2 -x OPENBLAS_NUM_THREADS=1
DEMO_TRAIN = $(if $(HAVE_CUDA),$(if $(shell nvidia-smi -L 2>/dev/null | grep -m1 GPU),$(B)/train,$(B)/demo/train),$(B)/train)
demo: deps
	@$(MAKE) --no-print-directory $(DEMO_TRAIN)
	@mkdir -p $(B)/demo
	@find /usr/share/common-licenses -maxdepth 1 -type f | sort | xargs cat > $(B)/demo/text.txt
	$(DEMO_MPI) $(DEMO_TRAIN) --text $(B)/demo/text.txt --tp 2 --layers 4 --hidden 128 --heads 4 \
	    --batch 8 --seq-len 64 --steps 1000 --lr 3e-3 --warmup 50 --eval-every 200 --log-every 50 \
	    --csv $(B)/demo/loss.csv --save $(B)/demo/ckpt --sample 400

# the Debian packages; then, where pip and PyPI are reachable, Hugging Face's tokenizers into
# build/pylib for the optional tokenizer reference test (tools/pydeps.sh; skipped quietly otherwise)
deps:
	@sh tools/deps.sh
	@sh tools/pydeps.sh

# The sources' format (.clang-format, .editorconfig): tools/format_check.py lists every line over
# 100 characters, tab or trailing space, and fails on one; tools/docs_check.py checks that the paths,
# line counts and #anchors README.md and docs/DESIGN.md quote exist and hold. CI runs it first.
format-check:
	@python3 tools/format_check.py
	@python3 tools/docs_check.py

# The backend the programs that can link the CUDA archive were linked for ($(B)/train and the GPU
# benchmarks: cuda where nvcc is found, host with NVCC= as make test builds them): a prerequisite of
# theirs, rewritten only when it changes, so a program linked for the other one is linked again.
$(B)/backend: FORCE
	@mkdir -p $(@D) && echo $(if $(HAVE_CUDA),cuda,host) > $@.new && \
	  if cmp -s $@.new $@; then rm -f $@.new; else mv $@.new $@; fi
FORCE:

# make test builds only what the suite runs, for the host backend (NVCC=: the CUDA archive and the
# GPU programs are make cuda-check's, which CI runs), on every core unless make was given -j; the
# build's seconds and CPU time go to the driver's summary per phase (tests/run.sh).
TEST_PROGS = $(TESTS) $(B)/tests/torch_dump $(B)/tests/train_fixtures $(B)/tests/tokenizer_check $(B)/train $(B)/plan $(B)/custom_model \
             $(B)/tests/unicode_check $(B)/tokenize $(B)/readme_example $(GPU_BENCH)
TEST_JOBS ?= $(if $(filter -j% --jobserver%,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 1))
test: deps
	@t0=$$(date +%s); $(MAKE) --no-print-directory $(TEST_JOBS) NVCC= $(TEST_PROGS) || exit 1; \
	  mkdir -p $(B)/tests && times > $(B)/tests/build-times.txt; \
	  TPK_BUILD=$(B) TPK_BUILD_SECONDS=$$(($$(date +%s) - t0)) TPK_BUILD_TIMES=$(B)/tests/build-times.txt sh tests/run.sh quick

# CI: what make test leaves out (tests/run.sh long): the other rank counts, the emulation's checked
# build under the race detector and its own test, its fallback and 99 KiB runs, the CUDA C++ test
# (where nvcc is found: built with the CUDA archive, as make cuda-check does), each header alone as
# C++17, the trainer scripts' long cases. CI runs it after make test.
test-long: deps
	@t0=$$(date +%s); $(if $(HAVE_CUDA),$(MAKE) --no-print-directory $(TEST_JOBS) $(B)/tests/cuda_cxx || exit 1;) \
	  $(MAKE) --no-print-directory $(TEST_JOBS) NVCC= $(TEST_PROGS) $(TESTS_LONG) || exit 1; \
	  mkdir -p $(B)/tests && times > $(B)/tests/build-times.txt; \
	  TPK_BUILD=$(B) TPK_BUILD_SECONDS=$$(($$(date +%s) - t0)) TPK_BUILD_TIMES=$(B)/tests/build-times.txt sh tests/run.sh long

# The host suite with AddressSanitizer and UndefinedBehaviorSanitizer (any finding stops the
# program: a failed test); built into build/san, so it does not disturb the normal build. Leak
# checks are off (Open MPI keeps memory until exit); a failed allocation returns NULL, as the
# allocation tests expect.
# The test programs at -O0 (a third of -O1's compile time, most of the build; their arithmetic is
# the kernels', which stay at -O1 with the trainer and the emulated CUDA backend).
SAN_FLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
SAN_TEST_FLAGS = $(patsubst -O1,-O0,$(SAN_FLAGS))
test-sanitize: deps
	@$(MAKE) --no-print-directory $(TEST_JOBS) B=build/san NVCC= CFLAGS="$(SAN_FLAGS)" TEST_CFLAGS="$(SAN_TEST_FLAGS)" build/san/libtpk_host.a \
	  $(patsubst $(B)/%,build/san/%,$(TEST_PROGS) $(B)/tests/gpu_emu_ops_chk $(B)/tests/gpu_emu_layers_chk)
	@TPK_BUILD=build/san ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 sh tests/run.sh quick

# The trainer launched by a real Slurm (tests/slurm.sh): Debian's slurmctld, slurmd, slurm-client and
# munge installed as make deps installs packages, a single-node cluster on localhost started and
# stopped by the script, srun --mpi=pmix -n 4 and salloc + mpirun runs whose losses must equal
# mpirun's, docs/slurm/train.sbatch submitted, a stopped rank named by the flight recorder. Without
# root or a working Slurm it prints a SKIP line naming why. CI runs it.
test-slurm: deps
	@TPK_EXTRA_PKGS="slurmd slurmctld slurm-client munge" sh tools/deps.sh || \
	  echo "test-slurm: Slurm's packages could not be installed (tests/slurm.sh says which is missing)"
	@$(MAKE) --no-print-directory $(TEST_JOBS) NVCC= $(B)/train $(B)/plan
	@mkdir -p $(B)/tests && TPK_BUILD=$(B) sh tests/slurm.sh | tee $(B)/tests/slurm.out; ! grep -q '^FAIL' $(B)/tests/slurm.out

# The CUDA checks: every op against the host op, the layers and GPT-2 at t = 1 (NCCL) and
# t = 2, 3 (MPI, ranks sharing one GPU), compute-sanitizer on the op tests (tests/gpu/run.sh).
test-gpu: $(if $(HAVE_CUDA),cuda-check $(B)/train)
	@sh tests/gpu/run.sh

bench-gpu: $(GPU_BENCH)
	$(B)/bench/gemm
	$(B)/bench/gemm --dtype bf16
	$(B)/bench/kernels
	$(B)/bench/kernels --dtype bf16 --B 16 --S 1024 --A 12 --D 64
	$(B)/bench/kernels --dtype bf16 --B 8 --S 2048 --A 16 --D 128

# tokens/s of a GPT-2 training step (B=16 S=1024 for 124M, B=8 for 350M, bf16), tpk's trainer next to
# PyTorch eager and torch.compile of the same model in the same run (bench/gpt2_step.py; --json there).
PYTHON ?= python3
bench-gpt2: $(B)/train
	$(PYTHON) bench/gpt2_step.py --model 124M
	$(PYTHON) bench/gpt2_step.py --model 350M

# The same for the other families, bf16 at S=2048 (bench/gpt2_step.py): a Llama of Llama 3.2 1B's
# shape (L16 H2048 A32, 8 key/value heads, F 8192; B=4) and GPT-NeoX of Pythia 410M (L24 H1024 A16;
# B=8) and 1B (L16 H2048 A8; B=4), rotary_pct 0.25, the parallel residual, against PyTorch models
# written as Hugging Face computes them.
bench-families: $(B)/train
	$(PYTHON) bench/gpt2_step.py --trainer $(B)/train --model llama-1B
	$(PYTHON) bench/gpt2_step.py --trainer $(B)/train --model neox-410M
	$(PYTHON) bench/gpt2_step.py --trainer $(B)/train --model neox-1B

# That benchmark's models checked on the CPU at tiny shapes (f32; not timed, not in make test): for
# each family, tpk's trainer and the PyTorch model start near ln V and train down to within 0.03 ln V
# of each other on the same batches, the PyTorch model's loss and gradients equal those of
# tests/torch_ref.py's float64 reference, the trainer's parameter count the formula's.
bench-families-check: $(B)/train
	@for m in tiny llama-tiny neox-tiny; do \
	  $(PYTHON) bench/gpt2_step.py --trainer $(B)/train --model $$m --vocab 512 --device cpu --dtype f32 --check || exit 1; done

# A GPU's first hour in one command, within TPK_REPORT_BUDGET seconds (570; one H100: under 10
# minutes): the build, make test-gpu (the op tests also under compute-sanitizer memcheck, racecheck,
# synccheck and initcheck), bench-gpu's and bench-gpt2's runs with --json, then one Markdown report,
# $(B)/gpu-report.md (attention against SDPA, memory-bound kernels against copy bandwidth, LM-head
# GEMMs against a plain GEMM, GPT-2 steps against PyTorch eager and torch.compile, each figure beside
# its target: PASS or BELOW; every step that failed or did not run named) and the logs in
# $(B)/gpu-report-logs.tar.gz (tools/gpu_report.sh, tools/gpu_report.py). Exits 1 when a test or a
# sanitizer failed or did not run, the report written all the same; without a GPU it writes a report
# saying "NO GPU" and exits 2. The make overrides (MK of the GPU machine's setup) reach the build.
gpu-report:
	@B=$(B) MAKE="$(MAKE)" PYTHON="$(PYTHON)" sh tools/gpu_report.sh

# Fuzz the safetensors reader, the GPT-2 and Llama config.json parsers with the shard index reader,
# the token loaders and the tokenizer (tokenizer.json, encode, decode: tests/fuzz/) with
# libFuzzer + ASan + UBSan for FUZZ_SECONDS each, from their corpora; installs Debian's clang and
# its sanitizer/fuzzer runtime when missing; fails on a crash (the input is left in build/fuzz/). CI runs it for 25 s each.
FUZZ_SECONDS ?= 60
fuzz:
	@TPK_EXTRA_PKGS="clang libclang-rt-dev" sh tools/deps.sh # libFuzzer's runtime is only a recommendation of clang
	@for t in safetensors:corpus config:corpus_config data:corpus_data tokenizer:corpus_tokenizer; do n=$${t%%:*}; c=$${t#*:}; \
	  mkdir -p $(B)/fuzz/$$n && \
	  clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DTPK_FUZZ_LIBFUZZER \
	    $(CPPFLAGS) tests/fuzz/fuzz_$$n.c -o $(B)/fuzz/fuzz_$$n -lm && \
	  echo "fuzz: $$n for $(FUZZ_SECONDS) s from tests/fuzz/$$c" && \
	  $(B)/fuzz/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -malloc_limit_mb=256 \
	    $$( [ $$n = safetensors ] && echo -dict=tests/fuzz/safetensors.dict) -artifact_prefix=$(B)/fuzz/$$n- $(B)/fuzz/$$n tests/fuzz/$$c \
	    > $(B)/fuzz/$$n.log 2>&1 || { tail -40 $(B)/fuzz/$$n.log; echo "fuzz: $$n found a crash (the input is in $(B)/fuzz/)"; exit 1; }; \
	  tail -1 $(B)/fuzz/$$n.log; done

$(B)/tpk.pc:
	@mkdir -p $(@D)
	printf 'prefix=%s\nincludedir=$${prefix}/include\nlibdir=$${prefix}/lib\n\nName: tpk\nDescription: header-only tensor-parallel transformer kit\nVersion: $(TPK_VERSION)\nRequires.private: openblas\nCflags: -I$${includedir}\nLibs: -L$${libdir} -Wl,-u,tpk_ops_default -ltpk_host %s -lm\n' \
	  '$(PREFIX)' '$(BLAS_LIBS)' > $@

# pkg-config `tpk-cuda`: the CUDA archive (which carries the host backend) and the CUDA libraries.
$(B)/tpk-cuda.pc:
	@mkdir -p $(@D)
	printf 'prefix=%s\nincludedir=$${prefix}/include\nlibdir=$${prefix}/lib\n\nName: tpk-cuda\nDescription: header-only tensor-parallel transformer kit, CUDA backend\nVersion: $(TPK_VERSION)\nCflags: -I$${includedir} -DTPK_WITH_CUDA\nLibs: -L$${libdir} -Wl,-u,tpk_ops_default -ltpk_cuda %s %s -lm\n' \
	  '$(PREFIX)' '$(BLAS_LIBS)' '$(CUDA_LIBS)' > $@

install: all $(B)/tpk.pc $(if $(HAVE_CUDA),$(B)/tpk-cuda.pc)
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig
	for h in $(HEADERS); do install -D -m 644 $$h $(DESTDIR)$(PREFIX)/$$h || exit 1; done
	install -m 644 $(LIBS) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(B)/tpk.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/tpk.pc
	$(if $(HAVE_CUDA),install -m 644 $(B)/tpk-cuda.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/tpk-cuda.pc)
	install -d $(DESTDIR)$(PREFIX)/lib/cmake/tpk
	sed -e 's|@TPK_VERSION@|$(TPK_VERSION)|g' -e 's|@BLAS_NAMES@|$(patsubst -l%,%,$(filter -l%,$(BLAS_LIBS)))|g' \
	  -e 's|@BLAS_LIBDIRS@|$(patsubst -L%,%,$(filter -L%,$(BLAS_LIBS)))|g' -e 's|@CUDA_LIBS@|$(if $(HAVE_CUDA),$(CUDA_LIBS))|g' \
	  cmake/tpkConfig.cmake.in > $(DESTDIR)$(PREFIX)/lib/cmake/tpk/tpkConfig.cmake
	sed -e 's|@TPK_VERSION@|$(TPK_VERSION)|g' cmake/tpkConfigVersion.cmake.in > $(DESTDIR)$(PREFIX)/lib/cmake/tpk/tpkConfigVersion.cmake

clean:
	rm -rf build
