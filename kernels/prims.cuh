// prims.cuh — owns the data movement primitives: volatile vector loads, the copy loop and the
// typed reduce-copy loop (16-byte aligned vector path with several loads in flight, scalar
// fallback), the one element-size table, the one abort-poll loop (ox_spin), and the
// connection primitives on a fan of peers: open/close an item's send and receive peers
// (up to OX_MAX_FAN each), wait for free/full slots on any subset of them, publish
// tail/head after a step (NCCL's "Simple"), and the LL word primitives.
#pragma once
#include "ox_abi.h"
#include "ox_proto.cuh"
#include "reduce.cuh"

#define OX_UNROLL 4
#define OX_ABORT_POLL 1000

// Bytes per element of a data type code: the generated table OX_ELEM_SIZES (4 bits a code).
__device__ __forceinline__ uint32_t ox_esize(uint32_t dtype) {
  return (uint32_t)(((uint64_t)OX_ELEM_SIZES >> (4 * dtype)) & 15);
}

// ---- raw memory access ------------------------------------------------------------------
// Loads are volatile (ld.volatile): staging slots are rewritten by other GPUs between uses,
// so nothing may come from a stale L1 line.
__device__ __forceinline__ uint4 ox_ld16(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void ox_st16(void* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};"
               :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
template <typename B> __device__ __forceinline__ B ox_ld(const void* p) {
  return *(const volatile B*)p;
}
template <typename B> __device__ __forceinline__ void ox_st(void* p, B v) { *(B*)p = v; }

// Counter polls and slot releases are relaxed at system scope: an acquire load or release
// store at .sys costs a system-wide ordering point each, and with many CTAs polling and
// posting at once those serialise (2 H200s, graph replay: 0.5-0.7 µs per CTA per call).
// Only the publication of a filled Simple slot needs the release (its data must be visible
// before the tail); a poll needs no acquire, because the data is read only after a barrier
// that follows the poll's load, with volatile (L1-bypassing) loads; a consumed slot is
// released after a barrier that follows every read of it.
__device__ __forceinline__ uint64_t ox_ld_relaxed(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void ox_st_relaxed(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void ox_st_release(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

// ---- copy ---------------------------------------------------------------------------------
// dst0 (and dst1 if not null) = src, nbytes, any alignment; all threads of the CTA take part.
template <typename B>
__device__ __forceinline__ void ox_copy_units(char* dst0, char* dst1, const char* src,
                                              uint64_t n, uint32_t tid, uint32_t nthreads) {
  uint64_t i = tid;
  for (; i + (OX_UNROLL - 1) * (uint64_t)nthreads < n; i += OX_UNROLL * (uint64_t)nthreads) {
    B v[OX_UNROLL];
#pragma unroll
    for (int u = 0; u < OX_UNROLL; u++) {
      if constexpr (sizeof(B) == 16) v[u] = ox_ld16(src + (i + u * nthreads) * 16);
      else v[u] = ox_ld<B>(src + (i + u * nthreads) * sizeof(B));
    }
#pragma unroll
    for (int u = 0; u < OX_UNROLL; u++) {
      uint64_t off = (i + u * nthreads) * sizeof(B);
      if constexpr (sizeof(B) == 16) {
        ox_st16(dst0 + off, v[u]);
        if (dst1) ox_st16(dst1 + off, v[u]);
      } else {
        ox_st<B>(dst0 + off, v[u]);
        if (dst1) ox_st<B>(dst1 + off, v[u]);
      }
    }
  }
  for (; i < n; i += nthreads) {
    uint64_t off = i * sizeof(B);
    if constexpr (sizeof(B) == 16) {
      uint4 v = ox_ld16(src + off);
      ox_st16(dst0 + off, v);
      if (dst1) ox_st16(dst1 + off, v);
    } else {
      B v = ox_ld<B>(src + off);
      ox_st<B>(dst0 + off, v);
      if (dst1) ox_st<B>(dst1 + off, v);
    }
  }
}

__device__ __noinline__ void ox_copy(char* dst0, char* dst1, const char* src, uint64_t nbytes) {
  const uint32_t tid = threadIdx.x, nthreads = blockDim.x;
  uint64_t align = (uint64_t)dst0 | (uint64_t)src | (dst1 ? (uint64_t)dst1 : 0);
  uint64_t done = 0;
  if ((align & 15) == 0) {
    done = nbytes & ~(uint64_t)15;
    ox_copy_units<uint4>(dst0, dst1, src, nbytes / 16, tid, nthreads);
  } else if ((align & 7) == 0) {
    done = nbytes & ~(uint64_t)7;
    ox_copy_units<uint64_t>(dst0, dst1, src, nbytes / 8, tid, nthreads);
  } else if ((align & 3) == 0) {
    done = nbytes & ~(uint64_t)3;
    ox_copy_units<uint32_t>(dst0, dst1, src, nbytes / 4, tid, nthreads);
  }
  if (done < nbytes) {
    ox_copy_units<uint8_t>(dst0 + done, dst1 ? dst1 + done : nullptr, src + done, nbytes - done,
                           tid, nthreads);
  }
}

// ---- reduce-copy ----------------------------------------------------------------------------
// For each element i < n:  v = src0[i] (pre-transformed if pre); if src1: v = combine(v, src1[i]);
// if post: v = post(v); dst0[i] = v; if dst1: dst1[i] = v.
// Pointers must be aligned to sizeof(T); the 16-byte path is taken when all are 16-aligned.
struct OxRedArgs {
  const char* src0;
  const char* src1;
  char* dst0;
  char* dst1;
  uint64_t n;
  bool pre;
  bool post;
};

template <typename T, int OP>
__device__ __forceinline__ typename OxTraits<T>::C ox_elem(const OxRed<T, OP>& f, const OxRedArgs& a,
                                                           typename OxTraits<T>::Bits x0,
                                                           typename OxTraits<T>::Bits x1) {
  using Tr = OxTraits<T>;
  typename Tr::C v = Tr::to_c(ox_from_bits<T>(x0));
  if (a.pre) v = f.pre(v);
  if (a.src1) v = f.combine(v, Tr::to_c(ox_from_bits<T>(x1)));
  if (a.post) v = f.post(v);
  return v;
}

template <typename T, int OP>
__device__ __noinline__ void ox_reduce_copy_t(const char* src0, const char* src1, char* dst0,
                                              char* dst1, uint64_t n, bool pre, bool post,
                                              uint32_t flags, uint64_t scalar, int nranks) {
  // Scalars, not a struct, so the ABI passes everything in registers.
  OxRedArgs a;
  a.src0 = src0;
  a.src1 = src1;
  a.dst0 = dst0;
  a.dst1 = dst1;
  a.n = n;
  a.pre = pre;
  a.post = post;
  using Tr = OxTraits<T>;
  using Bits = typename Tr::Bits;
  constexpr int kPerVec = 16 / sizeof(T);
  const OxRed<T, OP> f(flags, scalar, nranks);
  const uint32_t tid = threadIdx.x, nthreads = blockDim.x;
  uint64_t align = (uint64_t)a.src0 | (uint64_t)a.dst0 | (a.src1 ? (uint64_t)a.src1 : 0) |
                   (a.dst1 ? (uint64_t)a.dst1 : 0);
  uint64_t done = 0;
  if ((align & 15) == 0) {
    const uint64_t nvec = a.n / kPerVec;
    done = nvec * kPerVec;
    uint64_t i = tid;
    for (; i + (OX_UNROLL - 1) * (uint64_t)nthreads < nvec; i += OX_UNROLL * (uint64_t)nthreads) {
      uint4 x0[OX_UNROLL], x1[OX_UNROLL];
#pragma unroll
      for (int u = 0; u < OX_UNROLL; u++) {
        x0[u] = ox_ld16(a.src0 + (i + u * nthreads) * 16);
        if (a.src1) x1[u] = ox_ld16(a.src1 + (i + u * nthreads) * 16);
        else x1[u] = x0[u];
      }
#pragma unroll
      for (int u = 0; u < OX_UNROLL; u++) {
        Bits e0[kPerVec], e1[kPerVec], r[kPerVec];
        memcpy(e0, &x0[u], 16);
        memcpy(e1, &x1[u], 16);
#pragma unroll
        for (int k = 0; k < kPerVec; k++) r[k] = ox_to_bits<T>(Tr::from_c(ox_elem<T, OP>(f, a, e0[k], e1[k])));
        uint4 out;
        memcpy(&out, r, 16);
        uint64_t off = (i + u * nthreads) * 16;
        ox_st16(a.dst0 + off, out);
        if (a.dst1) ox_st16(a.dst1 + off, out);
      }
    }
    for (; i < nvec; i += nthreads) {
      uint64_t off = i * 16;
      uint4 x0 = ox_ld16(a.src0 + off);
      uint4 x1 = a.src1 ? ox_ld16(a.src1 + off) : x0;
      Bits e0[kPerVec], e1[kPerVec], r[kPerVec];
      memcpy(e0, &x0, 16);
      memcpy(e1, &x1, 16);
#pragma unroll
      for (int k = 0; k < kPerVec; k++) r[k] = ox_to_bits<T>(Tr::from_c(ox_elem<T, OP>(f, a, e0[k], e1[k])));
      uint4 out;
      memcpy(&out, r, 16);
      ox_st16(a.dst0 + off, out);
      if (a.dst1) ox_st16(a.dst1 + off, out);
    }
  }
  for (uint64_t i = done + tid; i < a.n; i += nthreads) {
    uint64_t off = i * sizeof(T);
    Bits x0 = ox_ld<Bits>(a.src0 + off);
    Bits x1 = a.src1 ? ox_ld<Bits>(a.src1 + off) : x0;
    Bits r = ox_to_bits<T>(Tr::from_c(ox_elem<T, OP>(f, a, x0, x1)));
    ox_st<Bits>(a.dst0 + off, r);
    if (a.dst1) ox_st<Bits>(a.dst1 + off, r);
  }
}

// Runtime dispatch on (dtype, op); a pure copy (no src1, no pre/post) takes ox_copy.
__device__ __noinline__ void ox_reduce_copy(OxRedArgs a, uint32_t dtype, uint32_t op,
                                            uint32_t flags, uint64_t scalar, int nranks) {
  if (a.n == 0) return;
  if (!a.src1 && !a.pre && !a.post) {
    const uint32_t esize = ox_esize(dtype);
    if (a.dst0 == a.src0) {  // in place: only the second destination needs the data
      if (a.dst1) ox_copy(a.dst1, nullptr, a.src0, a.n * esize);
      return;
    }
    ox_copy(a.dst0, a.dst1, a.src0, a.n * esize);
    return;
  }
  OX_FOR_TYPE(dtype, OX_FOR_OP(op, (ox_reduce_copy_t<T, OP>(a.src0, a.src1, a.dst0, a.dst1, a.n, a.pre, a.post, flags, scalar, nranks))));
}

// ---- connections ------------------------------------------------------------------------------
// The CTA's view of its item's connections, in shared memory: send peer k and receive peer k
// for k < nfan (the item's fan, `ox_fan_of`). Thread k waits on and publishes peer k, so a
// thread only ever reads positions it wrote itself; every thread reads the positions only
// after the barrier that ends a wait.
struct OxPeer {
  char* buf;
  uint64_t* tail;
  uint64_t* head;
  uint64_t* stepp;
  uint64_t step;
  uint32_t slot_bytes;
  uint32_t nslots;
};

struct OxShared {
  OxWork w;
  OxPeer send[OX_MAX_FAN];
  OxPeer recv[OX_MAX_FAN];
  int nfan;
  int aborted;
  // The index of the item in the launch's item list (set by ox_run_item), for wait words.
  uint32_t item;
  // Yielding launches (ox_kernel_yield; all 0 otherwise): a parkable wait that lasts
  // park_ns parks the CTA (parked = 1, like an abort that keeps the positions); skip: steps
  // of the item already done by an earlier kernel of the launch, passed over; done_steps: the
  // item's steps done so far (skipped ones included), for the resume record. Written by
  // thread 0 only, read by every thread after a barrier.
  uint32_t park_ns;
  int parked;
  uint32_t skip;
  uint32_t done_steps;
};

// Set by a thread of the CTA that wrote its wait word (OX_PROGRESS_OFFSET); the kernel entry
// clears the word at its end when set. Per CTA, like every __shared__ variable.
__shared__ int ox_wait_told;

// A wait entry's content (OX_PROGRESS_OFFSET): the wait word (what is waited for, the
// peer's fan index, the item's index in the launch's list or OX_WAIT_ITEM_UNKNOWN, the low 32
// bits of the step) and the device address the wait polls (it names the connection).
struct OxWaitDesc {
  uint64_t word;
  uint64_t at;
};

__device__ __forceinline__ OxWaitDesc ox_wait_desc(uint32_t what, uint32_t fan, uint32_t item,
                                                   uint64_t step, const void* at) {
  return {((uint64_t)what << OX_WAIT_WHAT_SHIFT) | ((uint64_t)fan << OX_WAIT_FAN_SHIFT) |
              ((uint64_t)(item & 0xFFFF) << OX_WAIT_ITEM_SHIFT) | (uint64_t)(uint32_t)step,
          (uint64_t)at};
}

// This CTA's wait entry (word, then address) on the status page whose abort flag is at
// abort_addr.
__device__ __forceinline__ uint64_t* ox_wait_slot(uint64_t abort_addr) {
  return (uint64_t*)(abort_addr + OX_PROGRESS_OFFSET + (uint64_t)OX_WAIT_ENTRY_BYTES * blockIdx.x);
}

// At the end of a kernel entry (every thread, after the barrier that follows its last wait):
// thread 0 clears this CTA's wait word if the CTA wrote one (then s.w is an item of this
// launch, all of whose items carry the same status page), so a finished launch leaves none
// behind.
__device__ __forceinline__ void ox_wait_clear(const OxShared& s) {
  if (threadIdx.x == 0 && *(volatile int*)&ox_wait_told && s.w.abort_flag) {
    ox_st_relaxed(ox_wait_slot(s.w.abort_flag), 0);
  }
}

// The one abort-poll loop: spins until ready() holds, reading the abort flag (a
// device-visible uint32 at abort_addr, if not 0) every OX_ABORT_POLL spins. False, with
// *aborted set, if the abort flag rose first. At each such poll it also publishes
// describe() (an OxWaitDesc, ox_wait_desc) as this CTA's wait entry on the status page: only
// a wait that lasts computes or stores anything.
//
// Parking (yielding launches): with park_ns != 0, a wait that has lasted park_ns (on the GPU's
// global timer) parks instead: it stores 0 in the status page's
// bell, fences at system scope and asks ready() once more; if the wait is now satisfied it
// stores 1 again (it may have erased a ring meant for another CTA) and returns true, else it
// sets *parked and returns false. The proxy rings the bell once the entry's counter reaches
// its value, so the launch's next kernel runs.
__device__ __forceinline__ uint64_t ox_globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// What a parking wait waits for: the counter at `at` reaching `value` (its park entry).
struct OxParkAt {
  const uint64_t* at;
  uint64_t value;
};
struct OxNoPark {
  __device__ OxParkAt operator()() const { return {nullptr, 0}; }
};

// This CTA's park entry (OX_PARK_OFFSET) on the status page at abort_addr.
__device__ __forceinline__ uint64_t* ox_park_slot(uint64_t abort_addr) {
  return (uint64_t*)(abort_addr + OX_PARK_OFFSET + (uint64_t)OX_PARK_ENTRY_BYTES * blockIdx.x);
}

template <typename Ready, typename Describe, typename ParkAt = OxNoPark>
__device__ __forceinline__ bool ox_spin(Ready ready, Describe describe, uint64_t abort_addr,
                                        int* aborted, uint32_t park_ns = 0, int* parked = nullptr,
                                        ParkAt park_at = OxNoPark()) {
  const volatile uint32_t* abort_flag = (const volatile uint32_t*)abort_addr;
  uint32_t spins = 0;
  // Only CTAs with a park entry park. A poll of host-mapped counters takes about a
  // microsecond: the park deadline is checked at every spin (the timer is cheap).
  if (blockIdx.x >= OX_PROGRESS_CTAS || !abort_flag) park_ns = 0;
  const uint64_t deadline = park_ns ? ox_globaltimer() + park_ns : 0;
  while (!ready()) {
    if (park_ns && ox_globaltimer() >= deadline) {
      const OxParkAt pa = park_at();
      if (!pa.at) {  // what it waits for now may not park: spin on
        park_ns = 0;
        continue;
      }
      uint64_t* entry = ox_park_slot(abort_addr);
      ox_st_relaxed(entry + 1, pa.value);
      ox_st_relaxed(entry, (uint64_t)pa.at);
      uint32_t* bell = (uint32_t*)(abort_addr + OX_BELL_OFFSET);
      asm volatile("st.relaxed.sys.global.u32 [%0], %1;" :: "l"(bell), "r"(0u) : "memory");
      asm volatile("fence.sc.sys;" ::: "memory");
      if (ready()) {
        asm volatile("st.relaxed.sys.global.u32 [%0], %1;" :: "l"(bell), "r"(1u) : "memory");
        return true;
      }
      *(volatile int*)parked = 1;
      return false;
    }
    if (++spins == OX_ABORT_POLL) {
      spins = 0;
      if (abort_flag && *abort_flag) {
        *(volatile int*)aborted = 1;
        return false;
      }
      if (abort_flag && blockIdx.x < OX_PROGRESS_CTAS) {
        const OxWaitDesc d = describe();
        uint64_t* entry = ox_wait_slot(abort_addr);
        ox_st_relaxed(entry + 1, d.at);
        ox_st_relaxed(entry, d.word);
        *(volatile int*)&ox_wait_told = 1;
      }
    }
  }
  return true;
}

// The peers an item sends to and receives from: nranks-1 for the one-shot all-reduce, else one.
__device__ __forceinline__ int ox_fan_of(const OxWork& w) {
  return w.kind == OX_KIND_DIRECT_ALL_REDUCE ? w.nranks - 1 : 1;
}

__device__ __forceinline__ void ox_peer_open(OxPeer& p, const OxConn& c) {
  p.buf = (char*)c.buf;
  p.tail = (uint64_t*)c.tail;
  p.head = (uint64_t*)c.head;
  p.stepp = (uint64_t*)c.step;
  p.step = c.step ? *(volatile uint64_t*)c.step : 0;
  p.slot_bytes = c.slot_bytes;
  p.nslots = c.nslots;
}
__device__ __forceinline__ void ox_peer_close(OxPeer& p) {
  if (p.stepp) *(volatile uint64_t*)p.stepp = p.step;
}

// Opens the connections of the item in s.w (items[i]) and of its Peer items: thread k opens
// send and receive peer k from items[i + k]. Returns the items consumed (the fan), 0 if the
// item list is malformed (the planner never makes one).
__device__ __forceinline__ int ox_open(OxShared& s, const OxWork* items, uint32_t i, uint32_t nitems) {
  const int nfan = ox_fan_of(s.w);
  if (nfan < 1 || nfan > OX_MAX_FAN || i + nfan > nitems) return 0;
  const int k = threadIdx.x;
  if (k == 0) {
    s.nfan = nfan;
    ox_peer_open(s.send[0], s.w.send);
    ox_peer_open(s.recv[0], s.w.recv);
  } else if (k < nfan) {
    const OxConn sc = items[i + k].send, rc = items[i + k].recv;
    ox_peer_open(s.send[k], sc);
    ox_peer_open(s.recv[k], rc);
  }
  __syncthreads();
  return nfan;
}

// Saves every peer's position for the next kernel (after the item's last step).
__device__ __forceinline__ void ox_close(OxShared& s) {
  __syncthreads();
  const int k = threadIdx.x;
  if (k < s.nfan) {
    ox_peer_close(s.send[k]);
    ox_peer_close(s.recv[k]);
  }
}

__device__ __forceinline__ char* ox_slot(const OxPeer& p) {
  return p.buf + (p.step & (uint64_t)(p.nslots - 1)) * (uint64_t)p.slot_bytes;
}

// The step word of the send position's step: epoch, bytes, protocol.
__device__ __forceinline__ uint64_t ox_step_word_of(const OxPeer& p, uint64_t nbytes, bool ll) {
  return ((p.step + 1) << 32) | nbytes | (ll ? (uint64_t)OX_STEP_LL : 0ull);
}

// The step word stored for the proxy of a network connection (OX_STEP_WORDS_OFFSET). A relaxed
// store by the peer's thread, ordered before the tail by the release that publishes a Simple
// step.
__device__ __forceinline__ void ox_step_word(const OxPeer& p, uint64_t nbytes, bool ll) {
  uint64_t* words = (uint64_t*)((char*)p.tail + OX_STEP_WORDS_OFFSET);
  ox_st_relaxed(words + (p.step & (uint64_t)(p.nslots - 1)), ox_step_word_of(p, nbytes, ll));
}

// A Simple step on a send connection whose slots are in GPU memory (OX_FLAG_SEND_GPU): the
// step word also goes right after the payload, as the message's trailer (the proxy cannot
// write GPU memory). Byte stores where the payload's end is not 8-aligned. Ordered before the
// tail by the release that follows. (Inline: a call here made ox_kernel spill on sm_90.)
__device__ __forceinline__ void ox_send_trailer(const OxPeer& p, uint64_t nbytes) {
  const uint64_t word = ox_step_word_of(p, nbytes, false);
  char* at = ox_slot(p) + nbytes;
  if (((uintptr_t)at & 7) == 0) {
    *(volatile uint64_t*)at = word;
  } else {
    for (int i = 0; i < 8; i++) ((volatile unsigned char*)at)[i] = (unsigned char)(word >> (8 * i));
  }
}

// Where an LL step's words go on a send peer: the LL region of its slot, or with
// OX_FLAG_SEND_GPU the slot's host LL region after the connection's tail page (the proxy polls
// the words there; it cannot read GPU memory).
__device__ __forceinline__ char* ox_send_ll(const OxPeer& p, uint32_t flags) {
  if (flags & OX_FLAG_SEND_GPU)
    return (char*)p.tail + OX_SEND_LL_OFFSET +
           (p.step & (uint64_t)(p.nslots - 1)) * (uint64_t)(p.slot_bytes / OX_LL_REGION_DIV);
  return ox_slot(p) + ox_simple_bytes(p.slot_bytes);
}

// Before a step: thread k waits until send peer k (k < nsend) has a free slot and receive
// peer k (k < nrecv) a full one (an LL step waits for no receive slot: its words carry their
// own validity, so it passes nrecv = 0). Returns false on every thread on abort.
// Y (a yielding launch's kernel): waits on peers flagged FLAG_PARK_* may park (ox_spin).
template <bool Y>
__device__ bool ox_wait(OxShared& s, int nsend, int nrecv) {
  const int k = threadIdx.x;
  if (k < nsend || k < nrecv) {
    const OxPeer& sp = s.send[k];
    const OxPeer& rp = s.recv[k];
    const bool send = k < nsend, recv = k < nrecv;
    const bool parkable =
        Y && ((send && (s.w.flags & OX_FLAG_PARK_SEND)) || (recv && (s.w.flags & OX_FLAG_PARK_RECV)));
    ox_spin([&] {
      return (!send || ox_ld_relaxed(sp.head) + sp.nslots > sp.step) &&
             (!recv || ox_ld_relaxed(rp.tail) > rp.step);
    }, [&] {
      const bool on_send = send && !(ox_ld_relaxed(sp.head) + sp.nslots > sp.step);
      return on_send ? ox_wait_desc(OX_WAIT_SEND_SLOT, k, s.item, sp.step, sp.head)
                     : ox_wait_desc(OX_WAIT_RECV_SLOT, k, s.item, rp.step, rp.tail);
    }, s.w.abort_flag, &s.aborted, parkable ? s.park_ns : 0u, &s.parked, [&] {
      // head + nslots > step  <=>  head >= step + 1 - nslots;  tail > step  <=>  tail >= step + 1.
      // It parks on an unmet wait of a flagged peer only (the proxy rings for those).
      const bool send_unmet = send && !(ox_ld_relaxed(sp.head) + sp.nslots > sp.step);
      const bool recv_unmet = recv && !(ox_ld_relaxed(rp.tail) > rp.step);
      if (recv_unmet && (s.w.flags & OX_FLAG_PARK_RECV)) return OxParkAt{rp.tail, rp.step + 1};
      if (send_unmet && (s.w.flags & OX_FLAG_PARK_SEND)) return OxParkAt{sp.head, sp.step + 1 - sp.nslots};
      return OxParkAt{nullptr, 0};
    });
  }
  __syncthreads();
  if constexpr (Y) return !s.aborted && !s.parked;
  return !s.aborted;
}

// After a step's data: the barrier orders every thread's writes of the step before the
// release store of the tail at system scope (the release is cumulative over what the barrier
// made it observe), so one fence per peer publishes the whole CTA's data, as NCCL's postPeer
// does; for an LL step it also ends every read of the receive words. Then thread k publishes
// send peer k's filled slot (step word, and tail for Simple) and receive peer k's consumed
// slot (head), and advances both positions. False on every thread on abort.
template <bool Y>
__device__ bool ox_post(OxShared& s, int nsend, int nrecv, uint64_t nbytes, bool ll) {
  __syncthreads();
  if (s.aborted) return false;
  const int k = threadIdx.x;
  if (k < nsend) {
    OxPeer& p = s.send[k];
    ox_step_word(p, nbytes, ll);
    if (!ll && k == 0 && (s.w.flags & OX_FLAG_SEND_GPU)) ox_send_trailer(p, nbytes);
    p.step++;
    if (!ll) ox_st_release(p.tail, p.step);
  }
  if (k < nrecv) {
    OxPeer& p = s.recv[k];
    p.step++;
    ox_st_relaxed(p.head, p.step);
  }
  if (Y && k == 0) s.done_steps++;
  return true;
}

// A step an earlier kernel of this yielding launch already did (s.skip > 0): counted, and
// nothing else; positions were saved when that kernel parked. Every thread calls it (the
// barriers keep s.skip the same for all threads).
__device__ __forceinline__ void ox_skip_step(OxShared& s) {
  __syncthreads();
  if (threadIdx.x == 0) {
    s.skip--;
    s.done_steps++;
  }
  __syncthreads();
}

// ---- the low-latency protocol (LL) -----------------------------------------------------------
// Every 8-byte word of a slot's LL region is {4 payload bytes, flag}, written with ONE 64-bit
// volatile store; the receiver polls the words themselves (one 64-bit volatile load returns
// data and flag together) until the flag is the step's epoch (uint32)(step + 1). No fence, no
// tail: a word is valid exactly when its flag matches. Stale words of earlier LL uses of the
// slot carry older epochs; Simple data never lands in the LL region. Flow control is Simple's:
// the sender of step k waits head + nslots > k, the receiver publishes head = k + 1.
__device__ __forceinline__ void ox_ll_put(uint64_t* p, uint32_t data, uint32_t flag) {
  const uint64_t v = (uint64_t)data | ((uint64_t)flag << 32);
  asm volatile("st.volatile.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ox_ll_word(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ox_load_bytes(const char* p, uint32_t len) {
  if (len == 8 && ((uintptr_t)p & 7) == 0) return *(const volatile uint64_t*)p;
  uint64_t v = 0;
  for (uint32_t i = 0; i < len; i++) v |= (uint64_t)(*(const volatile uint8_t*)(p + i)) << (8 * i);
  return v;
}
__device__ __forceinline__ void ox_store_bytes(char* p, uint64_t v, uint32_t len) {
  if (len == 8 && ((uintptr_t)p & 7) == 0) {
    *(uint64_t*)p = v;
    return;
  }
  for (uint32_t i = 0; i < len; i++) p[i] = (char)(v >> (8 * i));
}

// Waits until the LL words at p (one, or two when `two`) carry `flag`, then returns their
// payload bytes in *out (the first word's in the low half). False, with *aborted set, if the
// abort flag rose meanwhile. `fan` and `item` only describe the wait (its wait word; the
// step is flag - 1).
__device__ __forceinline__ bool ox_ll_receive(const uint64_t* p, bool two, uint32_t flag,
                                              uint64_t abort_addr, int* aborted, uint64_t* out,
                                              uint32_t fan, uint32_t item) {
  uint64_t a = ox_ll_word(p);
  uint64_t b = two ? ox_ll_word(p + 1) : ((uint64_t)flag << 32);
  const bool ok = ox_spin([&] {
    if ((uint32_t)(a >> 32) != flag) a = ox_ll_word(p);
    if ((uint32_t)(b >> 32) != flag) b = ox_ll_word(p + 1);
    return (uint32_t)(a >> 32) == flag && (uint32_t)(b >> 32) == flag;
  }, [&] { return ox_wait_desc(OX_WAIT_LL_DATA, fan, item, flag - 1u, p); }, abort_addr, aborted);
  *out = (a & 0xffffffffull) | (b << 32);
  return ok;
}

// The elements packed in 8 bytes: r = post(combine(pre(x), y)) with each part optional.
template <typename T, int OP>
__device__ __forceinline__ uint64_t ox_ll_apply(const OxRed<T, OP>& f, uint64_t x, uint64_t y, bool pre,
                                                bool comb, bool post) {
  using Tr = OxTraits<T>;
  using Bits = typename Tr::Bits;
  constexpr int k = 8 / sizeof(T);
  Bits ex[k], ey[k], r[k];
  memcpy(ex, &x, 8);
  memcpy(ey, &y, 8);
#pragma unroll
  for (int j = 0; j < k; j++) {
    typename Tr::C v = Tr::to_c(ox_from_bits<T>(ex[j]));
    if (pre) v = f.pre(v);
    if (comb) v = f.combine(v, Tr::to_c(ox_from_bits<T>(ey[j])));
    if (post) v = f.post(v);
    r[j] = ox_to_bits<T>(Tr::from_c(v));
  }
  uint64_t out;
  memcpy(&out, r, 8);
  return out;
}

// One LL step over `nbytes` payload bytes, 8 per thread and pass: v = in (pre-transformed),
// combined with the received words when both exist, else whichever exists; post-transformed
// if post; written to out and/or sent. Sets *aborted (and stops) if the abort flag rises.
template <typename T, int OP>
__device__ __noinline__ void ox_ll_move_t(const char* in, char* out, char* send_ll,
                                          const char* recv_ll, uint64_t nbytes, uint32_t send_flag,
                                          uint32_t recv_flag, bool pre, bool post, uint32_t flags,
                                          uint64_t scalar, int nranks, uint64_t abort_addr,
                                          int* aborted) {
  const OxRed<T, OP> f(flags, scalar, nranks);
  const uint64_t nunits = (nbytes + 7) / 8;
  for (uint64_t u = threadIdx.x; u < nunits; u += blockDim.x) {
    const uint64_t off = u * 8;
    const uint32_t len = nbytes - off < 8 ? (uint32_t)(nbytes - off) : 8u;
    const bool two = len > 4;
    uint64_t received = 0;
    if (recv_ll && !ox_ll_receive((const uint64_t*)(recv_ll + u * 16), two, recv_flag, abort_addr,
                                  aborted, &received, 0, OX_WAIT_ITEM_UNKNOWN))
      return;
    uint64_t v;
    if (in) {
      v = ox_load_bytes(in + off, len);
      if (pre || recv_ll || post) v = ox_ll_apply<T, OP>(f, v, received, pre, recv_ll != nullptr, post);
    } else {
      v = post ? ox_ll_apply<T, OP>(f, received, 0, false, false, true) : received;
    }
    if (out) ox_store_bytes(out + off, v, len);
    if (send_ll) {
      uint64_t* q = (uint64_t*)(send_ll + u * 16);
      ox_ll_put(q, (uint32_t)v, send_flag);
      if (two) ox_ll_put(q + 1, (uint32_t)(v >> 32), send_flag);
    }
  }
}

// Runtime dispatch: a plain move (nothing to combine or transform) takes one byte-typed copy.
__device__ __forceinline__ void ox_ll_move(const char* in, char* out, char* send_ll,
                                           const char* recv_ll, uint64_t nbytes, uint32_t send_flag,
                                           uint32_t recv_flag, bool pre, bool post, uint32_t dtype,
                                           uint32_t op, uint32_t flags, uint64_t scalar, int nranks,
                                           uint64_t abort_addr, int* aborted) {
  if (nbytes == 0) return;
  if (!pre && !post && !(in && recv_ll)) {
    ox_ll_move_t<uint8_t, OX_SUM>(in, out, send_ll, recv_ll, nbytes, send_flag, recv_flag, false,
                                  false, flags, 0, nranks, abort_addr, aborted);
    return;
  }
  OX_FOR_TYPE(dtype, OX_FOR_OP(op, (ox_ll_move_t<T, OP>(in, out, send_ll, recv_ll, nbytes, send_flag, recv_flag, pre, post, flags, scalar, nranks, abort_addr, aborted))));
}
