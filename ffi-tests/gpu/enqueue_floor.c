/* enqueue_floor.c: what the CUDA driver itself charges per stream operation on GPU 0, the floor
 * under any NCCL library's per-call cost. No NCCL is involved.
 *
 * For each way of putting one small device-to-device copy (or nothing) on a stream it issues N
 * operations back to back on one stream after a warm-up and prints one FLOOR line:
 *   FLOOR <what> <bytes> host=<µs per op> stream=<µs per op>
 * host is the time inside the driver calls, stream the time from the first call to the end of
 * the last operation divided by N (what a caller's stream sees when the host is the
 * bottleneck). Kernels are PTX in this file, compiled by the driver at run time, so the program
 * needs no nvcc. Ways: cuMemcpyDtoDAsync; a copy kernel with three 8-byte parameters; an empty
 * kernel; an empty kernel with a 64-byte and a 4 KiB parameter, and with a 4 KiB parameter of
 * which only 192 bytes are passed (CU_LAUNCH_PARAM_BUFFER_SIZE below the parameter's size; a
 * REFUSED line when the driver says no); a kernel that uses local memory (a stack); the copy
 * kernel followed by a cuEventRecord; cuMemcpyAsync (what cudaMemcpyAsync calls);
 * cuStreamWriteValue32; cuEventRecord alone; each copy kernel also with a cuCtxSetCurrent of
 * the current context before every launch (as a library that cannot know the caller's context
 * does). With -k FATBIN (oxccl's kernels, as built), also
 * oxccl's `ox_copy_kernel` at 512 and at 256 threads per CTA, on the CTAs oxccl gives a copy of
 * that size (one per 16 KiB), alone, after a cuCtxSetCurrent, and after a cuCtxGetCurrent that
 * finds the context current, to tell the launch of oxccl's kernel from the driver's floor.
 *
 * usage: enqueue_floor [-n N] [-s LIST] [-k FATBIN]   (default N 5000, sizes 8,32768,524288) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;
typedef unsigned long long CUdeviceptr;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(CUdevice *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuCtxGetCurrent)(CUcontext *);
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuStreamCreate)(CUstream *, unsigned);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
static CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
static CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void **, void **);
static CUresult (*cuEventCreate)(CUevent *, unsigned);
static CUresult (*cuEventRecord)(CUevent, CUstream);
static CUresult (*cuStreamWriteValue32)(CUstream, CUdeviceptr, uint32_t, unsigned);

static const char ptx[] =
    ".version 7.8\n.target sm_90\n.address_size 64\n"
    ".visible .entry empty_k() { ret; }\n"
    ".visible .entry blob_k(.param .align 8 .b8 blob[4096]) { ret; }\n"
    ".visible .entry local_k(.param .u32 i)\n{\n"
    "  .local .align 8 .b8 stack[512];\n  .reg .b32 %r<4>;\n  .reg .b64 %rd<4>;\n"
    "  ld.param.u32 %r1, [i];\n  and.b32 %r1, %r1, 127;\n  mul.wide.u32 %rd1, %r1, 4;\n"
    "  mov.u64 %rd2, stack;\n  add.s64 %rd3, %rd2, %rd1;\n  st.local.u32 [%rd3], %r1;\n"
    "  ld.local.u32 %r2, [%rd3];\n  ret;\n}\n"
    ".visible .entry copy_k(.param .u64 dst, .param .u64 src, .param .u64 nwords)\n{\n"
    "  .reg .pred %p<2>;\n  .reg .b32 %r<8>;\n  .reg .b64 %rd<10>;\n"
    "  ld.param.u64 %rd1, [dst];\n  ld.param.u64 %rd2, [src];\n  ld.param.u64 %rd3, [nwords];\n"
    "  mov.u32 %r1, %ctaid.x;\n  mov.u32 %r2, %ntid.x;\n  mov.u32 %r3, %tid.x;\n"
    "  mov.u32 %r4, %nctaid.x;\n  mad.lo.u32 %r5, %r1, %r2, %r3;\n  cvt.u64.u32 %rd4, %r5;\n"
    "  mul.lo.u32 %r6, %r4, %r2;\n  cvt.u64.u32 %rd5, %r6;\n"
    "LOOP:\n  setp.ge.u64 %p1, %rd4, %rd3;\n  @%p1 bra DONE;\n  shl.b64 %rd6, %rd4, 2;\n"
    "  add.s64 %rd7, %rd2, %rd6;\n  ld.global.u32 %r7, [%rd7];\n  add.s64 %rd8, %rd1, %rd6;\n"
    "  st.global.u32 [%rd8], %r7;\n  add.s64 %rd4, %rd4, %rd5;\n  bra LOOP;\nDONE:\n  ret;\n}\n";

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

#define CU(x)                                                         \
  do {                                                                \
    CUresult r_ = (x);                                                \
    if (r_ != 0) {                                                    \
      printf("FAIL %s: CUresult %d (line %d)\n", #x, r_, __LINE__);   \
      exit(1);                                                        \
    }                                                                 \
  } while (0)

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) {
    printf("FAIL dlsym %s\n", name);
    exit(1);
  }
  return p;
}

static void load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) {
    printf("FAIL dlopen libcuda.so.1: %s\n", dlerror());
    exit(1);
  }
  *(void **)&cuInit = sym(lib, "cuInit");
  *(void **)&cuDeviceGet = sym(lib, "cuDeviceGet");
  *(void **)&cuDevicePrimaryCtxRetain = sym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&cuCtxSetCurrent = sym(lib, "cuCtxSetCurrent");
  *(void **)&cuCtxGetCurrent = sym(lib, "cuCtxGetCurrent");
  *(void **)&cuModuleLoadData = sym(lib, "cuModuleLoadData");
  *(void **)&cuModuleGetFunction = sym(lib, "cuModuleGetFunction");
  *(void **)&cuStreamCreate = sym(lib, "cuStreamCreate");
  *(void **)&cuStreamSynchronize = sym(lib, "cuStreamSynchronize");
  *(void **)&cuMemAlloc = sym(lib, "cuMemAlloc_v2");
  *(void **)&cuMemsetD8 = sym(lib, "cuMemsetD8_v2");
  *(void **)&cuMemcpyDtoDAsync = sym(lib, "cuMemcpyDtoDAsync_v2");
  *(void **)&cuMemcpyAsync = sym(lib, "cuMemcpyAsync");
  *(void **)&cuLaunchKernel = sym(lib, "cuLaunchKernel");
  *(void **)&cuEventCreate = sym(lib, "cuEventCreate");
  *(void **)&cuEventRecord = sym(lib, "cuEventRecord");
  *(void **)&cuStreamWriteValue32 = sym(lib, "cuStreamWriteValue32_v2");
}

enum way {
  MEMCPY, COPY_KERNEL, EMPTY, BLOB64, BLOB4K, BLOB_SHORT, LOCAL, COPY_EVENT, WRITE_VALUE, EVENT,
  COPY_CTX, OX_COPY_512, OX_COPY_256, OX_COPY_512_CTX, OX_COPY_512_GET, MEMCPY_UNIFIED, NWAYS
};
static const char *names[NWAYS] = {"cuMemcpyDtoDAsync",       "copy_kernel",
                                   "empty_kernel",            "empty_kernel_64B_param",
                                   "empty_kernel_4KiB_param", "4KiB_param_192B_passed",
                                   "kernel_with_local_memory", "copy_kernel+cuEventRecord",
                                   "cuStreamWriteValue32",    "cuEventRecord",
                                   "cuCtxSetCurrent+copy_kernel", "ox_copy_kernel_512",
                                   "ox_copy_kernel_256",      "cuCtxSetCurrent+ox_copy_kernel_512",
                                   "cuCtxGetCurrent+ox_copy_kernel_512", "cuMemcpyAsync"};

static CUstream stream;
static CUcontext ctx;
static CUfunction copy_k, empty_k, blob_k, local_k, ox_copy_k;
static CUevent ev;
static CUdeviceptr src, dst, flag;
static unsigned char blob[4096];

static void one(enum way w, size_t bytes) {
  unsigned long long nwords = bytes / 4;
  unsigned grid = (unsigned)((nwords + 255) / 256);
  if (grid < 1) grid = 1;
  if (grid > 528) grid = 528;
  void *args[] = {&dst, &src, &nwords};
  unsigned long long nbytes = bytes;
  unsigned ox_grid = (unsigned)((bytes + 16383) / 16384);
  if (ox_grid < 1) ox_grid = 1;
  if (ox_grid > 1024) ox_grid = 1024;
  void *ox_args[] = {&dst, &src, &nbytes};
  switch (w) {
    case COPY_CTX:
      CU(cuCtxSetCurrent(ctx));
      CU(cuLaunchKernel(copy_k, grid, 1, 1, 256, 1, 1, 0, stream, args, NULL));
      break;
    case OX_COPY_512_CTX:
      CU(cuCtxSetCurrent(ctx));
      /* fall through */
    case OX_COPY_512_GET:
      if (w == OX_COPY_512_GET) {
        CUcontext cur = NULL;
        CU(cuCtxGetCurrent(&cur));
        if (cur != ctx) CU(cuCtxSetCurrent(ctx));
      }
      /* fall through */
    case OX_COPY_512:
    case OX_COPY_256:
      CU(cuLaunchKernel(ox_copy_k, ox_grid, 1, 1, w == OX_COPY_256 ? 256 : 512, 1, 1, 0, stream,
                        ox_args, NULL));
      break;
    case MEMCPY:
      CU(cuMemcpyDtoDAsync(dst, src, bytes, stream));
      break;
    case MEMCPY_UNIFIED:
      CU(cuMemcpyAsync(dst, src, bytes, stream));
      break;
    case COPY_EVENT:
    case COPY_KERNEL:
      CU(cuLaunchKernel(copy_k, grid, 1, 1, 256, 1, 1, 0, stream, args, NULL));
      if (w == COPY_EVENT) CU(cuEventRecord(ev, stream));
      break;
    case EMPTY:
      CU(cuLaunchKernel(empty_k, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
      break;
    case LOCAL: {
      unsigned i = (unsigned)bytes;
      void *largs[] = {&i};
      CU(cuLaunchKernel(local_k, 1, 1, 1, 32, 1, 1, 0, stream, largs, NULL));
      break;
    }
    case BLOB64:
    case BLOB_SHORT:
    case BLOB4K: {
      size_t size = w == BLOB64 ? 64 : w == BLOB_SHORT ? 192 : sizeof blob;
      void *extra[] = {(void *)1, blob, (void *)2, &size, NULL};
      CU(cuLaunchKernel(blob_k, 1, 1, 1, 32, 1, 1, 0, stream, NULL, extra));
      break;
    }
    case WRITE_VALUE:
      CU(cuStreamWriteValue32(stream, flag, 1, 0));
      break;
    case EVENT:
      CU(cuEventRecord(ev, stream));
      break;
    default:
      break;
  }
}

