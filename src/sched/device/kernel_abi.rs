//! The device ABI: every `#[repr(C)]` struct, enum and constant the kernels read, defined
//! here once. `kernels/ox_abi.h` is generated from this file by cbindgen (configured by
//! `kernels/cbindgen.toml`, which gives every constant the `OX_` prefix and names the types
//! as the kernels know them); `tests/header.rs` fails when the committed header is
//! stale. Regenerate it with `OXCCL_BLESS=1 cargo test --test header`.
//!
//! Only definitions live here (cbindgen reads this file alone); the layout checks, the ties
//! to the Rust sources of the op and type codes and the serialisation are in `device/mod.rs`.

/// One direction of one connection (sender -> receiver) as seen by ONE side.
///
/// Protocol "Simple" (NCCL's, on the Simple region of each slot): the sender's k-th slot
/// (k = *step at launch + i) waits until `head > k - nslots`, writes slot `k % nslots`,
/// fences, then stores `tail = k + 1`; the receiver waits until `tail > k`, reads the slot and
/// stores `head = k + 1`. Every counter starts at 0 and only grows; each kernel writes its new
/// position back to `*step`.
///
/// Protocol "LL" (low latency, items with `FLAG_LL`, on the LL region of each slot): step k
/// takes the same position k and the same flow control (the sender waits
/// `head > k - nslots`, the receiver stores `head = k + 1`), but the sender writes 8-byte
/// words {4 payload bytes, flag = (u32)(k + 1)} with single 64-bit stores and no fence or
/// `tail`; the receiver polls each word until its flag is (u32)(k + 1). Simple and LL steps
/// interleave freely on one connection: `tail` and `head` are absolute positions, and only
/// LL words ever land in the LL regions, whose older words carry older epochs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OxConn {
    /// Staging buffer, `nslots * slot_bytes`, in the receiver's memory (or host-mapped).
    pub buf: u64,
    /// u64 counter in the receiver's memory: slots filled by the sender, ever.
    pub tail: u64,
    /// u64 counter in the sender's memory: slots consumed by the receiver, ever.
    pub head: u64,
    /// u64 in this side's own memory: this side's persistent position, initially 0.
    pub step: u64,
    /// Bytes per slot (multiple of 4096).
    pub slot_bytes: u32,
    /// Slots in `buf` (power of two, >= 2).
    pub nslots: u32,
}

/// What a work item does (`OxKind` in C, variants `OX_KIND_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WorkKind {
    /// dst = post(pre(src)) for `count` elements (the op's transforms only with `FLAG_OPS`).
    Copy = 0,
    RingAllReduce = 1,
    RingAllGather = 2,
    RingReduceScatter = 3,
    RingBroadcast = 4,
    RingReduce = 5,
    /// `count` bytes from `src` through `send`.
    Send = 6,
    /// `count` bytes through `recv` into `dst`.
    Recv = 7,
    /// One-shot all-reduce (always LL): every rank writes its input to every peer and folds
    /// all ranks' values in rank order, so every rank computes the same bits in one hop. Its
    /// fan is nranks-1 peers (`fan_of`): the item carries the connections of peer k = 0 (send
    /// to rank+1, receive from rank-1) and is followed, on the same CTA, by nranks-2 `Peer`
    /// items with those of peer k = 1.. (send to rank+1+k, receive from rank-1-k).
    DirectAllReduce = 8,
    /// The connections (`send`, `recv`) of one more peer of the preceding item, whose fan is
    /// more than one; nothing else of it is read.
    Peer = 9,
}

/// Number of work kinds (one past the last kind).
pub const KIND_COUNT: u32 = 10;

/// Most peers an item may send to or receive from (its fan): the item itself and up to
/// `MAX_FAN - 1` `Peer` items after it. The one-shot all-reduce runs on at most
/// `MAX_FAN + 1` ranks.
pub const MAX_FAN: usize = 7;
/// The one-shot all-reduce runs on at most this many peers + 1 ranks.
pub const DIRECT_MAX_PEERS: usize = MAX_FAN;

