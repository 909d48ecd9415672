// oxccl.cu — owns the kernel entries: every CTA runs, in order, the work items whose `cta` is
// its blockIdx.x, opening and closing the item's connections (persistent positions) around
// the algorithm of collectives.cuh. `ox_kernel(items, nitems)` takes the items in
// device-visible (host-mapped) memory, sorted by CTA and followed by a table of each CTA's
// first item; `ox_kernel_inline` takes up to OX_INLINE_ITEMS items by value.
#include "collectives.cuh"

// Runs items[i] (with the Peer items after it when its fan is more than one), passing over
// its first `skip` steps (done by an earlier kernel of a yielding launch); returns how many
// items it consumed, 0 if the communicator was aborted or the CTA parked (s.parked: the
// positions are saved, s.done_steps says how far the item got).
template <bool Y>
__device__ __forceinline__ uint32_t ox_run_item(OxShared& s, const OxWork* __restrict__ items,
                                                uint32_t i, uint32_t nitems, uint32_t skip = 0) {
  __syncthreads();  // every thread is done with the previous item's shared state
  if (threadIdx.x < sizeof(OxWork) / 8) {
    ((uint64_t*)&s.w)[threadIdx.x] = ((const uint64_t*)&items[i])[threadIdx.x];
  }
  if (threadIdx.x == 0) {
    s.item = i;
    s.skip = skip;
    s.done_steps = 0;
  }
  __syncthreads();
  const int used = ox_open(s, items, i, nitems);
  if (used == 0) return 0;
  bool ok = true;
  switch (s.w.kind) {
    case OX_KIND_PEER: break;  // consumed by the item before it
    case OX_KIND_COPY: ox_local_copy(s); break;
    case OX_KIND_RING_ALL_REDUCE: ok = ox_ring_allreduce<Y>(s); break;
    case OX_KIND_RING_ALL_GATHER: ok = ox_ring_allgather<Y>(s); break;
    case OX_KIND_RING_REDUCE_SCATTER: ok = ox_ring_reducescatter<Y>(s); break;
    case OX_KIND_RING_BROADCAST: ok = ox_ring_broadcast<Y>(s); break;
    case OX_KIND_RING_REDUCE: ok = ox_ring_reduce<Y>(s); break;
    case OX_KIND_SEND: ok = ox_p2p<Y>(s, true); break;
    case OX_KIND_RECV: ok = ox_p2p<Y>(s, false); break;
    case OX_KIND_DIRECT_ALL_REDUCE: ok = ox_direct_allreduce<Y>(s); break;
    default: break;
  }
  if (!ok) {
    // Parked: the positions of the steps done are kept for the next kernel. Aborted: the
    // communicator is unusable, positions are not saved.
    if (Y && s.parked && !s.aborted) ox_close(s);
    return 0;
  }
  ox_close(s);
  return used;
}

