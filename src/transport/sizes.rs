//! How big connection buffers are: the slots of every connection a transport allocates, the
//! small LL-only buffers of the one-shot all-reduce's rows, and `NCCL_BUFFSIZE`. Nothing
//! here depends on a transport's state, so the cost model can read the same figures it models
//! the steps with.

/// Bytes per slot of a connection (`NCCL_BUFFSIZE / NSLOTS` when that is set).
pub const SLOT_BYTES: u32 = 512 * 1024;
/// Slots per connection (a power of two).
pub const NSLOTS: u32 = 8;
/// Bytes per slot of the connections of the one-shot all-reduce's rows: it only uses LL
/// regions, so its buffers are small (an LL step there carries `DIRECT_SLOT_BYTES / 16`).
pub const DIRECT_SLOT_BYTES: u32 = 256 << 10;
/// Slots per connection of the one-shot all-reduce's rows.
pub const DIRECT_NSLOTS: u32 = 2;

const _: () = assert!(NSLOTS.is_power_of_two() && DIRECT_NSLOTS.is_power_of_two());
const _: () = assert!(NSLOTS <= crate::sched::device::MAX_NSLOTS);

/// Bytes and slots of the buffers of a connection on a one-shot row (`direct`) or any other.
pub fn row_buffers(direct: bool, configured_slot_bytes: u32) -> (u32, u32) {
    if direct {
        (DIRECT_SLOT_BYTES, DIRECT_NSLOTS)
    } else {
        (configured_slot_bytes, NSLOTS)
    }
}

/// `NCCL_BUFFSIZE`: bytes of one connection's staging buffer (default `SLOT_BYTES * NSLOTS`,
/// clamped to 64 KiB..256 MiB), split into `NSLOTS` slots of a multiple of 4 KiB.
pub fn configured_slot_bytes() -> u32 {
    slot_bytes_of(crate::env::registry::BUFFSIZE.int())
}

/// The slot size for a staging buffer of `total` bytes.
fn slot_bytes_of(total: i64) -> u32 {
    let total = total.clamp(64 << 10, 256 << 20);
    let slot = (total / NSLOTS as i64) / 4096 * 4096;
    slot.max(4096) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffsize_becomes_whole_pages_per_slot_within_bounds() {
        assert_eq!(slot_bytes_of(SLOT_BYTES as i64 * NSLOTS as i64), SLOT_BYTES);
        assert_eq!(slot_bytes_of(1 << 20), 128 << 10);
        assert_eq!(slot_bytes_of(1), 8 << 10, "at least 64 KiB in all");
        assert_eq!(slot_bytes_of(i64::MAX), 32 << 20, "at most 256 MiB in all");
        assert_eq!(slot_bytes_of((1 << 20) + 12345) % 4096, 0);
    }

    #[test]
    fn one_shot_rows_get_their_own_small_buffers() {
        assert_eq!(row_buffers(true, 4096), (DIRECT_SLOT_BYTES, DIRECT_NSLOTS));
        assert_eq!(row_buffers(false, 4096), (4096, NSLOTS));
    }
}