/// `scalar` is a device pointer to the PreMulSum value.
pub const FLAG_SCALAR_DEVICE: u32 = 1;
/// Apply the op's pre/post transforms (reductions only).
pub const FLAG_OPS: u32 = 2;
/// Move the item's steps with the low-latency protocol (LL).
pub const FLAG_LL: u32 = 4;
/// RingAllGather: the first step also writes this rank's own block to the output (small
/// out-of-place all-gathers, whose own block is not worth a copy-engine copy).
pub const FLAG_OWN_BLOCK: u32 = 8;
/// Ring and P2P items of a yielding launch (`YIELD_KERNEL`): a wait on the item's send peer
/// may park the CTA (the peer is another process on this GPU, reached over the network, whose
/// proxy rings the bell).
pub const FLAG_PARK_SEND: u32 = 32;
/// As `FLAG_PARK_SEND`, for a wait on the item's receive peer. An LL step on such a
/// connection waits for the receive `tail` (which the proxy advances once the LL words are in
/// place) before its data, so that it can park before it moves anything.
pub const FLAG_PARK_RECV: u32 = 64;
/// RingAllGather / RingReduceScatter on a ring whose order is not rank order (the ranks of a
/// host are not contiguous): the blocks of the item's steps are those of the ranks at its
/// ring positions, read from the communicator's *ring table*, `i32[nranks]` in device memory
/// holding the rank at each position (little endian, written once at init); `offset` holds the
/// table's address, and `src` / `dst` already point at the item's range (its element offset
/// is added in). Never set on a ring in rank order, whose items are as without it.
pub const FLAG_RING_ORDER: u32 = 16;
/// An item whose receive connection has its slots in GPU memory, written by the network
/// (GPUDirect RDMA): every message lands at the start of its slot, so an LL step waits for
/// the receive `tail` (which the proxy advances once the message is in and flushed) and reads
/// its words at the slot's start instead of in the LL region (their layout is the LL
/// region's). Simple steps are as without it.
pub const FLAG_RECV_GPU: u32 = 128;
/// An item whose send connection has its slots in GPU memory, read by the network (GPUDirect
/// RDMA, NVIDIA's `NCCL_NET_GDR_READ`): a Simple step also writes the step word (the
/// message's trailer, the word the receiving proxy checks) right after its payload in the
/// slot, before the release of `tail`, since the proxy cannot write GPU memory; an LL step
/// writes its words in host memory the proxy polls, the send connection's *host LL regions*:
/// slot j's at `tail + SEND_LL_OFFSET + j * (slot_bytes / LL_REGION_DIV)`.
pub const FLAG_SEND_GPU: u32 = 256;
/// Bytes from a send connection's `tail` to its host LL regions (`FLAG_SEND_GPU`): the page
/// after the tail's.
pub const SEND_LL_OFFSET: u32 = 4096;

/// Every slot of a connection buffer has two disjoint regions, so Simple and LL uses of the
/// same connection never see each other's bytes: Simple data in the first
/// `slot_bytes - slot_bytes / LL_REGION_DIV` bytes, LL lines in the last
/// `slot_bytes / LL_REGION_DIV`. An LL line is one 8-byte word {4 data bytes, 4-byte flag},
/// so an LL step carries `slot_bytes / (2 * LL_REGION_DIV)` payload bytes.
pub const LL_REGION_DIV: u32 = 8;

/// Payload bytes of one Simple step: the Simple region of a slot (`ox_simple_bytes`).
pub fn simple_step_bytes(slot_bytes: u32) -> u32 {
    slot_bytes - slot_bytes / LL_REGION_DIV
}

/// Payload bytes of one LL step (`ox_ll_payload`): the LL region holds 8-byte words of
/// 4 payload bytes and a 4-byte flag.
pub fn ll_step_bytes(slot_bytes: u32) -> u32 {
    slot_bytes / (2 * LL_REGION_DIV)
}

/// Every Simple or LL step a sender fills also gets a step word, written by the sender beside
/// the receiver's `tail`: `u64` number `step % nslots` of an array at `tail +
/// STEP_WORDS_OFFSET` (the rest of the tail's 4 KiB page). The word is
/// `((step + 1) << 32) | bytes`, with `STEP_LL` set for an LL step: the step's epoch, its
/// payload bytes and its protocol. Kernels never read it; the proxy of a network connection
/// learns from it what to send (a Simple step once `tail` passes it, an LL step once the
/// words of its payload carry the epoch).
pub const STEP_WORDS_OFFSET: u32 = 128;
/// Set in a step word for a step moved with the LL protocol.
pub const STEP_LL: u32 = 0x8000_0000;
/// Most slots a connection may have: its step words fit the tail's page.
pub const MAX_NSLOTS: u32 = (4096 - STEP_WORDS_OFFSET) / 8;

/// Bytes per element of each data type code (`dtype`), four bits per code: code `t` in
/// bits `4t..4t + 4`. The kernels' one element-size table (`ox_esize`); `device/mod.rs`
/// checks it against `ncclDataType_t::size`.
pub const ELEM_SIZES: u64 = 0x1128_4288_4411;

