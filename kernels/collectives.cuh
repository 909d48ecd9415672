// collectives.cuh — owns the algorithms: how one work item turns into a sequence of steps on
// its connections. Ring AllReduce (reduce-scatter then all-gather over n pieces per round),
// one-shot AllReduce (LL to and from every peer), ring AllGather and ReduceScatter, chain
// Broadcast (from root) and Reduce (to root), direct Send/Recv, and local copies, each step
// by the Simple or the LL protocol. Type-agnostic: the arithmetic is in ox_reduce_copy.
#pragma once
#include "prims.cuh"

// What one step does.
#define OX_S_SEND 1u    // fill the next send slot
#define OX_S_RECV 2u    // consume the next receive slot
#define OX_S_IN 4u      // first source is the user input (pre-transformed); else the recv slot
#define OX_S_OUT 8u     // write the result to the user output
#define OX_S_POST 16u   // apply the post-transform (the final value of a reduction)

// One LL step (OX_FLAG_LL items): the same positions as a Simple step, data in the slots' LL
// regions. The wait is only for a free send slot; the data words carry their own validity.
// On a receive peer that may park (FLAG_PARK_RECV, a network connection) it also waits for
// the receive tail, which the proxy advances after it has put the LL words in place: so it
// parks, if it must, before it moves anything, and a later kernel can do the step again.
// On a receive connection with its slots in GPU memory (FLAG_RECV_GPU) it waits for the tail
// too, and the words are at the slot's start, where the network put the message. On a send
// connection with its slots in GPU memory (FLAG_SEND_GPU) the words go to its host LL region.
template <bool Y>
__device__ __noinline__ bool ox_wait_recv_tail(OxShared& s) {
  return ox_wait<Y>(s, 0, 1);
}

template <bool Y>
__device__ bool ox_ll_step(OxShared& s, uint32_t what, const char* in, char* out, uint64_t nelem) {
  const int nsend = (what & OX_S_SEND) ? 1 : 0, nrecv = (what & OX_S_RECV) ? 1 : 0;
  const int wait_tail =
      (Y && nrecv && (s.w.flags & (OX_FLAG_PARK_RECV | OX_FLAG_RECV_GPU))) ? 1 : 0;
  // Also the barrier after which every thread sees the positions of the previous step.
  if (!ox_wait<Y>(s, nsend, wait_tail)) return false;
  // Outside yielding kernels a receive in GPU memory waits for its tail apart (out of line:
  // the common LL step keeps its registers).
  if (!Y && nrecv && (s.w.flags & OX_FLAG_RECV_GPU) && !ox_wait_recv_tail<Y>(s)) return false;
  const OxWork& w = s.w;
  const bool ops = w.flags & OX_FLAG_OPS;
  char* send_ll = nsend ? ox_send_ll(s.send[0], w.flags) : nullptr;
  // With FLAG_RECV_GPU the words are at the slot's start (LL region offset 0).
  const uint32_t recv_ll_off =
      (w.flags & OX_FLAG_RECV_GPU) ? 0u : ox_simple_bytes(s.recv[0].slot_bytes);
  const char* recv_ll = nrecv ? ox_slot(s.recv[0]) + recv_ll_off : nullptr;
  const bool pre = (what & OX_S_IN) && ops && ox_has_pre(w.dtype, w.op);
  const bool post = (what & OX_S_POST) && ops && ox_has_post(w.dtype, w.op);
  const uint64_t nbytes = nelem * ox_esize(w.dtype);
  ox_ll_move((what & OX_S_IN) ? in : nullptr, (what & OX_S_OUT) ? out : nullptr, send_ll, recv_ll,
             nbytes, (uint32_t)(s.send[0].step + 1), (uint32_t)(s.recv[0].step + 1), pre, post,
             w.dtype, w.op, w.flags, w.scalar, w.nranks, w.abort_flag, &s.aborted);
  return ox_post<Y>(s, nsend, nrecv, nbytes, true);
}

