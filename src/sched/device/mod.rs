//! The device-side handles the scheduler hands to the kernels. `kernel_abi` defines them once
//! (`OxConn`, `OxWork`, `OxInline`, `WorkKind`, the flag, op, type and protocol constants),
//! and `kernels/ox_abi.h` is generated from it. This module owns what ties that definition
//! to the rest of the crate: compile-time checks that the layouts have the asserted sizes and
//! no padding, that the op and type codes are `RedOp::code` and the `ncclDataType_t` values,
//! and the serialisation of items into the bytes the kernels read.

mod kernel_abi;

pub use kernel_abi::*;

/// The entry that runs a plan's work items: `ox_kernel(const OxWork* items, uint32_t nitems)`.
pub const MAIN_KERNEL: &str = "ox_kernel";
/// The same kernel taking up to `INLINE_ITEMS` items by value (`OxInline`).
pub const INLINE_KERNEL: &str = "ox_kernel_inline";
/// The kernel of a yielding launch: `ox_kernel_yield(const OxWork* items, uint32_t nitems,
/// uint32_t mode, uint32_t park_ns)`, its input as `yield_input` lays it out (`YIELD_*`).
pub const YIELD_KERNEL: &str = "ox_kernel_yield";
/// A copy without work items: `ox_copy_kernel(char* dst, const char* src, uint64_t bytes)`,
/// one contiguous part per CTA (`plan::CopyBy::Kernel`).
pub const COPY_KERNEL: &str = "ox_copy_kernel";

use crate::abi::ncclDataType_t;
use crate::sched::redop::{RedOp, Scalar};
use std::mem::{offset_of, size_of, size_of_val};

const _: () = assert!(
    cfg!(target_endian = "little"),
    "the kernels read little endian"
);
const _: () = assert!(size_of::<OxConn>() == CONN_SIZE);
const _: () = assert!(size_of::<OxWork>() == WORK_SIZE);
const _: () = assert!(size_of::<OxInline>() == INLINE_SIZE);
const _: () = assert!(size_of::<WorkKind>() == size_of::<u32>());
const _: () = assert!(WorkKind::Peer as u32 + 1 == KIND_COUNT);
const _: () = assert!(super::cost::BLOCK_THREADS <= MAX_THREADS);
const _: () = assert!(PROGRESS_CTAS == super::cost::MAX_CTAS);
const _: () = assert!(PROGRESS_OFFSET >= 4 && PROGRESS_OFFSET.is_multiple_of(8));
const _: () = assert!(MAX_ITEMS < WAIT_ITEM_UNKNOWN as usize);
const _: () = assert!(MAX_FAN < 256);
const _: () = assert!(
    (FLAG_SCALAR_DEVICE | FLAG_OPS | FLAG_LL | FLAG_OWN_BLOCK | FLAG_RING_ORDER).count_ones() == 5,
    "every flag its own bit"
);

/// Bytes of `c`'s fields; equal to `size_of::<OxConn>()` exactly when it has no padding. The
/// exhaustive pattern stops compiling when a field is added without being counted here.
const fn conn_field_bytes(c: &OxConn) -> usize {
    let OxConn {
        buf,
        tail,
        head,
        step,
        slot_bytes,
        nslots,
    } = c;
    size_of_val(buf)
        + size_of_val(tail)
        + size_of_val(head)
        + size_of_val(step)
        + size_of_val(slot_bytes)
        + size_of_val(nslots)
}