static void measure(enum way w, size_t bytes, int iters) {
  for (int i = 0; i < 50; i++) one(w, bytes);
  CU(cuStreamSynchronize(stream));
  double t0 = now_us();
  for (int i = 0; i < iters; i++) one(w, bytes);
  double t1 = now_us();
  CU(cuStreamSynchronize(stream));
  double t2 = now_us();
  printf("FLOOR %s %zu host=%.2f stream=%.2f\n", names[w], bytes, (t1 - t0) / iters,
         (t2 - t0) / iters);
  fflush(stdout);
}

/* The whole of file `path`, or exits. */
static void *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    printf("FAIL open %s\n", path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *buf = malloc((size_t)n);
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    printf("FAIL read %s\n", path);
    exit(1);
  }
  fclose(f);
  return buf;
}

int main(int argc, char **argv) {
  int iters = 5000;
  const char *sizes = "8,32768,524288";
  const char *fatbin = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-s")) sizes = argv[i + 1];
    else if (!strcmp(argv[i], "-k")) fatbin = argv[i + 1];
  }
  load_driver();
  CUdevice dev;
  CUmodule mod;
  CU(cuInit(0));
  CU(cuDeviceGet(&dev, 0));
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  CU(cuModuleLoadData(&mod, ptx));
  CU(cuModuleGetFunction(&copy_k, mod, "copy_k"));
  CU(cuModuleGetFunction(&empty_k, mod, "empty_k"));
  CU(cuModuleGetFunction(&blob_k, mod, "blob_k"));
  CU(cuModuleGetFunction(&local_k, mod, "local_k"));
  if (fatbin) {
    CUmodule ox_mod;
    CU(cuModuleLoadData(&ox_mod, read_file(fatbin)));
    CU(cuModuleGetFunction(&ox_copy_k, ox_mod, "ox_copy_kernel"));
  }
  CU(cuStreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */));
  CU(cuEventCreate(&ev, 2 /* CU_EVENT_DISABLE_TIMING */));
  size_t most = 0;
  char *list = strdup(sizes);
  for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
    size_t b = strtoull(t, NULL, 10);
    if (b > most) most = b;
  }
  CU(cuMemAlloc(&src, most + 4));
  CU(cuMemAlloc(&dst, most + 4));
  CU(cuMemAlloc(&flag, 4));
  CU(cuMemsetD8(src, 7, most + 4));
  /* Twice over, to see how much one process's numbers move between rounds. */
  for (int round = 0; round < 2; round++) {
    strcpy(list, sizes);
    for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
      size_t b = strtoull(t, NULL, 10);
      measure(MEMCPY, b, iters);
      measure(MEMCPY_UNIFIED, b, iters);
      measure(COPY_KERNEL, b, iters);
      measure(COPY_EVENT, b, iters);
      measure(COPY_CTX, b, iters);
      if (fatbin) {
        measure(OX_COPY_512, b, iters);
        measure(OX_COPY_256, b, iters);
        measure(OX_COPY_512_CTX, b, iters);
        measure(OX_COPY_512_GET, b, iters);
      }
    }
    measure(EMPTY, 0, iters);
    measure(BLOB64, 0, iters);
    measure(BLOB4K, 0, iters);
    {
      size_t size = 192;
      void *extra[] = {(void *)1, blob, (void *)2, &size, NULL};
      CUresult r = cuLaunchKernel(blob_k, 1, 1, 1, 32, 1, 1, 0, stream, NULL, extra);
      if (r == 0) measure(BLOB_SHORT, 0, iters);
      else printf("REFUSED %s: CUresult %d\n", names[BLOB_SHORT], r);
    }
    measure(LOCAL, 0, iters);
    measure(WRITE_VALUE, 0, iters);
    measure(EVENT, 0, iters);
  }
  free(list);
  printf("PASS enqueue_floor\n");
  return 0;
}