// One step with the item's one send and one receive peer: `in`/`out` already point at the
// step's elements; nelem may be 0 (the slot still moves, so both sides count the same
// slots). Returns false on abort.
template <bool Y>
__device__ bool ox_step(OxShared& s, uint32_t what, const char* in, char* out, uint64_t nelem) {
  if constexpr (Y) {
    if (s.skip) {
      ox_skip_step(s);
      return true;
    }
  }
  if (s.w.flags & OX_FLAG_LL) return ox_ll_step<Y>(s, what, in, out, nelem);
  const int nsend = (what & OX_S_SEND) ? 1 : 0, nrecv = (what & OX_S_RECV) ? 1 : 0;
  if (!ox_wait<Y>(s, nsend, nrecv)) return false;
  const OxWork& w = s.w;
  const bool ops = w.flags & OX_FLAG_OPS;
  char* send_slot = nsend ? ox_slot(s.send[0]) : nullptr;
  const char* recv_slot = nrecv ? ox_slot(s.recv[0]) : nullptr;
  OxRedArgs a;
  a.n = nelem;
  if (what & OX_S_IN) {
    a.src0 = in;
    a.src1 = recv_slot;
    a.pre = ops && ox_has_pre(w.dtype, w.op);
  } else {
    a.src0 = recv_slot;
    a.src1 = nullptr;
    a.pre = false;
  }
  a.post = (what & OX_S_POST) && ops && ox_has_post(w.dtype, w.op);
  if (what & OX_S_OUT) {
    a.dst0 = out;
    a.dst1 = send_slot;
  } else {
    a.dst0 = send_slot;
    a.dst1 = nullptr;
  }
  ox_reduce_copy(a, w.dtype, w.op, w.flags, w.scalar, w.nranks);
  return ox_post<Y>(s, nsend, nrecv, nelem * ox_esize(w.dtype), false);
}

__device__ __forceinline__ int ox_mod(int a, int n) { return ((a % n) + n) % n; }
__device__ __forceinline__ uint64_t ox_min(uint64_t a, uint64_t b) { return a < b ? a : b; }

// Ring AllReduce over elements [offset, offset+count): rounds of n pieces of <= chunk.
template <bool Y>
__device__ bool ox_ring_allreduce(OxShared& s) {
  const OxWork& w = s.w;
  const int n = w.nranks, r = w.rank;
  const uint64_t es = ox_esize(w.dtype);
  const uint64_t gran = 16 / es;
  const char* in = (const char*)w.src + w.offset * es;
  char* out = (char*)w.dst + w.offset * es;
  for (uint64_t base = 0; base < w.count; base += (uint64_t)n * w.chunk) {
    const uint64_t rem = ox_min(w.count - base, (uint64_t)n * w.chunk);
    uint64_t piece = (rem + n - 1) / n;
    piece = ox_min(w.chunk, (piece + gran - 1) / gran * gran);
    auto off = [&](int p) { return base + (uint64_t)p * piece; };
    auto len = [&](int p) {
      uint64_t o = (uint64_t)p * piece;
      return o >= rem ? (uint64_t)0 : ox_min(piece, rem - o);
    };
    int p = ox_mod(r - 1, n);
    if (!ox_step<Y>(s, OX_S_SEND | OX_S_IN, in + off(p) * es, nullptr, len(p))) return false;
    for (int st = 1; st < n - 1; st++) {
      p = ox_mod(r - 1 - st, n);
      if (!ox_step<Y>(s, OX_S_SEND | OX_S_RECV | OX_S_IN, in + off(p) * es, nullptr, len(p))) return false;
    }
    p = r;
    if (!ox_step<Y>(s, OX_S_SEND | OX_S_RECV | OX_S_IN | OX_S_OUT | OX_S_POST, in + off(p) * es,
                 out + off(p) * es, len(p)))
      return false;
    for (int t = 1; t < n - 1; t++) {
      p = ox_mod(r - t, n);
      if (!ox_step<Y>(s, OX_S_SEND | OX_S_RECV | OX_S_OUT, nullptr, out + off(p) * es, len(p))) return false;
    }
    p = ox_mod(r + 1, n);
    if (!ox_step<Y>(s, OX_S_RECV | OX_S_OUT, nullptr, out + off(p) * es, len(p))) return false;
  }
  return true;
}

