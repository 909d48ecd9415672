// oxccl.cu — owns the kernel entry `ox_kernel(items, nitems)`: every CTA runs, in order, the
// work items whose `cta` is its blockIdx.x, opening and closing the item's connections
// (persistent positions) around the algorithm of collectives.cuh.
#include "collectives.cuh"

__device__ __forceinline__ void ox_run(const OxWork* __restrict__ items, uint32_t nitems) {
  __shared__ OxShared s;
  // Which items are this CTA's: the items live in host-mapped memory, so read every item's
  // `cta` field in parallel (one bus round trip) rather than one after another.
  __shared__ uint8_t mine[OX_MAX_ITEMS];
  if (threadIdx.x == 0) s.aborted = 0;
  for (uint32_t i = threadIdx.x; i < nitems && i < OX_MAX_ITEMS; i += blockDim.x) {
    mine[i] = items[i].cta == blockIdx.x;
  }
  __syncthreads();
  for (uint32_t i = 0; i < nitems && i < OX_MAX_ITEMS; i++) {
    if (!mine[i]) continue;
    __syncthreads();  // every thread is done with the previous item's shared state
    if (threadIdx.x < sizeof(OxWork) / 8) {
      ((uint64_t*)&s.w)[threadIdx.x] = ((const uint64_t*)&items[i])[threadIdx.x];
    }
    __syncthreads();
    if (s.w.kind == OX_KIND_DIRECT_ALLREDUCE) {
      // The one-shot all-reduce opens and closes its own connections, its DIRECT_PEER items'
      // too (they follow it on this CTA), and those items are then done.
      const int npeers = s.w.nranks - 1;
      if (!ox_direct_item(s, items, i, nitems)) return;
      i += npeers - 1;
      continue;
    }
    if (threadIdx.x == 0) {
      ox_peer_open(s.send, s.w.send);
      ox_peer_open(s.recv, s.w.recv);
    }
    __syncthreads();
    bool ok = true;
    switch (s.w.kind) {
      case OX_KIND_DIRECT_PEER: break;  // consumed by the DIRECT_ALLREDUCE item before it
      case OX_KIND_COPY: ox_local_copy(s); break;
      case OX_KIND_RING_ALLREDUCE: ok = ox_ring_allreduce(s); break;
      case OX_KIND_RING_ALLGATHER: ok = ox_ring_allgather(s); break;
      case OX_KIND_RING_REDUCESCATTER: ok = ox_ring_reducescatter(s); break;
      case OX_KIND_RING_BROADCAST: ok = ox_ring_broadcast(s); break;
      case OX_KIND_RING_REDUCE: ok = ox_ring_reduce(s); break;
      case OX_KIND_SEND: ok = ox_p2p(s, true); break;
      case OX_KIND_RECV: ok = ox_p2p(s, false); break;
      default: break;
    }
    if (!ok) return;  // aborted: the communicator is unusable, positions are not saved
    __syncthreads();
    if (threadIdx.x == 0) {
      ox_peer_close(s.send);
      ox_peer_close(s.recv);
    }
  }
}

// Items in device-visible memory (host-mapped): any number up to OX_MAX_ITEMS.
extern "C" __global__ void __launch_bounds__(OX_MAX_THREADS, 1)
ox_kernel(const OxWork* __restrict__ items, uint32_t nitems) {
  ox_run(items, nitems);
}

// Items passed by value in the launch itself (small groups): no bus round trip to fetch them,
// and a captured graph keeps its own copy.
extern "C" __global__ void __launch_bounds__(OX_MAX_THREADS, 1)
ox_kernel_inline(const __grid_constant__ OxInline args) {
  ox_run(args.items, args.nitems);
}