/// Bytes of `w`'s fields (nested structs counted whole, checked by their own assertion).
const fn work_field_bytes(w: &OxWork) -> usize {
    let OxWork {
        src,
        dst,
        count,
        offset,
        block,
        chunk,
        scalar,
        abort_flag,
        send,
        recv,
        kind,
        dtype,
        op,
        flags,
        rank,
        nranks,
        root,
        cta,
    } = w;
    size_of_val(src)
        + size_of_val(dst)
        + size_of_val(count)
        + size_of_val(offset)
        + size_of_val(block)
        + size_of_val(chunk)
        + size_of_val(scalar)
        + size_of_val(abort_flag)
        + size_of_val(send)
        + size_of_val(recv)
        + size_of_val(kind)
        + size_of_val(dtype)
        + size_of_val(op)
        + size_of_val(flags)
        + size_of_val(rank)
        + size_of_val(nranks)
        + size_of_val(root)
        + size_of_val(cta)
}

/// Bytes of `p`'s fields.
const fn inline_field_bytes(p: &OxInline) -> usize {
    let OxInline { nitems, pad, items } = p;
    size_of_val(nitems) + size_of_val(pad) + size_of_val(items)
}

// No padding anywhere: every byte of the structs is a field's, so `as_bytes` reads only
// initialised memory, and C (which lays out the same fields in the same order, and whose
// `sizeof` ox_abi.h asserts equal to the same sizes) has every field at Rust's offset.
const _: () = assert!(conn_field_bytes(&OxConn::ZERO) == size_of::<OxConn>());
const _: () = assert!(work_field_bytes(&OxWork::ZERO) == size_of::<OxWork>());
const _: () = assert!(inline_field_bytes(&OxInline::ZERO) == size_of::<OxInline>());

/// The device op code of `op`, by the op alone: what `RedOp::code` returns.
pub const fn op_code(op: RedOp) -> u32 {
    match op {
        RedOp::Sum => op::SUM,
        RedOp::Prod => op::PROD,
        RedOp::Max => op::MAX,
        RedOp::Min => op::MIN,
        RedOp::Avg => op::AVG,
        RedOp::PreMulSum(_) => op::PREMULSUM,
    }
}

/// The device type code of `t` (an exhaustive match, so a new type needs a code here).
const fn dtype_code(t: ncclDataType_t) -> u32 {
    use ncclDataType_t::*;
    match t {
        ncclInt8 => dtype::INT8,
        ncclUint8 => dtype::UINT8,
        ncclInt32 => dtype::INT32,
        ncclUint32 => dtype::UINT32,
        ncclInt64 => dtype::INT64,
        ncclUint64 => dtype::UINT64,
        ncclFloat16 => dtype::HALF,
        ncclFloat32 => dtype::FLOAT,
        ncclFloat64 => dtype::DOUBLE,
        ncclBfloat16 => dtype::BF16,
        ncclFloat8e4m3 => dtype::FP8E4M3,
        ncclFloat8e5m2 => dtype::FP8E5M2,
        ncclNumTypes => dtype::NTYPES,
    }
}

/// Items carry `ncclDataType_t as u32` as their type code: every value must be the code the
/// kernels switch on.
const _: () = {
    let mut i = 0;
    while i < ncclDataType_t::ALL.len() {
        let t = ncclDataType_t::ALL[i];
        assert!(dtype_code(t) == t as u32);
        i += 1;
    }
    assert!(dtype_code(ncclDataType_t::ncclNumTypes) == ncclDataType_t::ncclNumTypes as u32);
    assert!(ncclDataType_t::ALL.len() == dtype::NTYPES as usize);
};

/// The op codes are NCCL's enum order, PreMulSum after Avg: distinct and below 6.
const _: () = {
    let ops = [
        RedOp::Sum,
        RedOp::Prod,
        RedOp::Max,
        RedOp::Min,
        RedOp::Avg,
        RedOp::PreMulSum(Scalar::Host([0; 8])),
    ];
    let mut i = 0;
    while i < ops.len() {
        assert!(op_code(ops[i]) == i as u32);
        i += 1;
    }
};

impl OxConn {
    /// A connection with every field zero.
    pub const ZERO: OxConn = OxConn {
        buf: 0,
        tail: 0,
        head: 0,
        step: 0,
        slot_bytes: 0,
        nslots: 0,
    };
}