// The rank whose block stands at ring position `pos`: on a ring not in rank order
// (OX_FLAG_RING_ORDER) the ring table's entry (the table at `offset`), else `pos` itself.
__device__ __forceinline__ int ox_block_rank(const OxWork& w, int pos) {
  return (w.flags & OX_FLAG_RING_ORDER) ? __ldg((const int*)w.offset + pos) : pos;
}

// Element offset of the item's range in `src` and `dst`: already added in when `offset`
// holds the ring table (OX_FLAG_RING_ORDER).
__device__ __forceinline__ uint64_t ox_range_offset(const OxWork& w) {
  return (w.flags & OX_FLAG_RING_ORDER) ? 0 : w.offset;
}

// Ring AllGather: every rank's block b lands at out + b*block; this item covers
// [offset, offset+count) of each block. This rank's own block is written by the first step
// only with OX_FLAG_OWN_BLOCK; otherwise it is in place already, or the host's copy-engine
// copy puts it there beside the kernel. `rank` is this rank's ring position; the block at
// position p is rank ox_block_rank(p)'s (p itself on a ring in rank order).
template <bool Y>
__device__ bool ox_ring_allgather(OxShared& s) {
  const OxWork& w = s.w;
  const int n = w.nranks, r = w.rank;
  const uint64_t es = ox_esize(w.dtype);
  const char* in = (const char*)w.src + ox_range_offset(w) * es;
  char* out = (char*)w.dst + ox_range_offset(w) * es;
  const uint64_t bstride = w.block * es;
  const uint32_t own = OX_S_SEND | OX_S_IN | ((w.flags & OX_FLAG_OWN_BLOCK) ? OX_S_OUT : 0u);
  for (uint64_t base = 0; base < w.count; base += w.chunk) {
    const uint64_t len = ox_min(w.chunk, w.count - base);
    const uint64_t o = base * es;
    if (!ox_step<Y>(s, own, in + o, out + ox_block_rank(w, r) * bstride + o, len)) return false;
    for (int t = 1; t < n - 1; t++) {
      if (!ox_step<Y>(s, OX_S_SEND | OX_S_RECV | OX_S_OUT, nullptr,
                   out + ox_block_rank(w, ox_mod(r - t, n)) * bstride + o, len))
        return false;
    }
    if (!ox_step<Y>(s, OX_S_RECV | OX_S_OUT, nullptr, out + ox_block_rank(w, ox_mod(r + 1, n)) * bstride + o, len))
      return false;
  }
  return true;
}

// Ring ReduceScatter: input block b at in + b*block, the result for this rank's block at out
// (blocks of ring positions as in the AllGather).
template <bool Y>
__device__ bool ox_ring_reducescatter(OxShared& s) {
  const OxWork& w = s.w;
  const int n = w.nranks, r = w.rank;
  const uint64_t es = ox_esize(w.dtype);
  const char* in = (const char*)w.src + ox_range_offset(w) * es;
  char* out = (char*)w.dst + ox_range_offset(w) * es;
  const uint64_t bstride = w.block * es;
  for (uint64_t base = 0; base < w.count; base += w.chunk) {
    const uint64_t len = ox_min(w.chunk, w.count - base);
    const uint64_t o = base * es;
    if (!ox_step<Y>(s, OX_S_SEND | OX_S_IN, in + ox_block_rank(w, ox_mod(r - 1, n)) * bstride + o, nullptr, len))
      return false;
    for (int st = 1; st < n - 1; st++) {
      if (!ox_step<Y>(s, OX_S_SEND | OX_S_RECV | OX_S_IN, in + ox_block_rank(w, ox_mod(r - 1 - st, n)) * bstride + o,
                   nullptr, len))
        return false;
    }
    if (!ox_step<Y>(s, OX_S_RECV | OX_S_IN | OX_S_OUT | OX_S_POST, in + ox_block_rank(w, r) * bstride + o, out + o,
                 len))
      return false;
  }
  return true;
}

