/* The CUDA driver as the stand-in tests call it themselves: the entry points they use, looked
 * up in libcuda.so.1 as the library under test will find it (the stand-in of cuda_standin.c
 * when its directory comes first on LD_LIBRARY_PATH), and the stand-in's call counters, which
 * a real driver lacks (then NULL). A missing entry point prints a FAIL line and exits 1. */
#ifndef OXCCL_STANDIN_DRIVER_H
#define OXCCL_STANDIN_DRIVER_H

#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* The driver calls the tests make themselves, and the stand-in's counters (optional). */
static struct {
  CUresult (*init)(unsigned);
  CUresult (*primaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*primaryCtxReset)(CUdevice);
  CUresult (*ctxSetCurrent)(CUcontext);
  CUresult (*streamCreate)(CUstream *, unsigned);
  CUresult (*streamSynchronize)(CUstream);
  CUresult (*streamDestroy)(CUstream);
  CUresult (*memAlloc)(CUdeviceptr *, size_t);
  CUresult (*memFree)(CUdeviceptr);
  CUresult (*memcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*memcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*memsetD8)(CUdeviceptr, unsigned char, size_t);
  unsigned long (*calls)(const char *);
  void (*reset)(void);
  const char *(*name)(unsigned long);
} cu;

static void *need(void *lib, const char *name) {
  void *f = dlsym(lib, name);
  if (f == NULL) {
    printf("FAIL the CUDA driver has no %s\n", name);
    exit(1);
  }
  return f;
}

static void loadDriver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) {
    printf("FAIL dlopen libcuda.so.1: %s\n", dlerror());
    exit(1);
  }
  *(void **)&cu.init = need(lib, "cuInit");
  *(void **)&cu.primaryCtxRetain = need(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&cu.primaryCtxReset = need(lib, "cuDevicePrimaryCtxReset_v2");
  *(void **)&cu.ctxSetCurrent = need(lib, "cuCtxSetCurrent");
  *(void **)&cu.streamCreate = need(lib, "cuStreamCreate");
  *(void **)&cu.streamSynchronize = need(lib, "cuStreamSynchronize");
  *(void **)&cu.streamDestroy = need(lib, "cuStreamDestroy_v2");
  *(void **)&cu.memAlloc = need(lib, "cuMemAlloc_v2");
  *(void **)&cu.memFree = need(lib, "cuMemFree_v2");
  *(void **)&cu.memcpyHtoD = need(lib, "cuMemcpyHtoD_v2");
  *(void **)&cu.memcpyDtoH = need(lib, "cuMemcpyDtoH_v2");
  *(void **)&cu.memsetD8 = need(lib, "cuMemsetD8_v2");
  *(void **)&cu.calls = dlsym(lib, "cuda_standin_calls");
  *(void **)&cu.reset = dlsym(lib, "cuda_standin_reset");
  *(void **)&cu.name = dlsym(lib, "cuda_standin_name");
}

#endif