impl OxWork {
    /// An item with every field zero (kind `Copy`).
    pub const ZERO: OxWork = OxWork {
        src: 0,
        dst: 0,
        count: 0,
        offset: 0,
        block: 0,
        chunk: 0,
        scalar: 0,
        abort_flag: 0,
        send: OxConn::ZERO,
        recv: OxConn::ZERO,
        kind: 0,
        dtype: 0,
        op: 0,
        flags: 0,
        rank: 0,
        nranks: 0,
        root: 0,
        cta: 0,
    };

    /// An item of `kind` with every other field zero.
    pub fn new(kind: WorkKind) -> OxWork {
        OxWork {
            kind: kind as u32,
            ..OxWork::ZERO
        }
    }

    /// The C layout of this item: its own bytes (little endian, as on every CUDA host).
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: OxWork is #[repr(C)] and made only of integers (OxConn included) with no
        // padding (the const assertions above), so all size_of::<OxWork>() bytes behind
        // `self` are initialised; u8 needs no alignment, and the slice borrows `self`.
        unsafe {
            std::slice::from_raw_parts((self as *const OxWork).cast::<u8>(), size_of::<OxWork>())
        }
    }

    /// Append the C layout of this item to `out`.
    pub fn serialize_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }

    /// Read back one item from its C layout (`b` holds at least `WORK_SIZE` bytes).
    pub fn deserialize(b: &[u8]) -> OxWork {
        let b = &b[..WORK_SIZE];
        // SAFETY: `b` holds size_of::<OxWork>() readable bytes (the slice above panics
        // otherwise); every bit pattern is a valid OxWork, whose fields are all integers;
        // read_unaligned accepts any alignment of the byte slice.
        unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<OxWork>()) }
    }
}

impl OxInline {
    /// A parameter with every field zero.
    pub const ZERO: OxInline = OxInline {
        nitems: 0,
        pad: 0,
        items: [OxWork::ZERO; INLINE_ITEMS],
    };
}

/// The bytes of `ox_kernel_inline`'s parameter (`OxInline`) for `nitems` items, given as
/// their serialised array `items` (at most `INLINE_ITEMS` of them).
pub fn inline_param(nitems: u32, items: &[u8]) -> Vec<u8> {
    let mut blob = vec![0u8; INLINE_SIZE];
    let at = offset_of!(OxInline, nitems);
    blob[at..at + size_of::<u32>()].copy_from_slice(&nitems.to_le_bytes());
    let at = offset_of!(OxInline, items);
    blob[at..at + items.len()].copy_from_slice(items);
    blob
}

/// `ox_kernel`'s input: `items` (serialised, sorted by CTA), then `u32 first[grid + 1]`, CTA
/// b's items being `first[b]..first[b + 1]`, so that every CTA reads only its own items.
pub fn with_cta_table(items: &[u8], grid: u32) -> Vec<u8> {
    let ctas: Vec<u32> = items
        .chunks_exact(WORK_SIZE)
        .map(|item| OxWork::deserialize(item).cta)
        .collect();
    let mut out = items.to_vec();
    for b in 0..=grid {
        let first = ctas.partition_point(|&c| c < b) as u32;
        out.extend_from_slice(&first.to_le_bytes());
    }
    out
}

/// `ox_kernel_yield`'s input: `with_cta_table(items, grid)`, zeros to the next multiple of
/// 8 bytes, then one u64 resume record per CTA (written by the launch's first kernel).
pub fn yield_input(items: &[u8], grid: u32) -> Vec<u8> {
    let mut out = with_cta_table(items, grid);
    out.resize(out.len().next_multiple_of(8) + 8 * grid as usize, 0);
    out
}

/// The bytes of a ring table (`FLAG_RING_ORDER`): the rank at each ring position, as
/// little-endian `i32`s.
pub fn ring_table_bytes(ranks: &[i32]) -> Vec<u8> {
    ranks.iter().flat_map(|r| r.to_le_bytes()).collect()
}