// Chain Broadcast along the ring from the root: positions root -> root+1 -> ... -> root-1
// (`rank` and `root` are ring positions).
template <bool Y>
__device__ bool ox_ring_broadcast(OxShared& s) {
  const OxWork& w = s.w;
  const int n = w.nranks;
  const int pos = ox_mod(w.rank - w.root, n);
  const uint64_t es = ox_esize(w.dtype);
  const char* in = (const char*)w.src + w.offset * es;
  char* out = (char*)w.dst + w.offset * es;
  const uint32_t what = pos == 0 ? (OX_S_SEND | OX_S_IN | OX_S_OUT)
                        : pos == n - 1 ? (OX_S_RECV | OX_S_OUT)
                                       : (OX_S_SEND | OX_S_RECV | OX_S_OUT);
  for (uint64_t base = 0; base < w.count; base += w.chunk) {
    const uint64_t len = ox_min(w.chunk, w.count - base);
    if (!ox_step<Y>(s, what, in + base * es, out + base * es, len)) return false;
  }
  return true;
}

// Chain Reduce along the ring to the root: positions root+1 -> root+2 -> ... -> root.
template <bool Y>
__device__ bool ox_ring_reduce(OxShared& s) {
  const OxWork& w = s.w;
  const int n = w.nranks;
  const int pos = ox_mod(w.rank - w.root - 1, n);
  const uint64_t es = ox_esize(w.dtype);
  const char* in = (const char*)w.src + w.offset * es;
  char* out = (char*)w.dst + w.offset * es;
  const uint32_t what = pos == 0 ? (OX_S_SEND | OX_S_IN)
                        : pos == n - 1 ? (OX_S_RECV | OX_S_IN | OX_S_OUT | OX_S_POST)
                                       : (OX_S_SEND | OX_S_RECV | OX_S_IN);
  for (uint64_t base = 0; base < w.count; base += w.chunk) {
    const uint64_t len = ox_min(w.chunk, w.count - base);
    if (!ox_step<Y>(s, what, in + base * es, out + base * es, len)) return false;
  }
  return true;
}

// Direct Send / Recv of `count` bytes, one slot (its Simple or LL region) at a time.
template <bool Y>
__device__ bool ox_p2p(OxShared& s, bool send) {
  const OxWork& w = s.w;
  const uint32_t slot = send ? s.send[0].slot_bytes : s.recv[0].slot_bytes;
  const uint64_t chunk = (w.flags & OX_FLAG_LL) ? ox_ll_payload(slot) : ox_simple_bytes(slot);
  for (uint64_t base = 0; base < w.count; base += chunk) {
    const uint64_t len = ox_min(chunk, w.count - base);
    if (send) {
      if (!ox_step<Y>(s, OX_S_SEND | OX_S_IN, (const char*)w.src + base, nullptr, len)) return false;
    } else {
      if (!ox_step<Y>(s, OX_S_RECV | OX_S_OUT, nullptr, (char*)w.dst + base, len)) return false;
    }
  }
  return true;
}

// A local copy with the op's transforms (one-rank reductions) or without.
__device__ void ox_local_copy(OxShared& s) {
  const OxWork& w = s.w;
  const bool ops = w.flags & OX_FLAG_OPS;
  OxRedArgs a;
  a.src0 = (const char*)w.src;
  a.src1 = nullptr;
  a.dst0 = (char*)w.dst;
  a.dst1 = nullptr;
  a.n = w.count;
  a.pre = ops && ox_has_pre(w.dtype, w.op);
  a.post = ops && ox_has_post(w.dtype, w.op);
  ox_reduce_copy(a, w.dtype, w.op, w.flags, w.scalar, w.nranks);
}

