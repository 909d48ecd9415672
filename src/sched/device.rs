//! The device-side handles the scheduler hands to the kernels, mirrored field by field in
//! `kernels/ox_abi.h`: `OxConn` (one direction of one connection as seen by one side) and
//! `OxWork` (one work item for one CTA), and their serialisation into the byte array the
//! kernel reads. The offsets below are the ones `ox_abi.h` static_asserts; a test checks the
//! Rust layout against them.

/// One direction of one connection (sender -> receiver) as seen by ONE side.
///
/// Protocol (NCCL's "Simple", on the first 7/8 of each slot): the sender's k-th slot (k = *step at launch + i) waits until
/// `head > k - nslots`, writes slot `k % nslots`, fences, then stores `tail = k + 1`; the
/// receiver waits until `tail > k`, reads the slot and stores `head = k + 1`. Every counter
/// starts at 0 and only grows; each kernel writes its new position back to `*step`.
///
/// Protocol "LL" (low latency, items with `FLAG_LL`, on the last 1/8 of each slot): step k
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

/// What a work item does (`OxKind` in C).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WorkKind {
    Copy = 0,
    RingAllReduce = 1,
    RingAllGather = 2,
    RingReduceScatter = 3,
    RingBroadcast = 4,
    RingReduce = 5,
    Send = 6,
    Recv = 7,
    /// One-shot all-reduce over LL; followed on its CTA by `nranks - 2` `DirectPeer` items
    /// carrying the connections of the other peers (see `OX_KIND_DIRECT_ALLREDUCE`).
    DirectAllReduce = 8,
    DirectPeer = 9,
}

/// `OX_DIRECT_MAX_PEERS`: the one-shot all-reduce runs on at most this many peers + 1 ranks.
pub const DIRECT_MAX_PEERS: usize = 7;

/// `scalar` is a device pointer to the PreMulSum value.
pub const FLAG_SCALAR_DEVICE: u32 = 1;
/// Apply the op's pre/post transforms (reductions only).
pub const FLAG_OPS: u32 = 2;
/// Move the item's steps with the low-latency protocol (`OX_FLAG_LL`).
pub const FLAG_LL: u32 = 4;
/// RingAllGather: the first step also writes this rank's own block to the output
/// (`OX_FLAG_OWN_BLOCK`; small out-of-place all-gathers, whose own block is not worth a
/// copy-engine copy).
pub const FLAG_OWN_BLOCK: u32 = 8;

/// `OX_LL_REGION_DIV`: the last `slot_bytes / LL_REGION_DIV` bytes of every slot are its LL
/// region, the rest its Simple region, so the two protocols never see each other's bytes.
pub const LL_REGION_DIV: u32 = 8;

/// Payload bytes of one Simple step (`ox_simple_bytes`).
pub fn simple_step_bytes(slot_bytes: u32) -> u32 {
    slot_bytes - slot_bytes / LL_REGION_DIV
}

/// Payload bytes of one LL step (`ox_ll_payload`): the LL region holds 8-byte words of
/// 4 payload bytes and a 4-byte flag.
pub fn ll_step_bytes(slot_bytes: u32) -> u32 {
    slot_bytes / (2 * LL_REGION_DIV)
}

/// One unit of work for one CTA (`OxWork` in C). See `kernels/ox_abi.h` for each field.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OxWork {
    pub src: u64,
    pub dst: u64,
    /// Elements (bytes for Send/Recv).
    pub count: u64,
    /// Element offset of this item's range (ring items).
    pub offset: u64,
    /// Elements per rank block (AllGather / ReduceScatter).
    pub block: u64,
    /// Elements per slot-sized piece (ring items; the same on every rank).
    pub chunk: u64,
    /// PreMulSum value bytes (little endian) or a device pointer (FLAG_SCALAR_DEVICE).
    pub scalar: u64,
    pub abort_flag: u64,
    pub send: OxConn,
    pub recv: OxConn,
    pub kind: u32,
    pub dtype: u32,
    pub op: u32,
    pub flags: u32,
    pub rank: i32,
    pub nranks: i32,
    pub root: i32,
    pub cta: u32,
}