/// Decode a whole item array (as `Plan::items`).
pub fn deserialize_all(items: &[u8]) -> Vec<OxWork> {
    items
        .chunks_exact(WORK_SIZE)
        .map(OxWork::deserialize)
        .collect()
}

/// What a CTA's wait word (`PROGRESS_OFFSET`) says it waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitFor {
    /// A free slot of send peer `fan` (`WAIT_SEND_SLOT`).
    SendSlot,
    /// A filled slot of receive peer `fan` (`WAIT_RECV_SLOT`).
    RecvSlot,
    /// The LL words of receive peer `fan` (`WAIT_LL_DATA`).
    LlData,
    /// A kind this build does not know (the code).
    Other(u8),
}

/// A decoded wait word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitWord {
    pub what: WaitFor,
    /// The fan index k of the peer (the item's k-th send or receive peer).
    pub fan: u8,
    /// The item's index in the launch's item list, when the kernel knew it.
    pub item: Option<u16>,
    /// The low 32 bits of the position waited on.
    pub step: u32,
}

/// One CTA's wait as the host reads it from the status page: its decoded word and, when its
/// address belongs to a connection, the peer rank it waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuWait {
    pub cta: u32,
    pub wait: WaitWord,
    pub peer: Option<i32>,
}

/// Decodes a wait word; None for 0 (nothing written).
pub fn decode_wait(word: u64) -> Option<WaitWord> {
    if word == 0 {
        return None;
    }
    let what = match (word >> WAIT_WHAT_SHIFT) as u8 {
        c if c as u32 == WAIT_SEND_SLOT => WaitFor::SendSlot,
        c if c as u32 == WAIT_RECV_SLOT => WaitFor::RecvSlot,
        c if c as u32 == WAIT_LL_DATA => WaitFor::LlData,
        c => WaitFor::Other(c),
    };
    let item = (word >> WAIT_ITEM_SHIFT) as u16;
    Some(WaitWord {
        what,
        fan: (word >> WAIT_FAN_SHIFT) as u8,
        item: (item as u32 != WAIT_ITEM_UNKNOWN).then_some(item),
        step: word as u32,
    })
}

#[cfg(test)]
mod tests {
    /// A wait word as the kernel composes it (`ox_wait_word` in prims.cuh).
    fn word(what: u32, fan: u32, item: u32, step: u32) -> u64 {
        ((what as u64) << WAIT_WHAT_SHIFT)
            | ((fan as u64) << WAIT_FAN_SHIFT)
            | ((item as u64) << WAIT_ITEM_SHIFT)
            | step as u64
    }

    #[test]
    fn wait_words_decode() {
        assert_eq!(decode_wait(0), None);
        assert_eq!(
            decode_wait(word(WAIT_RECV_SLOT, 0, 2, 17)),
            Some(WaitWord {
                what: WaitFor::RecvSlot,
                fan: 0,
                item: Some(2),
                step: 17
            })
        );
        assert_eq!(
            decode_wait(word(WAIT_SEND_SLOT, 6, 511, u32::MAX)),
            Some(WaitWord {
                what: WaitFor::SendSlot,
                fan: 6,
                item: Some(511),
                step: u32::MAX
            })
        );
        let ll = decode_wait(word(WAIT_LL_DATA, 3, WAIT_ITEM_UNKNOWN, 5)).unwrap();
        assert_eq!(
            (ll.what, ll.fan, ll.item, ll.step),
            (WaitFor::LlData, 3, None, 5)
        );
        assert_eq!(
            decode_wait(word(9, 0, 0, 0)).map(|w| w.what),
            Some(WaitFor::Other(9))
        );
        // The fields do not overlap: the step's top bit is not the item's.
        assert_eq!(decode_wait(1 << 31).unwrap().item, Some(0));
    }
    use super::*;
    use std::mem::align_of;

