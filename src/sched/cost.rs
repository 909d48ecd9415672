//! The cost model that picks, for each task, the algorithm and the number of channels (CTAs),
//! and the recommended connection constants the transports use.
//!
//! Model (times in µs, bytes in bytes, bandwidths in GB/s = 1e3 bytes/µs). For a ring
//! collective moving `wire` bytes over each rank's outgoing link, split over `nch` channels:
//!
//! ```text
//! t(nch) = LAUNCH_US + fill_hops * HOP_US                      (pipeline fill: first slot's trip)
//!        + wire / min(nch * CHANNEL_GBPS, LINK_GBPS) / 1e3      (bandwidth)
//!        + ceil(wire / nch / slot) * SLOT_OVERHEAD_US            (per-slot handshakes, per CTA)
//!        + nch * CHANNEL_US                                      (each CTA's start-up)
//! ```
//! `fill_hops` is 2(n-1) for AllReduce, n-1 for the others; `wire` is 2(n-1)/n·S for
//! AllReduce of S bytes, (n-1)·s for AllGather/ReduceScatter of s bytes per rank and S for
//! Broadcast/Reduce. The channel count is the argmin over 1..=max, so tiny messages use one
//! CTA (latency terms dominate) and large ones enough CTAs to saturate the link. P2P
//! operations use a channel count that depends only on their byte count, so that the sender
//! and the receiver, which plan independently, split the bytes the same way.

use super::CollKind;

/// Recommended bytes per slot of every connection (the transports allocate these).
pub const SLOT_BYTES: u32 = 512 * 1024;
/// Recommended slots per connection (power of two).
pub const NSLOTS: u32 = 8;
/// Recommended ring channels (`Geometry::nchannels`): on 2 H200s busbw rose with every step
/// from 24 to 64 channels (docs/bench.md, 2026-11-30 sweep).
pub const NCHANNELS: u32 = 64;
/// Threads per CTA of `ox_kernel` (must not exceed OX_MAX_THREADS in kernels/ox_abi.h).
pub const BLOCK_THREADS: u32 = 512;
/// Most CTAs one launch uses; every CTA must be resident at once (they wait on each other),
/// so this stays well below the SM count of any supported GPU (H100/H200: 132).
pub const MAX_CTAS: u32 = 64;
/// Most channels one P2P operation is split over (per peer and direction).
pub const P2P_MAX_CHANNELS: u32 = 16;
/// P2P bytes per channel before another channel is added.
pub const P2P_BYTES_PER_CHANNEL: u64 = 1 << 20;

pub const LAUNCH_US: f64 = 6.0;
pub const HOP_US: f64 = 1.5;
pub const CHANNEL_GBPS: f64 = 6.0;
pub const LINK_GBPS: f64 = 380.0;
pub const SLOT_OVERHEAD_US: f64 = 0.5;
pub const CHANNEL_US: f64 = 0.2;

/// How a task is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    /// A local copy (one-rank communicators, self sends).
    Copy,
    /// Ring (chain for Broadcast/Reduce) over channel connections.
    Ring,
    /// Direct sends and receives over per-peer connections.
    P2p,
}

/// The algorithm for a task of `kind` on `nranks` ranks.
pub fn algorithm(kind: CollKind, nranks: i32) -> Algo {
    match kind {
        CollKind::AlltoAll
        | CollKind::Gather
        | CollKind::Scatter
        | CollKind::Send
        | CollKind::Recv => Algo::P2p,
        _ if nranks <= 1 => Algo::Copy,
        _ => Algo::Ring,
    }
}

/// (pipeline-fill hops, bytes over each rank's outgoing link) of a ring collective of
/// `bytes` (the user's count × element size).
fn ring_shape(kind: CollKind, bytes: u64, nranks: i32) -> (f64, f64) {
    let n = nranks.max(1) as f64;
    let b = bytes as f64;
    match kind {
        CollKind::AllReduce => (2.0 * (n - 1.0), 2.0 * (n - 1.0) / n * b),
        CollKind::AllGather | CollKind::ReduceScatter => (n - 1.0, (n - 1.0) * b),
        _ => (n - 1.0, b),
    }
}

/// Modelled time in µs of a ring collective on `nch` channels.
pub fn ring_time_us(kind: CollKind, bytes: u64, nranks: i32, nch: u32) -> f64 {
    let (hops, wire) = ring_shape(kind, bytes, nranks);
    let nch = nch.max(1) as f64;
    let bw = (nch * CHANNEL_GBPS).min(LINK_GBPS) * 1e3;
    let slots = (wire / nch / SLOT_BYTES as f64).ceil();
    LAUNCH_US + hops * HOP_US + wire / bw + slots * SLOT_OVERHEAD_US + nch * CHANNEL_US
}