/// Reduction op codes, as `OxWork::op` carries them (`RedOp::code`): NCCL's enum order,
/// PreMulSum after Avg.
pub mod op {
    pub const SUM: u32 = 0;
    pub const PROD: u32 = 1;
    pub const MAX: u32 = 2;
    pub const MIN: u32 = 3;
    pub const AVG: u32 = 4;
    pub const PREMULSUM: u32 = 5;
}

/// Data type codes, as `OxWork::dtype` carries them: the `ncclDataType_t` values.
pub mod dtype {
    pub const INT8: u32 = 0;
    pub const UINT8: u32 = 1;
    pub const INT32: u32 = 2;
    pub const UINT32: u32 = 3;
    pub const INT64: u32 = 4;
    pub const UINT64: u32 = 5;
    pub const HALF: u32 = 6;
    pub const FLOAT: u32 = 7;
    pub const DOUBLE: u32 = 8;
    pub const BF16: u32 = 9;
    pub const FP8E4M3: u32 = 10;
    pub const FP8E5M2: u32 = 11;
    /// Number of data types.
    pub const NTYPES: u32 = 12;
}

/// One unit of work for one CTA. Every CTA runs, in array order, the items whose `cta` is its
/// blockIdx.x. Ring items: `src`/`dst` are the task's user buffers, the item covers elements
/// [offset, offset+count) of the buffer (AllReduce, Broadcast, Reduce) or of every rank's
/// block of `block` elements (AllGather, ReduceScatter; with `FLAG_RING_ORDER`, `src`/`dst`
/// point at the range and `offset` at the ring table). Copy/Send/Recv: `src`/`dst` already
/// point at the item's part; Send/Recv count bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OxWork {
    pub src: u64,
    pub dst: u64,
    /// Elements (bytes for Send/Recv).
    pub count: u64,
    /// Element offset of this item's range (ring items); with `FLAG_RING_ORDER` the device
    /// address of the ring table instead.
    pub offset: u64,
    /// Elements per rank block (AllGather / ReduceScatter).
    pub block: u64,
    /// Elements per slot-sized piece (ring items; the same on every rank).
    pub chunk: u64,
    /// PreMulSum value bytes (little endian), or a device pointer (`FLAG_SCALAR_DEVICE`).
    pub scalar: u64,
    /// Device-visible address of a volatile uint32; non-zero = abort.
    pub abort_flag: u64,
    /// This rank -> next / peer.
    pub send: OxConn,
    /// Prev / peer -> this rank.
    pub recv: OxConn,
    /// What the item does: an `OxKind`.
    pub kind: u32,
    /// A data type code (`dtype`).
    pub dtype: u32,
    /// A reduction op code (`op`).
    pub op: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Ring items: this rank's position on the ring (position p sends to p + 1; the rank
    /// itself when the ring is in rank order). Other items: the rank.
    pub rank: i32,
    pub nranks: i32,
    /// Broadcast, Reduce: the root's ring position. Send, Recv: the peer (not read).
    pub root: i32,
    /// The CTA (blockIdx.x) that runs this item.
    pub cta: u32,
}

/// Most items `ox_kernel_inline` takes by value.
pub const INLINE_ITEMS: usize = 22;

/// The parameter of `ox_kernel_inline`: up to `INLINE_ITEMS` items passed by value (the
/// whole struct stays under the 4 KiB kernel-parameter limit).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OxInline {
    pub nitems: u32,
    pub pad: u32,
    pub items: [OxWork; INLINE_ITEMS],
}

/// Byte size of `OxConn` (checked against `size_of` in Rust and `sizeof` in C).
pub const CONN_SIZE: usize = 40;
/// Byte size of `OxWork` (checked against `size_of` in Rust and `sizeof` in C).
pub const WORK_SIZE: usize = 176;
/// Byte size of `OxInline` (checked against `size_of` in Rust and `sizeof` in C).
pub const INLINE_SIZE: usize = 3880;

/// Most work items one launch may carry.
pub const MAX_ITEMS: usize = 512;
/// Most threads per CTA `ox_kernel` may be launched with (its `__launch_bounds__`).
pub const MAX_THREADS: u32 = 512;

