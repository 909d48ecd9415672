// ox_abi.h — owns the layout of everything the host hands to the kernels: the connection
// handle (OxConn) and the work item (OxWork), mirrored field by field in Rust in
// src/sched/device.rs (a unit test there checks the same sizes and offsets asserted here).
#pragma once
#include <stdint.h>
#include <stddef.h>

// One direction of one connection (sender -> receiver) as seen by ONE side.
struct OxConn {
  uint64_t buf;         // staging buffer: nslots * slot_bytes, in the receiver's memory
  uint64_t tail;        // uint64 counter in the receiver's memory: slots filled by the sender, ever
  uint64_t head;        // uint64 counter in the sender's memory: slots consumed by the receiver, ever
  uint64_t step;        // uint64 in this side's own memory: this side's persistent position
  uint32_t slot_bytes;  // bytes per slot (multiple of 4096)
  uint32_t nslots;      // slots in buf (power of two, >= 2)
};

// What a work item does.
enum OxKind : uint32_t {
  OX_KIND_COPY = 0,           // dst = post(pre(src)) for `count` elements (ops only if OX_FLAG_OPS)
  OX_KIND_RING_ALLREDUCE = 1,
  OX_KIND_RING_ALLGATHER = 2,
  OX_KIND_RING_REDUCESCATTER = 3,
  OX_KIND_RING_BROADCAST = 4,
  OX_KIND_RING_REDUCE = 5,
  OX_KIND_SEND = 6,           // `count` bytes from src through `send`
  OX_KIND_RECV = 7,           // `count` bytes through `recv` into dst
  // One-shot all-reduce (always LL): every rank writes its input to every peer and folds all
  // ranks' values in rank order, so every rank computes the same bits in one hop. The item
  // carries the connections of peer k = 0 (send to rank+1, receive from rank-1); it is
  // followed, on the same CTA, by nranks-2 OX_KIND_DIRECT_PEER items whose `send`/`recv`
  // are those of peer k = 1.. (send to rank+1+k, receive from rank-1-k) and nothing else.
  OX_KIND_DIRECT_ALLREDUCE = 8,
  OX_KIND_DIRECT_PEER = 9,
  OX_KIND_COUNT = 10
};

#define OX_DIRECT_MAX_PEERS 7  // one-shot all-reduce: at most 8 ranks

// Reduction op codes (RedOp::code in Rust).
enum OxOp : uint32_t { OX_SUM = 0, OX_PROD = 1, OX_MAX = 2, OX_MIN = 3, OX_AVG = 4, OX_PREMULSUM = 5 };

// Data type codes = ncclDataType_t.
enum OxType : uint32_t {
  OX_INT8 = 0, OX_UINT8 = 1, OX_INT32 = 2, OX_UINT32 = 3, OX_INT64 = 4, OX_UINT64 = 5,
  OX_HALF = 6, OX_FLOAT = 7, OX_DOUBLE = 8, OX_BF16 = 9, OX_FP8E4M3 = 10, OX_FP8E5M2 = 11,
  OX_NTYPES = 12
};

#define OX_FLAG_SCALAR_DEVICE 1u  // `scalar` is a device pointer to the PreMulSum value
#define OX_FLAG_OPS 2u            // apply the op's pre/post transforms (reductions only)
#define OX_FLAG_LL 4u             // move the item's steps with the low-latency protocol (LL)
#define OX_FLAG_OWN_BLOCK 8u      // RingAllGather: the first step also writes this rank's own block

// Every slot of a connection buffer has two disjoint regions, so Simple and LL uses of the
// same connection never see each other's bytes: Simple data in the first
// slot_bytes - slot_bytes/OX_LL_REGION_DIV bytes, LL lines in the last slot_bytes/OX_LL_REGION_DIV.
// An LL line is one 8-byte word {4 data bytes, 4-byte flag}, so an LL step carries
// slot_bytes/(2*OX_LL_REGION_DIV) payload bytes. Mirrored in src/sched/device.rs.
#define OX_LL_REGION_DIV 8