/// Channels for a ring collective: the modelled optimum in 1..=max_channels, raised to
/// `NCCL_MIN_NCHANNELS` (or `NCCL_MIN_CTAS`) when set, as in NVIDIA's library.
pub fn ring_channels(kind: CollKind, bytes: u64, nranks: i32, max_channels: u32) -> u32 {
    let best = (1..=max_channels.max(1))
        .min_by(|&a, &b| {
            ring_time_us(kind, bytes, nranks, a).total_cmp(&ring_time_us(kind, bytes, nranks, b))
        })
        .unwrap_or(1);
    best.max(min_channels_setting().min(max_channels.max(1)))
}

/// The user's channel floor, read once (1 when unset).
fn min_channels_setting() -> u32 {
    static MIN: once_cell::sync::Lazy<u32> = once_cell::sync::Lazy::new(|| {
        let v = crate::env::int("NCCL_MIN_CTAS", crate::env::int("NCCL_MIN_NCHANNELS", 1));
        v.clamp(1, MAX_CTAS as i64) as u32
    });
    *MIN
}

/// Channels for a local copy of `bytes` (about 8 MiB per CTA, at most `max_channels`).
pub fn copy_channels(bytes: u64, max_channels: u32) -> u32 {
    (bytes.div_ceil(8 << 20)).clamp(1, max_channels.max(1) as u64) as u32
}

/// Channels for one P2P operation of `bytes`: a function of the bytes and the communicator's
/// channel count only, identical on both sides.
pub fn p2p_channels(bytes: u64, nchannels: u32) -> u32 {
    let max = P2P_MAX_CHANNELS.min(nchannels).max(1) as u64;
    bytes.div_ceil(P2P_BYTES_PER_CHANNEL).clamp(1, max) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_messages_use_one_channel_large_ones_many() {
        for n in [2, 4, 8] {
            assert_eq!(ring_channels(CollKind::AllReduce, 8, n, NCHANNELS), 1);
            assert!(ring_channels(CollKind::AllGather, 1024, n, NCHANNELS) <= 2);
            let big = ring_channels(CollKind::AllReduce, 256 << 20, n, NCHANNELS);
            assert!(big >= 16, "n={n}: {big} channels for 256 MiB");
        }
        // More bytes never means fewer channels.
        let mut last = 1;
        for shift in 3..34 {
            let c = ring_channels(CollKind::AllReduce, 1u64 << shift, 4, NCHANNELS);
            assert!(c >= last, "{c} < {last} at 2^{shift}");
            last = c;
        }
    }

    #[test]
    fn large_allreduce_is_link_bound() {
        // 128 MiB on 4 ranks: ~201 MB over the link at 380 GB/s is ~530 µs (NVIDIA: 611 µs).
        let c = ring_channels(CollKind::AllReduce, 128 << 20, 4, NCHANNELS);
        let t = ring_time_us(CollKind::AllReduce, 128 << 20, 4, c);
        assert!((500.0..650.0).contains(&t), "{t} µs");
        // A small message is latency bound, well under NVIDIA's 30 µs.
        assert!(ring_time_us(CollKind::AllReduce, 8, 4, 1) < 30.0);
    }

    #[test]
    fn algorithms() {
        assert_eq!(algorithm(CollKind::AllReduce, 1), Algo::Copy);
        assert_eq!(algorithm(CollKind::AllReduce, 2), Algo::Ring);
        assert_eq!(algorithm(CollKind::Broadcast, 4), Algo::Ring);
        assert_eq!(algorithm(CollKind::AlltoAll, 1), Algo::P2p);
        assert_eq!(algorithm(CollKind::Send, 4), Algo::P2p);
    }

    #[test]
    fn p2p_channels_depend_on_bytes_only() {
        assert_eq!(p2p_channels(0, 24), 1);
        assert_eq!(p2p_channels(8, 24), 1);
        assert_eq!(p2p_channels(3 << 20, 24), 3);
        assert_eq!(p2p_channels(1 << 30, 24), P2P_MAX_CHANNELS);
        assert_eq!(p2p_channels(1 << 30, 4), 4);
        assert!(copy_channels(1 << 30, 24) == 24 && copy_channels(1, 24) == 1);
    }
}