/// Byte sizes and offsets, as `kernels/ox_abi.h` asserts them.
pub const CONN_SIZE: usize = 40;
pub const WORK_SIZE: usize = 176;
/// Most items `ox_kernel_inline` takes by value (`OX_INLINE_ITEMS`), and the size of its
/// parameter struct `OxInline` (`OX_INLINE_SIZE`: nitems, pad, then the items).
pub const INLINE_ITEMS: usize = 22;
pub const INLINE_SIZE: usize = 8 + INLINE_ITEMS * WORK_SIZE;
const _: () = assert!(INLINE_SIZE == 3880);

/// Most work items one launch may carry (`OX_MAX_ITEMS`).
pub const MAX_ITEMS: usize = 512;
pub const CONN_OFFSETS: [usize; 6] = [0, 8, 16, 24, 32, 36];
pub const WORK_OFFSETS: [usize; 18] = [
    0, 8, 16, 24, 32, 40, 48, 56, 64, 104, 144, 148, 152, 156, 160, 164, 168, 172,
];

impl OxConn {
    fn write(&self, out: &mut [u8]) {
        let words = [self.buf, self.tail, self.head, self.step];
        for (i, w) in words.iter().enumerate() {
            out[CONN_OFFSETS[i]..CONN_OFFSETS[i] + 8].copy_from_slice(&w.to_le_bytes());
        }
        out[CONN_OFFSETS[4]..CONN_OFFSETS[4] + 4].copy_from_slice(&self.slot_bytes.to_le_bytes());
        out[CONN_OFFSETS[5]..CONN_OFFSETS[5] + 4].copy_from_slice(&self.nslots.to_le_bytes());
    }

    fn read(b: &[u8]) -> OxConn {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        OxConn {
            buf: u64_at(CONN_OFFSETS[0]),
            tail: u64_at(CONN_OFFSETS[1]),
            head: u64_at(CONN_OFFSETS[2]),
            step: u64_at(CONN_OFFSETS[3]),
            slot_bytes: u32_at(CONN_OFFSETS[4]),
            nslots: u32_at(CONN_OFFSETS[5]),
        }
    }
}

impl OxWork {
    /// An item of `kind` with every other field zero.
    pub fn new(kind: WorkKind) -> OxWork {
        OxWork {
            src: 0,
            dst: 0,
            count: 0,
            offset: 0,
            block: 0,
            chunk: 0,
            scalar: 0,
            abort_flag: 0,
            send: OxConn::default(),
            recv: OxConn::default(),
            kind: kind as u32,
            dtype: 0,
            op: 0,
            flags: 0,
            rank: 0,
            nranks: 0,
            root: 0,
            cta: 0,
        }
    }