// Every kernel entry's shared state before its first item.
__device__ __forceinline__ void ox_shared_init(OxShared& s, uint32_t park_ns) {
  s.aborted = 0;
  s.parked = 0;
  s.park_ns = park_ns;
  s.skip = 0;
  s.done_steps = 0;
  ox_wait_told = 0;
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
  if (threadIdx.x == 0) ox_shared_init(s, 0);
  __syncthreads();
  const uint32_t hi = range[1] < nitems ? range[1] : nitems;
  for (uint32_t i = range[0]; i < hi;) {
    const uint32_t used = ox_run_item<false>(s, items, i, nitems);
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
  if (threadIdx.x == 0) ox_shared_init(s, 0);
  if (threadIdx.x < nitems) mine[threadIdx.x] = args.items[threadIdx.x].cta == blockIdx.x;
  __syncthreads();
  for (uint32_t i = 0; i < nitems; i++) {
    if (!mine[i]) continue;
    const uint32_t used = ox_run_item<false>(s, args.items, i, nitems);
    if (used == 0) break;
    i += used - 1;
  }
  ox_wait_clear(s);
}

// A yielding launch (a communicator with ranks of other processes on this GPU, reached over
// the network): kernels of `mode` OX_YIELD_FRESH, then OX_YIELD_RESUME ..., then
// OX_YIELD_LAST on one stream, each after a stream wait for the status page's bell. Items as
// ox_kernel's, then (8-aligned) one resume record per CTA (OX_RESUME_DONE_ITEM). A CTA whose
// parkable wait lasts park_ns parks: it saves its positions and records where it stopped,
// and the kernel ends, so the GPU can run the other processes' kernels meanwhile; the next
// kernel goes on from there. The last kernel never parks.
extern "C" __global__ void __launch_bounds__(OX_MAX_THREADS, 1)
ox_kernel_yield(const OxWork* __restrict__ items, uint32_t nitems, uint32_t mode, uint32_t park_ns) {
  __shared__ OxShared s;
  __shared__ uint32_t range[2];
  const uint32_t* first = (const uint32_t*)(items + nitems);
  uint64_t* records = (uint64_t*)(((uintptr_t)(first + gridDim.x + 1) + 7) & ~(uintptr_t)7);
  if (threadIdx.x < 2) range[threadIdx.x] = first[blockIdx.x + threadIdx.x];
  if (threadIdx.x == 0) {
    ox_shared_init(s, mode == OX_YIELD_LAST ? 0u : park_ns);
    // A resumed CTA may have left a wait entry when it parked: clear it when it ends.
    ox_wait_told = mode != OX_YIELD_FRESH;
  }
  __syncthreads();
  const uint32_t hi = range[1] < nitems ? range[1] : nitems;
  // This CTA's park entry is about to be stale: it runs (the proxy must not ring for it).
  if (threadIdx.x == 0 && range[0] < hi && blockIdx.x < OX_PROGRESS_CTAS && items[range[0]].abort_flag)
    ox_st_relaxed(ox_park_slot(items[range[0]].abort_flag), 0);
  uint32_t start = range[0], skip = 0;
  if (mode != OX_YIELD_FRESH) {
    const uint64_t rec = *(volatile uint64_t*)&records[blockIdx.x];
    if ((uint32_t)rec == OX_RESUME_DONE_ITEM) return;
    start = (uint32_t)rec;
    skip = (uint32_t)(rec >> 32);
  }
  uint32_t i = start;
  while (i < hi) {
    const uint32_t used = ox_run_item<true>(s, items, i, nitems, i == start ? skip : 0u);
    if (used == 0) break;
    i += used;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool parked = s.parked && !s.aborted;
    records[blockIdx.x] = parked ? (((uint64_t)s.done_steps << 32) | i) : (uint64_t)OX_RESUME_DONE_ITEM;
  }
  // A parked CTA keeps its wait entry (what it waits for, for the watchdog).
  if (!s.parked) ox_wait_clear(s);
}

// A copy with no work items: `bytes` from src to dst (distinct buffers), for the collectives
// of a one-rank communicator and its sends to itself. Each CTA copies one contiguous part (a
// multiple of 16 bytes, so every part keeps the buffers' alignment); each thread issues all
// of a round's loads before its stores. The source is the caller's buffer, which nothing
// writes while the kernel runs, so loads may take the read-only path.
extern "C" __global__ void __launch_bounds__(OX_MAX_THREADS)
ox_copy_kernel(char* __restrict__ dst, const char* __restrict__ src, uint64_t bytes) {
  const uint64_t part = ((bytes + gridDim.x - 1) / gridDim.x + 15) & ~(uint64_t)15;
  const uint64_t lo = part * blockIdx.x < bytes ? part * blockIdx.x : bytes;
  const uint64_t hi = lo + part < bytes ? lo + part : bytes;
  if ((((uintptr_t)dst | (uintptr_t)src) & 15) != 0) {
    ox_copy(dst + lo, nullptr, src + lo, hi - lo);
    return;
  }
  const uint4* __restrict__ s = (const uint4*)(src + lo);
  uint4* __restrict__ d = (uint4*)(dst + lo);
  const uint64_t n = (hi - lo) / 16, step = blockDim.x;
  for (uint64_t base = threadIdx.x; base < n; base += OX_UNROLL * step) {
    uint4 v[OX_UNROLL];
#pragma unroll
    for (int u = 0; u < OX_UNROLL; u++) {
      if (base + u * step < n) v[u] = __ldg(s + base + u * step);
    }
#pragma unroll
    for (int u = 0; u < OX_UNROLL; u++) {
      if (base + u * step < n) d[base + u * step] = v[u];
    }
  }
  // The bytes past the last whole 16 (only the last part has any).
  for (uint64_t i = lo + n * 16 + threadIdx.x; i < hi; i += step) dst[i] = src[i];
}