    #[test]
    fn layouts_are_the_kernels() {
        assert_eq!(align_of::<OxConn>(), 8);
        assert_eq!(align_of::<OxWork>(), 8);
        assert_eq!(offset_of!(OxWork, send), 64);
        assert_eq!(offset_of!(OxWork, recv), 64 + CONN_SIZE);
        assert_eq!(offset_of!(OxWork, cta), WORK_SIZE - 4);
        assert_eq!(offset_of!(OxInline, items), 8);
    }

    #[test]
    fn codes_come_from_the_rust_sources() {
        for op in [RedOp::Sum, RedOp::Avg, RedOp::PreMulSum(Scalar::Device(8))] {
            assert_eq!(op.code(), op_code(op));
        }
        assert_eq!(ncclDataType_t::ncclBfloat16 as u32, dtype::BF16);
        assert_eq!(WorkKind::RingAllReduce as u32, 1);
    }

    #[test]
    fn element_size_table_is_the_types_sizes() {
        for t in ncclDataType_t::ALL {
            let packed = (ELEM_SIZES >> (4 * t as u32)) & 15;
            assert_eq!(packed as usize, t.size(), "{t:?}");
        }
        assert_eq!(
            ELEM_SIZES >> (4 * dtype::NTYPES),
            0,
            "no size past the last type"
        );
    }

    #[test]
    fn serialise_round_trip_and_raw_bytes() {
        let mut w = OxWork::new(WorkKind::RingAllReduce);
        w.src = 0x1122_3344_5566_7788;
        w.count = 12345;
        w.send = OxConn {
            buf: 1,
            tail: 2,
            head: 3,
            step: 4,
            slot_bytes: 524288,
            nslots: 8,
        };
        w.recv.nslots = 4;
        w.rank = -1;
        w.cta = 7;
        let mut bytes = Vec::new();
        w.serialize_into(&mut bytes);
        assert_eq!(bytes.len(), WORK_SIZE);
        assert_eq!(OxWork::deserialize(&bytes), w);
        assert_eq!(bytes[0], 0x88);
        assert_eq!(&bytes[16..24], &12345u64.to_le_bytes());
        assert_eq!(&bytes[64 + 24..64 + 32], &4u64.to_le_bytes());
        assert_eq!(&bytes[64 + 32..64 + 36], &524288u32.to_le_bytes());
        assert_eq!(&bytes[104 + 36..104 + 40], &4u32.to_le_bytes());
        assert_eq!(&bytes[144..148], &1u32.to_le_bytes());
        assert_eq!(&bytes[160..164], &[0xff; 4]);
        assert_eq!(&bytes[172..176], &7u32.to_le_bytes());
    }

    #[test]
    fn deserialise_reads_unaligned_bytes() {
        let mut w = OxWork::new(WorkKind::Send);
        w.dst = u64::MAX - 1;
        w.root = i32::MIN;
        let mut bytes = vec![0u8; 3];
        w.serialize_into(&mut bytes);
        bytes.extend_from_slice(OxWork::new(WorkKind::Recv).as_bytes());
        assert_eq!(OxWork::deserialize(&bytes[3..]), w);
        assert_eq!(deserialize_all(&bytes[3..]).len(), 2);
    }

    #[test]
    fn inline_param_layout() {
        let mut items = Vec::new();
        OxWork::new(WorkKind::Copy).serialize_into(&mut items);
        OxWork::new(WorkKind::Recv).serialize_into(&mut items);
        let blob = inline_param(2, &items);
        assert_eq!(blob.len(), INLINE_SIZE);
        assert_eq!(&blob[..4], &2u32.to_le_bytes());
        assert_eq!(&blob[8..8 + 2 * WORK_SIZE], &items[..]);
        assert!(blob[8 + 2 * WORK_SIZE..].iter().all(|&b| b == 0));
    }
}