// ---- one-shot all-reduce ----------------------------------------------------------------
// One step of `nbytes` (<= one LL step) on the item's nranks-1 peers: each 8-byte unit of
// this rank's input is pre-transformed (rounded to T, exactly what a peer receives), written
// as LL words to every send peer, then the values of all ranks are folded in rank order
// 0..n-1 (this rank's own at position `rank`, rank src's from receive peer (rank-1-src) mod
// n) and post-transformed. Every rank performs the same fold on the same bits, so all ranks'
// results are identical.
template <typename T, int OP>
__device__ __noinline__ void ox_direct_move_t(OxShared& s, const char* in, char* out, uint64_t nbytes,
                                              bool pre, bool post) {
  const OxWork& w = s.w;
  const OxRed<T, OP> f(w.flags, w.scalar, w.nranks);
  const int n = w.nranks, r = w.rank, np = s.nfan;
  const uint32_t ll_off = ox_simple_bytes(s.send[0].slot_bytes);
  const uint64_t nunits = (nbytes + 7) / 8;
  for (uint64_t u = threadIdx.x; u < nunits; u += blockDim.x) {
    const uint64_t off = u * 8;
    const uint32_t len = nbytes - off < 8 ? (uint32_t)(nbytes - off) : 8u;
    const bool two = len > 4;
    uint64_t v = ox_load_bytes(in + off, len);
    if (pre) v = ox_ll_apply<T, OP>(f, v, 0, true, false, false);
    for (int k = 0; k < np; k++) {
      uint64_t* q = (uint64_t*)(ox_slot(s.send[k]) + ll_off + u * 16);
      const uint32_t flag = (uint32_t)(s.send[k].step + 1);
      ox_ll_put(q, (uint32_t)v, flag);
      if (two) ox_ll_put(q + 1, (uint32_t)(v >> 32), flag);
    }
    uint64_t acc = 0;
    for (int src = 0; src < n; src++) {
      uint64_t x;
      if (src == r) {
        x = v;
      } else {
        const int k = ox_mod(r - 1 - src, n);
        const uint64_t* p = (const uint64_t*)(ox_slot(s.recv[k]) + ll_off + u * 16);
        if (!ox_ll_receive(p, two, (uint32_t)(s.recv[k].step + 1), w.abort_flag, &s.aborted, &x,
                           k, s.item))
          return;
      }
      acc = src == 0 ? x : ox_ll_apply<T, OP>(f, acc, x, false, true, false);
    }
    if (post) acc = ox_ll_apply<T, OP>(f, acc, 0, false, false, true);
    ox_store_bytes(out + off, acc, len);
  }
}

// The whole one-shot item, in LL steps of at most one LL step's payload each: wait for a free
// slot towards every peer, move, post every peer (the primitives of every other algorithm,
// with the item's fan).
template <bool Y>
__device__ bool ox_direct_allreduce(OxShared& s) {
  const OxWork& w = s.w;
  const int np = s.nfan;
  const uint64_t es = ox_esize(w.dtype);
  const bool ops = w.flags & OX_FLAG_OPS;
  const bool pre = ops && ox_has_pre(w.dtype, w.op);
  const bool post = ops && ox_has_post(w.dtype, w.op);
  const uint64_t step_bytes = ox_ll_payload(s.send[0].slot_bytes);
  const uint64_t total = w.count * es;
  const char* in = (const char*)w.src + w.offset * es;
  char* out = (char*)w.dst + w.offset * es;
  for (uint64_t base = 0; base < total; base += step_bytes) {
    const uint64_t nb = ox_min(step_bytes, total - base);
    if (!ox_wait<Y>(s, np, 0)) return false;
    OX_FOR_TYPE(w.dtype, OX_FOR_OP(w.op, (ox_direct_move_t<T, OP>(s, in + base, out + base, nb, pre, post))));
    if (!ox_post<Y>(s, np, np, nb, true)) return false;
  }
  return true;
}