    /// Append the C layout of this item (little endian, as on every CUDA host) to `out`.
    pub fn serialize_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + WORK_SIZE, 0);
        let b = &mut out[start..];
        let o = &WORK_OFFSETS;
        let words = [
            self.src,
            self.dst,
            self.count,
            self.offset,
            self.block,
            self.chunk,
            self.scalar,
            self.abort_flag,
        ];
        for (i, w) in words.iter().enumerate() {
            b[o[i]..o[i] + 8].copy_from_slice(&w.to_le_bytes());
        }
        self.send.write(&mut b[o[8]..o[8] + CONN_SIZE]);
        self.recv.write(&mut b[o[9]..o[9] + CONN_SIZE]);
        let halfs = [
            self.kind,
            self.dtype,
            self.op,
            self.flags,
            self.rank as u32,
            self.nranks as u32,
            self.root as u32,
            self.cta,
        ];
        for (i, h) in halfs.iter().enumerate() {
            b[o[10 + i]..o[10 + i] + 4].copy_from_slice(&h.to_le_bytes());
        }
    }

    /// Read back one item from its C layout (`b` holds at least `WORK_SIZE` bytes).
    pub fn deserialize(b: &[u8]) -> OxWork {
        let o = &WORK_OFFSETS;
        let u64_at = |i: usize| u64::from_le_bytes(b[o[i]..o[i] + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(b[o[i]..o[i] + 4].try_into().unwrap());
        OxWork {
            src: u64_at(0),
            dst: u64_at(1),
            count: u64_at(2),
            offset: u64_at(3),
            block: u64_at(4),
            chunk: u64_at(5),
            scalar: u64_at(6),
            abort_flag: u64_at(7),
            send: OxConn::read(&b[o[8]..o[8] + CONN_SIZE]),
            recv: OxConn::read(&b[o[9]..o[9] + CONN_SIZE]),
            kind: u32_at(10),
            dtype: u32_at(11),
            op: u32_at(12),
            flags: u32_at(13),
            rank: u32_at(14) as i32,
            nranks: u32_at(15) as i32,
            root: u32_at(16) as i32,
            cta: u32_at(17),
        }
    }
}

/// Decode a whole item array (as `Plan::items`).
pub fn deserialize_all(items: &[u8]) -> Vec<OxWork> {
    items
        .chunks_exact(WORK_SIZE)
        .map(OxWork::deserialize)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn conn_layout_matches_c_header() {
        assert_eq!(size_of::<OxConn>(), CONN_SIZE);
        assert_eq!(align_of::<OxConn>(), 8);
        let got = [
            offset_of!(OxConn, buf),
            offset_of!(OxConn, tail),
            offset_of!(OxConn, head),
            offset_of!(OxConn, step),
            offset_of!(OxConn, slot_bytes),
            offset_of!(OxConn, nslots),
        ];
        assert_eq!(got, CONN_OFFSETS);
    }

    #[test]
    fn work_layout_matches_c_header() {
        assert_eq!(size_of::<OxWork>(), WORK_SIZE);
        let got = [
            offset_of!(OxWork, src),
            offset_of!(OxWork, dst),
            offset_of!(OxWork, count),
            offset_of!(OxWork, offset),
            offset_of!(OxWork, block),
            offset_of!(OxWork, chunk),
            offset_of!(OxWork, scalar),
            offset_of!(OxWork, abort_flag),
            offset_of!(OxWork, send),
            offset_of!(OxWork, recv),
            offset_of!(OxWork, kind),
            offset_of!(OxWork, dtype),
            offset_of!(OxWork, op),
            offset_of!(OxWork, flags),
            offset_of!(OxWork, rank),
            offset_of!(OxWork, nranks),
            offset_of!(OxWork, root),
            offset_of!(OxWork, cta),
        ];
        assert_eq!(got, WORK_OFFSETS);
    }

    #[test]
    fn header_asserts_the_same_numbers() {
        let header = include_str!("../../kernels/ox_abi.h");
        assert!(header.contains(&format!("#define OX_CONN_SIZE {CONN_SIZE}")));
        assert!(header.contains(&format!("#define OX_WORK_SIZE {WORK_SIZE}")));
        assert!(header.contains(&format!("#define OX_LL_REGION_DIV {LL_REGION_DIV}")));
        for (name, value) in [
            ("SCALAR_DEVICE", FLAG_SCALAR_DEVICE),
            ("OPS", FLAG_OPS),
            ("LL", FLAG_LL),
            ("OWN_BLOCK", FLAG_OWN_BLOCK),
        ] {
            assert!(
                header.contains(&format!("#define OX_FLAG_{name} {value}u")),
                "OX_FLAG_{name}"
            );
        }
        for (field, off) in ["src", "block", "abort_flag", "send", "recv", "kind", "cta"]
            .iter()
            .zip([0usize, 32, 56, 64, 104, 144, 172])
        {
            assert!(
                header.contains(&format!("offsetof(OxWork, {field}) == {off}")),
                "{field}"
            );
        }
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
        assert_eq!(&bytes[64 + 32..64 + 36], &524288u32.to_le_bytes());
        assert_eq!(&bytes[104 + 36..104 + 40], &4u32.to_le_bytes());
        assert_eq!(&bytes[144..148], &1u32.to_le_bytes());
        assert_eq!(&bytes[160..164], &[0xff; 4]);
        assert_eq!(&bytes[172..176], &7u32.to_le_bytes());
    }
}
