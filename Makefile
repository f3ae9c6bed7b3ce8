# tpk — build, test, install.
#   make            build/libtpk_host.a (+ build/libtpk_cuda.a when nvcc is found)
#   make test       install missing Debian packages (as root), build, run the whole suite
#   make test-gpu   the CUDA checks (skipped, exit 0, where no GPU is present)
#   make bench      the host benchmarks (bench/)
#   make install PREFIX=/usr/local
#   make clean

PREFIX   ?= /usr/local
CC       ?= cc
MPICC    ?= mpicc
NVCC     ?= $(shell command -v nvcc 2>/dev/null)
CFLAGS   ?= -O2
WARN      = -std=c11 -Wall -Wextra -Werror
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
CPPFLAGS += -Iinclude

HOST_SRC  = $(wildcard kernels/host/*.c)
HOST_OBJ  = $(HOST_SRC:kernels/host/%.c=build/host/%.o)
CUDA_SRC  = $(wildcard kernels/cuda/*.cu)
CUDA_OBJ  = $(CUDA_SRC:kernels/cuda/%.cu=build/cuda/%.o)
NVCCFLAGS ?= -O3 -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -Xcompiler -Wall,-Wextra,-Werror -Iinclude
TESTS     = $(patsubst tests/%.c,build/tests/%,$(wildcard tests/test_*.c))
HEADERS   = $(wildcard include/tpk/*.h)

LIBS = build/libtpk_host.a
ifneq ($(NVCC),)
LIBS += build/libtpk_cuda.a
endif

.PHONY: all deps test test-gpu bench install clean build/tpk.pc
all: $(LIBS)

build/host/%.o: kernels/host/%.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) $(BLAS_CFLAGS) -c $< -o $@

build/libtpk_host.a: $(HOST_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

build/cuda/%.o: kernels/cuda/%.cu $(HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# The CUDA archive: the CUDA kernels (empty until they exist).
build/libtpk_cuda.a: $(CUDA_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

build/tests/%: tests/%.c tests/test.h $(HEADERS) build/libtpk_host.a
	@mkdir -p $(@D)
	$(MPICC) $(WARN) $(CFLAGS) $(CPPFLAGS) -Itests $< -o $@ build/libtpk_host.a $(BLAS_LIBS) -lm

# The README's C example, cut out of README.md so it cannot drift.
build/readme_example.c: README.md
	@mkdir -p $(@D)
	awk '/^```c readme-example/{f=1;next} /^```/{f=0} f' README.md > $@
	@test -s $@ || { echo "README.md has no \`\`\`c readme-example block"; exit 1; }
build/readme_example: build/readme_example.c $(HEADERS) build/libtpk_host.a
	$(MPICC) $(WARN) $(CFLAGS) $(CPPFLAGS) $< -o $@ build/libtpk_host.a $(BLAS_LIBS) -lm

build/bench/%: bench/%.c $(HEADERS) build/libtpk_host.a
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CFLAGS) $(CPPFLAGS) $< -o $@ build/libtpk_host.a $(BLAS_LIBS) -lm

# The host benchmarks (one thread; PyTorch alongside where Debian's python3-torch is installed).
bench: build/bench/host_block
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 build/bench/host_block

deps:
	@sh tools/deps.sh

test: deps
	@$(MAKE) --no-print-directory all $(TESTS) build/tests/torch_dump build/readme_example
	@sh tests/run.sh

test-gpu:
	@if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then \
	  echo "test-gpu: no GPU present: skipped"; exit 0; fi; \
	echo "test-gpu: the CUDA backend has no kernels yet: nothing to run"; exit 0

build/tpk.pc:
	@mkdir -p $(@D)
	printf 'prefix=%s\nincludedir=$${prefix}/include\nlibdir=$${prefix}/lib\n\nName: tpk\nDescription: header-only tensor-parallel transformer kit\nVersion: 0.1.0\nRequires.private: openblas\nCflags: -I$${includedir}\nLibs: -L$${libdir} -ltpk_host %s -lm\n' \
	  '$(PREFIX)' '$(BLAS_LIBS)' > $@

install: all build/tpk.pc
	install -d $(DESTDIR)$(PREFIX)/include/tpk $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 $(HEADERS) $(DESTDIR)$(PREFIX)/include/tpk/
	install -m 644 $(LIBS) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 build/tpk.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/tpk.pc

clean:
	rm -rf build