// One unit of work for one CTA. Every CTA runs, in array order, the items whose `cta` is its
// blockIdx.x. Ring items: `src`/`dst` are the task's user buffers, the item covers elements
// [offset, offset+count) of the buffer (AllReduce, Broadcast, Reduce) or of every rank's
// block of `block` elements (AllGather, ReduceScatter). Copy/Send/Recv: `src`/`dst` already
// point at the item's part; Send/Recv count bytes.
struct OxWork {
  uint64_t src;         // 0
  uint64_t dst;         // 8
  uint64_t count;       // 16 elements (bytes for Send/Recv)
  uint64_t offset;      // 24 element offset of this item's range (ring items)
  uint64_t block;       // 32 elements per rank block (AllGather / ReduceScatter)
  uint64_t chunk;       // 40 elements per slot-sized piece (ring items; same on every rank)
  uint64_t scalar;      // 48 PreMulSum value bytes (little endian), or a device pointer
  uint64_t abort_flag;  // 56 device-visible address of a volatile uint32; non-zero = abort
  struct OxConn send;   // 64 this rank -> next / peer
  struct OxConn recv;   // 104 prev / peer -> this rank
  uint32_t kind;        // 144 OxKind
  uint32_t dtype;       // 148 OxType
  uint32_t op;          // 152 OxOp
  uint32_t flags;       // 156 OX_FLAG_*
  int32_t rank;         // 160 position in the ring (= rank for ring order r -> r+1)
  int32_t nranks;       // 164
  int32_t root;         // 168 root rank (Broadcast, Reduce)
  uint32_t cta;         // 172 the CTA (blockIdx.x) that runs this item
};

#define OX_CONN_SIZE 40
#define OX_MAX_THREADS 512  // most threads per CTA ox_kernel may be launched with
#define OX_WORK_SIZE 176
#define OX_MAX_ITEMS 512  // most work items one launch may carry

#ifdef __cplusplus
static_assert(sizeof(OxConn) == OX_CONN_SIZE, "OxConn size");
static_assert(offsetof(OxConn, buf) == 0 && offsetof(OxConn, tail) == 8 &&
              offsetof(OxConn, head) == 16 && offsetof(OxConn, step) == 24 &&
              offsetof(OxConn, slot_bytes) == 32 && offsetof(OxConn, nslots) == 36,
              "OxConn layout");
static_assert(sizeof(OxWork) == OX_WORK_SIZE, "OxWork size");
static_assert(offsetof(OxWork, src) == 0 && offsetof(OxWork, dst) == 8 &&
              offsetof(OxWork, count) == 16 && offsetof(OxWork, offset) == 24 &&
              offsetof(OxWork, block) == 32 && offsetof(OxWork, chunk) == 40 &&
              offsetof(OxWork, scalar) == 48 && offsetof(OxWork, abort_flag) == 56 &&
              offsetof(OxWork, send) == 64 && offsetof(OxWork, recv) == 104 &&
              offsetof(OxWork, kind) == 144 && offsetof(OxWork, dtype) == 148 &&
              offsetof(OxWork, op) == 152 && offsetof(OxWork, flags) == 156 &&
              offsetof(OxWork, rank) == 160 && offsetof(OxWork, nranks) == 164 &&
              offsetof(OxWork, root) == 168 && offsetof(OxWork, cta) == 172,
              "OxWork layout");
#endif

// The parameter of ox_kernel_inline: up to OX_INLINE_ITEMS items passed by value (the whole
// struct stays under the 4 KiB kernel-parameter limit).
#define OX_INLINE_ITEMS 22
struct OxInline {
  uint32_t nitems;
  uint32_t pad;
  OxWork items[OX_INLINE_ITEMS];
};
#define OX_INLINE_SIZE 3880
#ifdef __cplusplus
static_assert(sizeof(OxInline) == OX_INLINE_SIZE && offsetof(OxInline, items) == 8, "OxInline layout");
#endif