/// The communicator's status page (host-mapped, its device address in every item's
/// `abort_flag`): the u32 abort flag at offset 0, then from `PROGRESS_OFFSET` one *wait entry*
/// of `WAIT_ENTRY_BYTES` per CTA, CTA b's at `PROGRESS_OFFSET + WAIT_ENTRY_BYTES * b`, for
/// `PROGRESS_CTAS` CTAs: a u64 *wait word*, then the u64 device address the wait polls.
///
/// A CTA writes its entry (relaxed, system scope; the address first, then the word) only in
/// the abort poll of its one wait loop (`ox_spin`), that is after a thread of it has waited
/// `OX_ABORT_POLL` spins, and again every such poll while the wait lasts: what it waits for,
/// on which peer of which item, at which step, and where. A CTA that wrote its entry clears
/// its word (0) when its kernel ends, also on abort, so a non-zero word belongs to a running
/// kernel. Several threads of one CTA may write the entry; the last one stands (a reader may
/// see one thread's word with another's address). 0: nothing to say.
///
/// The address names the connection: a send slot wait polls the send connection's `head`, a
/// receive slot wait its receive connection's `tail`, an LL wait a word inside its receive
/// connection's `buf`; the host maps it back to the peer rank.
///
/// Layout of a non-zero word: bits 0..32 the low 32 bits of the position (step) waited on;
/// bits `WAIT_ITEM_SHIFT..+16` the index of the item in the launch's item list
/// (`WAIT_ITEM_UNKNOWN` when the waiting code does not know it); bits `WAIT_FAN_SHIFT..+8`
/// the fan index k of the peer (the item's k-th send or receive peer); bits
/// `WAIT_WHAT_SHIFT..+8` what is waited for (`WAIT_SEND_SLOT`, `WAIT_RECV_SLOT`,
/// `WAIT_LL_DATA`, never 0).
pub const PROGRESS_OFFSET: u32 = 64;
/// The status page's *bell*: a u32 at this offset that a yielding launch's stream waits on
/// (non-zero) between its kernels. A CTA that parks stores 0 (then, system-wide fenced,
/// checks its wait once more: if it is now satisfied it stores 1 again and does not park);
/// the proxy stores 1 once a parked CTA's wait is met (`PARK_OFFSET`); an abort stores 1.
/// It starts at 1.
pub const BELL_OFFSET: u32 = 8;
/// `ox_kernel_yield`'s `mode`: the first kernel of a yielding launch (every CTA starts at its
/// first item; the resume records are written, not read).
pub const YIELD_FRESH: u32 = 0;
/// A later kernel: every CTA goes on where its resume record says (or exits, done).
pub const YIELD_RESUME: u32 = 1;
/// The last kernel: as `YIELD_RESUME`, but no wait parks (it spins to the end).
pub const YIELD_LAST: u32 = 2;
/// A resume record (one u64 per CTA after the items' CTA table, 8-aligned): bits 0..32 the
/// item the CTA parked in, bits 32..64 the steps of that item it had completed; bits 0..32
/// `RESUME_DONE_ITEM`: the CTA has finished its items.
pub const RESUME_DONE_ITEM: u32 = 0xFFFF_FFFF;
/// CTAs with a wait entry on the status page (the planner's most CTAs a launch may have).
pub const PROGRESS_CTAS: u32 = 64;
/// Bytes of one CTA's wait entry: the wait word, then the address waited on.
pub const WAIT_ENTRY_BYTES: u32 = 16;
/// The status page's *park entries*, after the wait entries: CTA b's (b < `PROGRESS_CTAS`)
/// at `PARK_OFFSET + PARK_ENTRY_BYTES * b`, two u64s: the device address of the counter a
/// parked CTA waits on (a `head` or a `tail`; 0: none) and the value it waits for it to reach
/// (`>=`). A CTA of a yielding launch writes its entry when it parks (the value first) and
/// clears it when its next kernel starts; while the bell is 0 the proxy rings it as soon as
/// one entry's counter has reached its value. Only CTAs with an entry park.
pub const PARK_OFFSET: u32 = PROGRESS_OFFSET + WAIT_ENTRY_BYTES * PROGRESS_CTAS;
/// Bytes of one CTA's park entry.
pub const PARK_ENTRY_BYTES: u32 = 16;
/// Bytes of the status page.
pub const STATUS_PAGE_BYTES: u32 = PARK_OFFSET + PARK_ENTRY_BYTES * PROGRESS_CTAS;
/// Shift of the item index in a wait word.
pub const WAIT_ITEM_SHIFT: u32 = 32;
/// Shift of the fan index in a wait word.
pub const WAIT_FAN_SHIFT: u32 = 48;
/// Shift of the wait kind in a wait word.
pub const WAIT_WHAT_SHIFT: u32 = 56;
/// The item index of a wait word whose item the waiting code does not know.
pub const WAIT_ITEM_UNKNOWN: u32 = 0xFFFF;
/// Waits for a free slot of a send peer (`head + nslots > step`).
pub const WAIT_SEND_SLOT: u32 = 1;
/// Waits for a filled slot of a receive peer (Simple: `tail > step`).
pub const WAIT_RECV_SLOT: u32 = 2;
/// Waits for the LL words of a receive peer's step to carry its epoch.
pub const WAIT_LL_DATA: u32 = 3;
