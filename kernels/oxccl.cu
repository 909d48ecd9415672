// oxccl.cu — owns the kernel entries: every CTA runs, in order, the work items whose `cta` is
// its blockIdx.x, opening and closing the item's connections (persistent positions) around
// the algorithm of collectives.cuh. `ox_kernel(items, nitems)` takes the items in
// device-visible (host-mapped) memory, sorted by CTA and followed by a table of each CTA's
// first item; `ox_kernel_inline` takes up to OX_INLINE_ITEMS items by value.
#include "collectives.cuh"

// Runs items[i] (with the Peer items after it when its fan is more than one); returns how
// many items it consumed, 0 if the communicator was aborted.
__device__ __forceinline__ uint32_t ox_run_item(OxShared& s, const OxWork* __restrict__ items,
                                                uint32_t i, uint32_t nitems) {
  __syncthreads();  // every thread is done with the previous item's shared state
  if (threadIdx.x < sizeof(OxWork) / 8) {
    ((uint64_t*)&s.w)[threadIdx.x] = ((const uint64_t*)&items[i])[threadIdx.x];
  }
  if (threadIdx.x == 0) s.item = i;
  __syncthreads();
  const int used = ox_open(s, items, i, nitems);
  if (used == 0) return 0;
  bool ok = true;
  switch (s.w.kind) {
    case OX_KIND_PEER: break;  // consumed by the item before it
    case OX_KIND_COPY: ox_local_copy(s); break;
    case OX_KIND_RING_ALL_REDUCE: ok = ox_ring_allreduce(s); break;
    case OX_KIND_RING_ALL_GATHER: ok = ox_ring_allgather(s); break;
    case OX_KIND_RING_REDUCE_SCATTER: ok = ox_ring_reducescatter(s); break;
    case OX_KIND_RING_BROADCAST: ok = ox_ring_broadcast(s); break;
    case OX_KIND_RING_REDUCE: ok = ox_ring_reduce(s); break;
    case OX_KIND_SEND: ok = ox_p2p(s, true); break;
    case OX_KIND_RECV: ok = ox_p2p(s, false); break;
    case OX_KIND_DIRECT_ALL_REDUCE: ok = ox_direct_allreduce(s); break;
    default: break;
  }
  if (!ok) return 0;  // aborted: the communicator is unusable, positions are not saved
  ox_close(s);
  return used;
}

// Items in device-visible (host-mapped) memory, sorted by CTA, followed by nitems' worth of
// items' end: uint32 first[gridDim.x + 1], CTA b's items being [first[b], first[b+1]). Each
// CTA reads only its own items: no scan of every item over the bus.
extern "C" __global__ void __launch_bounds__(OX_MAX_THREADS, 1)
ox_kernel(const OxWork* __restrict__ items, uint32_t nitems) {
  __shared__ OxShared s;
  __shared__ uint32_t range[2];
  if (threadIdx.x < 2) {
    const uint32_t* first = (const uint32_t*)(items + nitems);
    range[threadIdx.x] = first[blockIdx.x + threadIdx.x];
  }
  if (threadIdx.x == 0) {
    s.aborted = 0;
    ox_wait_told = 0;
  }
  __syncthreads();
  const uint32_t hi = range[1] < nitems ? range[1] : nitems;
  for (uint32_t i = range[0]; i < hi;) {
    const uint32_t used = ox_run_item(s, items, i, nitems);
    if (used == 0) break;
    i += used;
  }
  ox_wait_clear(s);
}

// Items passed by value in the launch itself (small groups): no bus round trip to fetch them,
// and a captured graph keeps its own copy. Which items are this CTA's is found by a parallel
// scan of their `cta` fields (parameter memory is fast).
extern "C" __global__ void __launch_bounds__(OX_MAX_THREADS, 1)
ox_kernel_inline(const __grid_constant__ OxInline args) {
  __shared__ OxShared s;
  __shared__ uint8_t mine[OX_INLINE_ITEMS];
  const uint32_t nitems = args.nitems < OX_INLINE_ITEMS ? args.nitems : OX_INLINE_ITEMS;
  if (threadIdx.x == 0) {
    s.aborted = 0;
    ox_wait_told = 0;
  }
  if (threadIdx.x < nitems) mine[threadIdx.x] = args.items[threadIdx.x].cta == blockIdx.x;
  __syncthreads();
  for (uint32_t i = 0; i < nitems; i++) {
    if (!mine[i]) continue;
    const uint32_t used = ox_run_item(s, args.items, i, nitems);
    if (used == 0) break;
    i += used - 1;
  }
  ox_wait_clear(s);
}
