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
//!
//! Protocol: a ring collective also has an LL time (no per-slot handshake, a cheaper hop,
//! half the bandwidth per CTA since every 8-byte word carries 4 payload bytes):
//!
//! ```text
//! t_ll(nch) = LAUNCH_US + fill_hops * LL_HOP_US + wire / min(nch * LL_CHANNEL_GBPS, LINK_GBPS / 2) / 1e3
//!           + ceil(wire / nch / ll_step) * LL_STEP_US + nch * CHANNEL_US
//! ```
//! and takes LL when its best time beats Simple's and the task is at most `LL_MAX_BYTES`.
//! P2P operations take LL up to `P2P_LL_MAX_BYTES`. Every input of the choice is the same on
//! every rank. `NCCL_PROTO` (read once, here) can exclude either protocol.
//!
//! Over the network (a `NetLink`: the bandwidth B and latency λ the network's properties
//! report, the slowest over the communicator's ranks, as NCCL takes the slowest link of a
//! ring), ring collectives and the P2P operations with a peer reached over it use another
//! model: the link is `L = min(B, LINK_GBPS)`, every hop adds the proxy's two hand-offs and λ,
//! and since a message (one step of a channel) is received whole before the next rank can
//! use it, each hop after the first adds one message's time on the link:
//!
//! ```text
//! t_net(nch) = LAUNCH_US + hops * (HOP_US + NET_HOP_US + λ)                 (LL: LL_HOP_US)
//!            + (hops - 1) * msg * nch / bw + wire / bw                        (store and forward, bandwidth)
//!            + nch * ceil(wire / nch / step) * NET_MSG_US                     (the proxy, message by message)
//!            + nch * (CHANNEL_US + NET_CHANNEL_US)                            (LL: LL_CHANNEL_US)
//!            [LL: + 2 * wire / NET_LL_COPY_GBPS]                              (the proxy copies LL lines)
//! ```
//! with `msg = min(step, chunk / nch)` (`chunk`: what one ring step moves over all channels),
//! `bw = L * (1 - exp(-nch * CHANNEL_GBPS / L))` for Simple and `min(nch * LL_CHANNEL_GBPS,
//! L / 2)` for LL (an LL line carries 8 payload bytes in 16 on the wire). A P2P operation is
//! one hop with `wire = chunk = bytes`; its channel count is the model's optimum within the
//! P2P channel range, a function of its kind, its bytes and the link, the same at both ends.
//! A slow link thus takes LL for small messages only (its doubled bytes cost more than the
//! handshakes it saves), except along a broadcast or reduce chain of 3 hops or more, where
//! Simple's 14-times larger steps, each forwarded only once whole, cost more than LL's
//! doubled bytes up to `LL_MAX_BYTES`. The model alone would give a slow link one channel;
//! the channels are raised to the in-node model's choice, because a channel keeps only about
//! one slot in flight per hop (measured: `ring_plan_net_with`).

use super::options::TaskOptions;
use super::proto::Proto;
use super::CollKind;

/// The buffers the transports allocate (`transport::sizes`), whose steps the model counts.
pub use crate::transport::sizes::{DIRECT_NSLOTS, DIRECT_SLOT_BYTES, NSLOTS, SLOT_BYTES};
/// Recommended ring channels (`Geometry::nchannels`): on 2 H200s busbw rose with every step
/// from 24 to 64 channels (docs/bench.md, 2026-11-30 sweep).
pub const NCHANNELS: u32 = 64;
/// Threads per CTA of `ox_kernel` (must not exceed OX_MAX_THREADS in kernels/ox_abi.h).
pub const BLOCK_THREADS: u32 = 512;
/// Most CTAs one launch uses; every CTA must be resident at once (they wait on each other),
/// so this stays well below the SM count of any supported GPU (H100/H200: 132).
pub const MAX_CTAS: u32 = 64;
/// Most channels one P2P operation is split over (per peer and direction): on 2 H200s a
/// 512 MiB sendrecv reached 312 GB/s with 16, 340 GB/s with 32 and 203 GB/s with 64 (send and
/// receive CTAs then exceed `MAX_CTAS` and share CTAs) (docs/bench.md, 2 × H200).
pub const P2P_MAX_CHANNELS: u32 = 32;
/// P2P bytes per channel before another channel is added (one CTA moves about 20 GB/s).
pub const P2P_BYTES_PER_CHANNEL: u64 = 256 << 10;

// Constants fitted to forced-protocol, forced-channel sweeps of GPU time (CUDA graph
// replays) on 2 H200s (docs/bench.md, "Sweeps behind the cost model"): a Simple all-reduce takes about
// 11 µs on 8 channels and 14 µs on 32-64 for 16 KiB, and moves 4 MiB at 160 / 315 / 365 GB/s
// on 8 / 32 / 64 channels, which `LINK_GBPS * (1 - exp(-nch * CHANNEL_GBPS / LINK_GBPS))`
// follows; an LL ring all-reduce starts at about 8 µs, a one-shot one at about 4.4 µs; an LL
// channel moves about 4 GB/s of payload.
pub const LAUNCH_US: f64 = 3.0;
pub const HOP_US: f64 = 3.5;
pub const CHANNEL_GBPS: f64 = 20.0;
pub const LINK_GBPS: f64 = 380.0;
pub const SLOT_OVERHEAD_US: f64 = 0.5;
pub const CHANNEL_US: f64 = 0.1;
pub const LL_HOP_US: f64 = 1.3;
pub const LL_CHANNEL_GBPS: f64 = 4.0;
pub const LL_CHANNEL_US: f64 = 0.08;
pub const LL_STEP_US: f64 = 0.1;
/// Largest ring collective (task bytes) that may take LL while Simple is allowed.
pub const LL_MAX_BYTES: u64 = 512 << 10;
/// Largest P2P operation (bytes) that takes LL while Simple is allowed.
pub const P2P_LL_MAX_BYTES: u64 = 64 << 10;

// Over the network: estimates of the proxy's costs, not yet fitted to a run across machines
// (the one-GPU runs over loopback are bound by the GPU's time slices between processes,
// docs/bench.md). The link's own bandwidth and latency come from the network's properties.
/// The proxy's two hand-offs per hop: the sender's noticing a filled slot and posting it, the
/// receiver's completing the receive and raising `tail`.
pub const NET_HOP_US: f64 = 4.0;
/// The proxy's work per message (post, test, trailer), one thread for every channel.
pub const NET_MSG_US: f64 = 1.0;
/// Each channel's network sides in the proxy's loop.
pub const NET_CHANNEL_US: f64 = 0.5;
/// How fast a proxy copies LL lines on the CPU: a sending proxy copies every LL message into
/// its bounce area, a receiving one into the LL region, one 8-byte store per line.
pub const NET_LL_COPY_GBPS: f64 = 10.0;
/// The speed taken for a device whose properties give none (0 or less): NCCL's default for
/// a socket device, 10 Gbit/s.
pub const NET_DEFAULT_MBPS: i32 = 10_000;

/// A network link as the cost model sees it: plain numbers from the network's properties
/// (`ncclNetProperties_t.speed` and `.latency`), the same on every rank of a communicator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NetLink {
    /// Bandwidth in GB/s (1e3 bytes/µs).
    pub gbps: f64,
    /// One-way latency in µs.
    pub latency_us: f64,
}

impl NetLink {
    /// A device of `speed_mbps` Mbit/s (0 or less: `NET_DEFAULT_MBPS`) and `latency_us` µs
    /// (negative or not a number: 0).
    pub fn from_properties(speed_mbps: i32, latency_us: f32) -> NetLink {
        let mbps = if speed_mbps > 0 {
            speed_mbps
        } else {
            NET_DEFAULT_MBPS
        };
        let latency = latency_us as f64;
        NetLink {
            gbps: mbps as f64 / 8000.0,
            latency_us: if latency.is_finite() && latency > 0.0 {
                latency
            } else {
                0.0
            },
        }
    }

    /// The slower of two links: the lesser bandwidth and the greater latency (a ring is as
    /// fast as its slowest link).
    pub fn slowest(self, other: NetLink) -> NetLink {
        NetLink {
            gbps: self.gbps.min(other.gbps),
            latency_us: self.latency_us.max(other.latency_us),
        }
    }

    /// Two devices used side by side (a rank's channels spread over its devices): the
    /// bandwidths add, the greater latency counts.
    pub fn beside(self, other: NetLink) -> NetLink {
        NetLink {
            gbps: self.gbps + other.gbps,
            latency_us: self.latency_us.max(other.latency_us),
        }
    }

    /// The bandwidth a ring or a send gets in GB/s: the link's, at most the in-node
    /// `LINK_GBPS`, and never zero.
    fn usable_gbps(self) -> f64 {
        if self.gbps.is_finite() {
            self.gbps.clamp(1e-3, LINK_GBPS)
        } else {
            LINK_GBPS
        }
    }
}

/// Modelled time in µs of `hops` sequential hops over the network link `link` on `nch`
/// channels with `proto`, moving `wire` bytes over each rank's link in ring steps of `chunk`
/// bytes (over all channels): `t_net` of the module's doc.
pub fn net_time_us(proto: Proto, hops: f64, wire: f64, chunk: f64, nch: u32, link: NetLink) -> f64 {
    let l = link.usable_gbps();
    let nch = nch.max(1) as f64;
    let (gbps, hop_us, channel_us, copy_us) = match proto {
        Proto::Simple => (
            l * (1.0 - (-nch * CHANNEL_GBPS / l).exp()),
            HOP_US,
            CHANNEL_US,
            0.0,
        ),
        Proto::Ll => (
            (nch * LL_CHANNEL_GBPS).min(l / 2.0),
            LL_HOP_US,
            LL_CHANNEL_US,
            2.0 * wire / (NET_LL_COPY_GBPS * 1e3),
        ),
    };
    let bw = gbps * 1e3;
    let step = proto.step_bytes(SLOT_BYTES) as f64;
    let msg = step.min(chunk / nch);
    let msgs = nch * (wire / nch / step).ceil();
    LAUNCH_US
        + hops * (hop_us + NET_HOP_US + link.latency_us)
        + (hops - 1.0).max(0.0) * msg * nch / bw
        + wire / bw
        + msgs * NET_MSG_US
        + copy_us
        + nch * (channel_us + NET_CHANNEL_US)
}

/// Bytes one ring step of a ring collective of `bytes` moves over all channels: a rank's
/// share of an all-reduce, one rank's block of an all-gather or reduce-scatter, the whole
/// buffer along the chain of a broadcast or reduce.
fn ring_chunk(kind: CollKind, bytes: u64, nranks: i32) -> f64 {
    match kind {
        CollKind::AllReduce => bytes as f64 / nranks.max(1) as f64,
        _ => bytes as f64,
    }
}

/// Modelled time in µs of a ring collective on `nch` channels with `proto` when its ring
/// crosses the network link `link`.
pub fn ring_time_net_us(
    proto: Proto,
    kind: CollKind,
    bytes: u64,
    nranks: i32,
    nch: u32,
    link: NetLink,
) -> f64 {
    let (hops, wire) = ring_shape(kind, bytes, nranks);
    net_time_us(
        proto,
        hops,
        wire,
        ring_chunk(kind, bytes, nranks),
        nch,
        link,
    )
}

/// Modelled time in µs of a P2P operation of `bytes` over the network link `link` on `nch`
/// channels with `proto`: one hop.
pub fn p2p_time_net_us(proto: Proto, bytes: u64, nch: u32, link: NetLink) -> f64 {
    let b = bytes as f64;
    net_time_us(proto, 1.0, b, b, nch, link)
}

/// The protocols `NCCL_PROTO` allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Protocols {
    pub simple: bool,
    pub ll: bool,
}

impl Protocols {
    /// `proto` alone.
    pub fn only(proto: Proto) -> Protocols {
        Protocols {
            simple: proto == Proto::Simple,
            ll: proto == Proto::Ll,
        }
    }

    /// Whether `proto` is allowed.
    pub fn allows(self, proto: Proto) -> bool {
        match proto {
            Proto::Simple => self.simple,
            Proto::Ll => self.ll,
        }
    }
}

/// Parse NCCL's protocol list: comma separated, case-insensitive names; a leading `^`
/// excludes the listed ones instead. `LL128` (and unknown names) are accepted and ignored.
/// If nothing we implement is left, Simple is used.
pub fn parse_protocols(spec: &str) -> Protocols {
    let spec = spec.trim();
    if spec.is_empty() {
        return Protocols {
            simple: true,
            ll: true,
        };
    }
    let (exclude, list) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let mut simple = false;
    let mut ll = false;
    for name in list.split(',').map(str::trim) {
        if name.eq_ignore_ascii_case("simple") {
            simple = true;
        } else if name.eq_ignore_ascii_case("ll") {
            ll = true;
        }
    }
    let p = if exclude {
        Protocols {
            simple: !simple,
            ll: !ll,
        }
    } else {
        Protocols { simple, ll }
    };
    if !p.simple && !p.ll {
        return Protocols {
            simple: true,
            ll: false,
        };
    }
    p
}

#[cfg(test)]
thread_local! {
    /// Tests force a protocol choice per thread (the simulator runs LL-only and Simple-only).
    pub static TEST_PROTOCOLS: std::cell::Cell<Option<Protocols>> = const { std::cell::Cell::new(None) };
}

/// `NCCL_PROTO` (read again after a settings reload).
pub fn protocols() -> Protocols {
    #[cfg(test)]
    if let Some(p) = TEST_PROTOCOLS.with(|t| t.get()) {
        return p;
    }
    static P: crate::env::Cached<Protocols> = crate::env::Cached::new(|| {
        let spec = crate::env::registry::PROTO.string();
        let p = parse_protocols(&spec);
        if !spec.is_empty() {
            crate::info!(INIT, "NCCL_PROTO={spec}: Simple {}, LL {}", p.simple, p.ll);
        }
        p
    });
    P.get()
}

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
    // Channels add bandwidth until the link saturates, with diminishing returns on the way.
    let bw = LINK_GBPS * (1.0 - (-nch * CHANNEL_GBPS / LINK_GBPS).exp()) * 1e3;
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

/// Modelled time in µs of a ring collective on `nch` channels with the LL protocol.
pub fn ring_time_ll_us(kind: CollKind, bytes: u64, nranks: i32, nch: u32) -> f64 {
    let (hops, wire) = ring_shape(kind, bytes, nranks);
    let nch = nch.max(1) as f64;
    let bw = (nch * LL_CHANNEL_GBPS).min(LINK_GBPS / 2.0) * 1e3;
    let step = super::device::ll_step_bytes(SLOT_BYTES) as f64;
    let steps = (wire / nch / step).ceil();
    LAUNCH_US + hops * LL_HOP_US + wire / bw + steps * LL_STEP_US + nch * LL_CHANNEL_US
}

/// Modelled time in µs of a ring collective on `nch` channels with protocol `proto`.
pub fn ring_time_proto_us(proto: Proto, kind: CollKind, bytes: u64, nranks: i32, nch: u32) -> f64 {
    match proto {
        Proto::Simple => ring_time_us(kind, bytes, nranks, nch),
        Proto::Ll => ring_time_ll_us(kind, bytes, nranks, nch),
    }
}

/// What bounds one task's plan: its channel range and the protocols and algorithms it may
/// use. The communicator's settings (`NCCL_MIN_CTAS`, its channels, `NCCL_PROTO`,
/// `NCCL_ALGO`), narrowed by the task's own options (`TaskOptions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The channel floor (at most `max_channels`).
    pub min_channels: u32,
    pub max_channels: u32,
    pub protocols: Protocols,
    pub algorithms: Algorithms,
}

impl Limits {
    /// The limits of a task with options `opts` on a communicator of `nchannels` channels.
    pub fn of(nchannels: u32, opts: &TaskOptions) -> Limits {
        let max = opts.max_channels(nchannels);
        Limits {
            min_channels: opts.min_channels(min_channels_setting(), max),
            max_channels: max,
            protocols: protocols(),
            algorithms: opts.algorithms_with(algorithms()),
        }
    }

    /// The communicator's limits on `max_channels` channels with the protocols `allowed` and
    /// every algorithm (the plain call's, with the protocols given).
    fn plain(max_channels: u32, allowed: Protocols) -> Limits {
        let max = max_channels.max(1);
        Limits {
            min_channels: min_channels_setting().min(max),
            max_channels: max,
            protocols: allowed,
            algorithms: Algorithms { one_shot: true },
        }
    }
}

/// Protocol and channels for a ring collective under the protocols `allowed`.
pub fn ring_plan_with(
    kind: CollKind,
    bytes: u64,
    nranks: i32,
    max_channels: u32,
    allowed: Protocols,
) -> (Proto, u32) {
    ring_plan_in(kind, bytes, nranks, &Limits::plain(max_channels, allowed))
}

/// Protocol and channels for a ring collective within the limits `lim`.
pub fn ring_plan_in(kind: CollKind, bytes: u64, nranks: i32, lim: &Limits) -> (Proto, u32) {
    ring_choice(bytes, lim, &|proto, c| {
        ring_time_proto_us(proto, kind, bytes, nranks, c)
    })
}

/// Protocol and channels for a ring collective that crosses the network link `link`, under
/// the protocols `allowed`: the protocol and channels of the network model, the channels
/// raised to what the in-node model gives that protocol, but not beyond `net_channel_cap` of
/// the link.
///
/// Why never fewer channels than in a node: a channel of a ring keeps about one slot in
/// flight per hop (each step waits for the peer's), so over the network its throughput is a
/// slot per round trip through both proxies and the peer's kernel, a time no network
/// property reports. Measured on one H200 with ranks in processes claiming separate hosts
/// (docs/bench.md): the network model's one channel for a 10 Gbit/s link gave
/// 0.11 of NVIDIA's socket transport's busbw at 16 MiB and more; the in-node choice gave
/// 1.06. NVIDIA's library, too, runs several channels per network device.
pub fn ring_plan_net_with(
    kind: CollKind,
    bytes: u64,
    nranks: i32,
    max_channels: u32,
    allowed: Protocols,
    link: NetLink,
) -> (Proto, u32) {
    let lim = Limits::plain(max_channels, allowed);
    ring_plan_net_in(kind, bytes, nranks, &lim, link)
}

/// `ring_plan_net_with` within the limits `lim`.
pub fn ring_plan_net_in(
    kind: CollKind,
    bytes: u64,
    nranks: i32,
    lim: &Limits,
    link: NetLink,
) -> (Proto, u32) {
    ring_plan_net_routed(kind, bytes, nranks, lim, &|_| link, net_channel_cap(link))
}

/// `ring_plan_net_in` where the link depends on the channels: `link_of(nch)` is what channels
/// `0..nch` get together (their network devices side by side, `NetView::link_for`), and the
/// floor raises them to at most `cap` (`NetView::channel_cap`).
pub fn ring_plan_net_routed(
    kind: CollKind,
    bytes: u64,
    nranks: i32,
    lim: &Limits,
    link_of: &dyn Fn(u32) -> NetLink,
    cap: u32,
) -> (Proto, u32) {
    let (proto, nch) = ring_choice(bytes, lim, &|proto, c| {
        ring_time_net_us(proto, kind, bytes, nranks, c, link_of(c))
    });
    let only = Limits {
        protocols: Protocols::only(proto),
        ..*lim
    };
    let (_, floor) = ring_plan_in(kind, bytes, nranks, &only);
    (proto, floor.min(cap).max(nch))
}

/// Most ring channels (each a TCP connection or queue pair per device) per Gbit/s of the
/// network link: through a slow link's shallow buffer many connections that each carry a
/// small part of a collective lose packets together and wait out retransmission timeouts.
/// Measured over a veth shaped to 1000 Mbit/s (`scripts/tcp-flows.sh`: tbf, 10 ms burst, 50
/// ms queue): 16 MiB over 64 connections at a time moved at 443 Mbit/s, over 32 at 977 with
/// one round in six at 450, over 2-16 at 960-967; 64 MiB over 64 at 970. At 4000 Mbit/s 64
/// connections kept the rate.
pub const NET_CHANNELS_PER_GBIT: f64 = 16.0;

/// Most channels the network model raises a ring to over `link` (`NET_CHANNELS_PER_GBIT`,
/// at least 2).
pub fn net_channel_cap(link: NetLink) -> u32 {
    let gbit = if link.gbps.is_finite() {
        link.gbps * 8.0
    } else {
        f64::MAX
    };
    (gbit * NET_CHANNELS_PER_GBIT).clamp(2.0, u32::MAX as f64) as u32
}

/// The protocol and channels with the modelled times `time(proto, nch)`: each protocol's
/// best channel count in `lo..=hi`, raised to `floor`, and LL when allowed and faster, and
/// `ll_small_enough` while Simple is allowed.
fn choose(
    (lo, hi): (u32, u32),
    floor: u32,
    ll_small_enough: bool,
    allowed: Protocols,
    time: &dyn Fn(Proto, u32) -> f64,
) -> (Proto, u32) {
    let best_by = |proto: Proto| {
        let best = (lo..=hi)
            .min_by(|&a, &b| time(proto, a).total_cmp(&time(proto, b)))
            .unwrap_or(lo)
            .max(floor);
        (best, time(proto, best))
    };
    let (simple_nch, simple_t) = best_by(Proto::Simple);
    if !allowed.ll {
        return (Proto::Simple, simple_nch);
    }
    let (ll_nch, ll_t) = best_by(Proto::Ll);
    if !allowed.simple || (ll_small_enough && ll_t < simple_t) {
        (Proto::Ll, ll_nch)
    } else {
        (Proto::Simple, simple_nch)
    }
}

/// `choose` for a ring collective of `bytes` within the limits `lim` (LL up to
/// `LL_MAX_BYTES`).
fn ring_choice(bytes: u64, lim: &Limits, time: &dyn Fn(Proto, u32) -> f64) -> (Proto, u32) {
    let max = lim.max_channels.max(1);
    let floor = lim.min_channels.min(max);
    choose((1, max), floor, bytes <= LL_MAX_BYTES, lim.protocols, time)
}

/// Protocol and channels for a ring collective, under `NCCL_PROTO`.
pub fn ring_plan(kind: CollKind, bytes: u64, nranks: i32, max_channels: u32) -> (Proto, u32) {
    ring_plan_with(kind, bytes, nranks, max_channels, protocols())
}

/// Protocol and channels for a ring collective whose ring crosses the network link `link`,
/// under `NCCL_PROTO`.
pub fn ring_plan_net(
    kind: CollKind,
    bytes: u64,
    nranks: i32,
    max_channels: u32,
    link: NetLink,
) -> (Proto, u32) {
    ring_plan_net_with(kind, bytes, nranks, max_channels, protocols(), link)
}

/// The protocol of a P2P operation of `bytes` under the protocols `allowed` (a function of
/// the bytes only, so sender and receiver agree): LL when allowed and small enough.
pub fn p2p_proto_with(bytes: u64, allowed: Protocols) -> Proto {
    if allowed.ll && (!allowed.simple || bytes <= P2P_LL_MAX_BYTES) {
        Proto::Ll
    } else {
        Proto::Simple
    }
}

/// The protocol of a P2P operation of `bytes`, under `NCCL_PROTO`.
pub fn p2p_proto(bytes: u64) -> Proto {
    p2p_proto_with(bytes, protocols())
}

/// Most channels (and rows of connections) of the one-shot all-reduce.
pub const DIRECT_MAX_CHANNELS: u32 = 32;
/// Largest all-reduce (bytes) that may take the one-shot path.
pub const DIRECT_MAX_BYTES: u64 = 256 << 10;

/// Modelled time in µs of a one-shot all-reduce on `nch` channels: one LL hop, and every
/// rank's CTAs write its whole input to each of the n-1 peers and read theirs.
pub fn direct_time_us(bytes: u64, nranks: i32, nch: u32) -> f64 {
    let peers = (nranks.max(2) - 1) as f64;
    let nch = nch.max(1) as f64;
    let b = bytes as f64;
    let step = super::device::ll_step_bytes(DIRECT_SLOT_BYTES) as f64;
    let steps = (b / nch / step).ceil().max(1.0);
    let bw = (nch * LL_CHANNEL_GBPS).min(LINK_GBPS / 2.0) * 1e3;
    LAUNCH_US + LL_HOP_US + peers * b / bw + steps * LL_STEP_US + nch * LL_CHANNEL_US
}

/// How an all-reduce is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllReducePlan {
    /// One-shot on `nch` channels (LL).
    Direct { nch: u32 },
    /// Ring with protocol `proto` on `nch` channels.
    Ring { proto: Proto, nch: u32 },
}

/// The all-reduce plan under the protocols and algorithms `allowed`: the one-shot path when
/// LL and the one-shot path are allowed, the ranks are at most `DIRECT_MAX_PEERS + 1`, the
/// message at most `DIRECT_MAX_BYTES`, and the model says it beats the ring.
pub fn allreduce_plan_with(
    bytes: u64,
    nranks: i32,
    max_channels: u32,
    allowed: Protocols,
    algos: Algorithms,
) -> AllReducePlan {
    let lim = Limits {
        algorithms: algos,
        ..Limits::plain(max_channels, allowed)
    };
    allreduce_plan_in(bytes, nranks, &lim)
}

/// `allreduce_plan_with` within the limits `lim`.
pub fn allreduce_plan_in(bytes: u64, nranks: i32, lim: &Limits) -> AllReducePlan {
    let (proto, nch) = ring_plan_in(CollKind::AllReduce, bytes, nranks, lim);
    let direct_ok = lim.protocols.ll
        && lim.algorithms.one_shot
        && (2..=super::device::DIRECT_MAX_PEERS as i32 + 1).contains(&nranks)
        && bytes <= DIRECT_MAX_BYTES;
    if !direct_ok {
        return AllReducePlan::Ring { proto, nch };
    }
    let ring_t = ring_time_proto_us(proto, CollKind::AllReduce, bytes, nranks, nch);
    let max_channels = lim.max_channels;
    let floor = lim
        .min_channels
        .min(DIRECT_MAX_CHANNELS.min(max_channels).max(1));
    let dnch = (1..=DIRECT_MAX_CHANNELS.min(max_channels).max(1))
        .min_by(|&a, &b| {
            direct_time_us(bytes, nranks, a).total_cmp(&direct_time_us(bytes, nranks, b))
        })
        .unwrap_or(1)
        .max(floor);
    if direct_time_us(bytes, nranks, dnch) < ring_t {
        AllReducePlan::Direct { nch: dnch }
    } else {
        AllReducePlan::Ring { proto, nch }
    }
}

/// The all-reduce plan under `NCCL_PROTO` and `NCCL_ALGO`.
pub fn allreduce_plan(bytes: u64, nranks: i32, max_channels: u32) -> AllReducePlan {
    allreduce_plan_with(bytes, nranks, max_channels, protocols(), algorithms())
}

/// Modelled time in µs of a collective of `bytes` on `nranks` ranks, with the algorithm,
/// protocol and channels the planner picks for it (`ncclGroupSimulateEnd`).
pub fn planned_time_us(kind: CollKind, bytes: u64, nranks: i32, max_channels: u32) -> f64 {
    if kind == CollKind::AllReduce {
        return match allreduce_plan(bytes, nranks, max_channels) {
            AllReducePlan::Direct { nch } => direct_time_us(bytes, nranks, nch),
            AllReducePlan::Ring { proto, nch } => {
                ring_time_proto_us(proto, kind, bytes, nranks, nch)
            }
        };
    }
    let (proto, nch) = ring_plan(kind, bytes, nranks, max_channels);
    ring_time_proto_us(proto, kind, bytes, nranks, nch)
}

/// `planned_time_us` for a communicator whose rings cross the network link `net` (None:
/// no network).
pub fn planned_time_on(
    kind: CollKind,
    bytes: u64,
    nranks: i32,
    max_channels: u32,
    net: Option<NetLink>,
) -> f64 {
    match net {
        None => planned_time_us(kind, bytes, nranks, max_channels),
        Some(link) => {
            let (proto, nch) = ring_plan_net(kind, bytes, nranks, max_channels, link);
            ring_time_net_us(proto, kind, bytes, nranks, nch, link)
        }
    }
}

/// The user's channel floor (1 when unset; read again after a settings reload).
fn min_channels_setting() -> u32 {
    static MIN: crate::env::Cached<u32> = crate::env::Cached::new(|| {
        use crate::env::registry as reg;
        let v = reg::MIN_CTAS.int_or(reg::MIN_NCHANNELS.int_or(reg::MIN_NRINGS.int()));
        v.clamp(1, MAX_CTAS as i64) as u32
    });
    MIN.get()
}

/// Smallest local copy of a multi-rank plan (an own block, a send to self) that goes to the
/// copy engine beside the kernel: smaller ones are kernel work, since forking and joining the
/// side stream costs more host time (about 5 µs) than they take. The copies of a plan with no
/// kernel (a one-rank communicator's) are a copy-kernel launch or a copy-engine call on the
/// user's stream, no fork (`copy_kernel_ctas`).
pub const COPY_ENGINE_MIN_BYTES: u64 = 1 << 20;

/// Most CTAs of one copy in the kernel (a one-rank PreMulSum, a small copy of a multi-rank
/// plan).
pub const COPY_MAX_CHANNELS: u32 = MAX_CTAS;

/// A copy of a plan with no kernel below this many bytes is a `COPY_KERNEL` launch (on the
/// H100 a launch costs the caller about 1 µs less than a `cuMemcpyDtoDAsync`, and the kernel
/// keeps up with the copy engine while the data fits in L2); larger ones go to the copy engine.
pub const COPY_KERNEL_MAX: u64 = 4 << 20;

/// Bytes per CTA of `COPY_KERNEL`: it copies without waiting on anything, so it spreads wide
/// (16 KiB is two loads of 16 bytes per thread).
pub const COPY_KERNEL_CTA_BYTES: u64 = 16 << 10;

/// Most CTAs of `COPY_KERNEL` (its CTAs need not be resident together).
pub const COPY_KERNEL_MAX_CTAS: u32 = 1024;

/// `COPY_KERNEL_MAX`, or `OXCCL_ONE_RANK_KERNEL_COPY_MAX` where set (for measuring where the
/// copy engine starts to pay).
pub fn copy_kernel_max() -> u64 {
    static MAX: crate::env::Cached<u64> = crate::env::Cached::new(|| {
        let v = crate::env::registry::ONE_RANK_KERNEL_COPY_MAX.int_or(COPY_KERNEL_MAX as i64);
        v.max(0) as u64
    });
    MAX.get()
}

/// `COPY_KERNEL_CTA_BYTES`, or `OXCCL_ONE_RANK_COPY_CTA_BYTES` where set.
fn copy_kernel_cta_bytes() -> u64 {
    static BYTES: crate::env::Cached<u64> = crate::env::Cached::new(|| {
        let v = crate::env::registry::ONE_RANK_COPY_CTA_BYTES.int_or(COPY_KERNEL_CTA_BYTES as i64);
        v.max(16) as u64
    });
    BYTES.get()
}

/// Threads per CTA of `COPY_KERNEL`: `BLOCK_THREADS`, or `OXCCL_ONE_RANK_COPY_THREADS` where
/// set to a multiple of 32 in 32..=512.
pub fn copy_kernel_threads() -> u32 {
    static THREADS: crate::env::Cached<u64> = crate::env::Cached::new(|| {
        match crate::env::registry::ONE_RANK_COPY_THREADS.int_or(BLOCK_THREADS as i64) {
            n if (32..=BLOCK_THREADS as i64).contains(&n) && n % 32 == 0 => n as u64,
            _ => BLOCK_THREADS as u64,
        }
    });
    THREADS.get() as u32
}

/// The CTAs of `COPY_KERNEL` for a copy of `bytes` in a plan with no kernel, one per
/// `copy_kernel_cta_bytes()`; None from `copy_kernel_max()` up (the copy engine's).
pub fn copy_kernel_ctas(bytes: u64) -> Option<u32> {
    if bytes >= copy_kernel_max() {
        return None;
    }
    let ctas = bytes.div_ceil(copy_kernel_cta_bytes());
    Some(ctas.clamp(1, COPY_KERNEL_MAX_CTAS as u64) as u32)
}

/// Bytes per CTA of a one-rank copy in kernel items (a group of several): nothing else runs,
/// so it spreads wide.
pub const ONE_RANK_COPY_BYTES_PER_CHANNEL: u64 = 32 << 10;

/// Channels for a one-rank copy in kernel items of `bytes`, at most `max_channels`.
pub fn one_rank_copy_channels(bytes: u64, max_channels: u32) -> u32 {
    let max = COPY_MAX_CHANNELS.min(max_channels).max(1) as u64;
    bytes
        .div_ceil(ONE_RANK_COPY_BYTES_PER_CHANNEL)
        .clamp(1, max) as u32
}

/// Bytes per CTA of a copy in the kernel before another CTA is added.
pub const COPY_BYTES_PER_CHANNEL: u64 = 256 << 10;

/// Channels for a copy in the kernel of `bytes` (about `COPY_BYTES_PER_CHANNEL` per CTA, at
/// most `COPY_MAX_CHANNELS` and `max_channels`).
pub fn copy_channels(bytes: u64, max_channels: u32) -> u32 {
    let max = COPY_MAX_CHANNELS.min(max_channels).max(1) as u64;
    (bytes.div_ceil(COPY_BYTES_PER_CHANNEL)).clamp(1, max) as u32
}

/// The most channels one P2P operation uses on a communicator of `nchannels` (NVIDIA's
/// "p2p channels per peer").
pub fn p2p_channels_per_peer(nchannels: u32) -> u32 {
    p2p_channel_range().1.min(nchannels).max(1)
}

/// `NCCL_MIN_P2P_NCHANNELS` and `NCCL_MAX_P2P_NCHANNELS` (read again after a settings reload): the range of channels
/// one P2P operation is split over (default 1..=`P2P_MAX_CHANNELS`). As in NVIDIA's library,
/// every rank must see the same values.
fn p2p_channel_range() -> (u32, u32) {
    static RANGE: crate::env::Cached<(u32, u32)> = crate::env::Cached::new(|| {
        let max = crate::env::registry::MAX_P2P_NCHANNELS
            .int()
            .clamp(1, MAX_CTAS as i64) as u32;
        let min = crate::env::registry::MIN_P2P_NCHANNELS
            .int()
            .clamp(1, max as i64) as u32;
        (min, max)
    });
    RANGE.get()
}

/// Channels for one P2P operation of `bytes`: a function of the bytes and the communicator's
/// channel count only, identical on both sides.
pub fn p2p_channels(bytes: u64, nchannels: u32) -> u32 {
    let (min, max) = p2p_channel_range();
    p2p_channels_in(bytes, nchannels, min, max)
}

/// Channels for one P2P operation of `bytes` that is part of a `kind` task: the operations
/// of AlltoAll, Gather and Scatter share the launch with their siblings and a local copy, so
/// they take at most half of `p2p_channels`' range (a function of kind and bytes, so both
/// ends, whose tasks are of the same kind, agree).
pub fn p2p_channels_for(kind: CollKind, bytes: u64, nchannels: u32) -> u32 {
    let (min, max) = p2p_range_for(kind, p2p_channel_range());
    p2p_channels_in(bytes, nchannels, min, max)
}

/// The channel range of one P2P operation of a `kind` task within the range `(min, max)`:
/// half of it for the operations of AlltoAll, Gather and Scatter (see `p2p_channels_for`).
fn p2p_range_for(kind: CollKind, (min, max): (u32, u32)) -> (u32, u32) {
    match kind {
        CollKind::AlltoAll | CollKind::Gather | CollKind::Scatter => {
            (min.min(max / 2).max(1), (max / 2).max(1))
        }
        _ => (min, max),
    }
}

/// Protocol and channels of one P2P operation of `bytes`, part of a `kind` task, with a peer
/// reached over the network link `link`, under the protocols `allowed` and within the P2P
/// channel range `range`: each protocol's modelled optimum within the range (at most
/// `nchannels`), raised to the in-node choice (at most `net_channel_cap` of the link), and LL
/// when allowed, at most
/// `P2P_LL_MAX_BYTES` (while Simple is allowed) and faster. A function of the kind, the bytes
/// and the link, so both ends agree.
pub fn p2p_plan_net_with(
    kind: CollKind,
    bytes: u64,
    nchannels: u32,
    allowed: Protocols,
    link: NetLink,
    range: (u32, u32),
) -> (Proto, u32) {
    let (min, max) = p2p_range_for(kind, range);
    let max = max.min(nchannels).max(1);
    let min = min.clamp(1, max);
    let (proto, nch) = choose(
        (min, max),
        min,
        bytes <= P2P_LL_MAX_BYTES,
        allowed,
        &|proto, c| p2p_time_net_us(proto, bytes, c, link),
    );
    // Never fewer channels than without the network, nor more than the link carries (see
    // `ring_plan_net_with`).
    let floor = p2p_channels_in(bytes, nchannels, min, max).min(net_channel_cap(link));
    (proto, nch.max(floor))
}

/// Protocol and channels of one P2P operation of `bytes`, part of a `kind` task, under
/// `NCCL_PROTO` and the P2P channel range: over the network link `net` when the peer is
/// reached over it, else `p2p_proto` and `p2p_channels_for`.
pub fn p2p_plan(kind: CollKind, bytes: u64, nchannels: u32, net: Option<NetLink>) -> (Proto, u32) {
    match net {
        None => (p2p_proto(bytes), p2p_channels_for(kind, bytes, nchannels)),
        Some(link) => p2p_plan_net_with(
            kind,
            bytes,
            nchannels,
            protocols(),
            link,
            p2p_channel_range(),
        ),
    }
}

/// `p2p_channels` with an explicit channel range.
pub fn p2p_channels_in(bytes: u64, nchannels: u32, min: u32, max: u32) -> u32 {
    let max = max.min(nchannels).max(1) as u64;
    let min = (min as u64).min(max);
    bytes.div_ceil(P2P_BYTES_PER_CHANNEL).clamp(min, max) as u32
}

/// What `NCCL_ALGO` allows of the algorithms we have. NVIDIA's names are Tree, Ring,
/// CollnetDirect, CollnetChain, NVLS, NVLSTree and PAT, comma separated, `^` to exclude, and
/// since 2.24 optionally per collective (`allreduce:tree,ring;broadcast:ring`). We have Ring,
/// plus a one-shot all-reduce that NVIDIA's list has no name for: any `NCCL_ALGO` setting
/// turns the one-shot path off, so the user gets the ring they asked for. A setting that
/// leaves no Ring is warned about once and runs Ring anyway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Algorithms {
    /// The cost model may pick the one-shot all-reduce.
    pub one_shot: bool,
}

/// Parse an `NCCL_ALGO` value (see `Algorithms`); also says whether Ring was left out.
pub fn parse_algorithms(spec: &str) -> (Algorithms, bool) {
    let spec = spec.trim();
    if spec.is_empty() {
        return (Algorithms { one_shot: true }, false);
    }
    // Every clause, with or without a "collective:" prefix, is read the same way: a clause
    // that names Ring (or excludes something other than Ring) keeps Ring available.
    let mut ring_allowed = false;
    for clause in spec.split(';').map(str::trim).filter(|c| !c.is_empty()) {
        let list = clause.rsplit(':').next().unwrap_or(clause).trim();
        let (exclude, names) = match list.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, list),
        };
        let names_ring = names
            .split(',')
            .any(|n| n.trim().eq_ignore_ascii_case("ring"));
        if names_ring != exclude {
            ring_allowed = true;
        }
    }
    (Algorithms { one_shot: false }, !ring_allowed)
}

#[cfg(test)]
thread_local! {
    /// Tests force the algorithm choice per thread (the plan fingerprints cover both).
    pub static TEST_ALGORITHMS: std::cell::Cell<Option<Algorithms>> = const { std::cell::Cell::new(None) };
}

/// `NCCL_ALGO` (read again after a settings reload).
pub fn algorithms() -> Algorithms {
    #[cfg(test)]
    if let Some(a) = TEST_ALGORITHMS.with(|t| t.get()) {
        return a;
    }
    static A: crate::env::Cached<Algorithms> = crate::env::Cached::new(|| {
        let spec = crate::env::registry::ALGO.string();
        let (algos, no_ring) = parse_algorithms(&spec);
        if no_ring {
            crate::warn!(
                "NCCL_ALGO={spec} leaves out Ring, the only algorithm of this library besides \
                 the one-shot all-reduce; using Ring"
            );
        } else if !spec.is_empty() {
            crate::info!(
                INIT,
                "NCCL_ALGO={spec}: Ring only (one-shot all-reduce off)"
            );
        }
        algos
    });
    A.get()
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
    fn nccl_proto_parsing() {
        let both = Protocols {
            simple: true,
            ll: true,
        };
        let simple = Protocols {
            simple: true,
            ll: false,
        };
        let ll = Protocols {
            simple: false,
            ll: true,
        };
        assert_eq!(parse_protocols(""), both);
        assert_eq!(parse_protocols("Simple"), simple);
        assert_eq!(parse_protocols("simple"), simple);
        assert_eq!(parse_protocols("LL"), ll);
        assert_eq!(parse_protocols("ll,LL128"), ll);
        assert_eq!(parse_protocols("LL128"), simple);
        assert_eq!(parse_protocols("^LL"), simple);
        assert_eq!(parse_protocols("^ll, ll128"), simple);
        assert_eq!(parse_protocols("^Simple"), ll);
        assert_eq!(parse_protocols("^LL128"), both);
        assert_eq!(parse_protocols("Simple,LL"), both);
        assert_eq!(parse_protocols(" LL , SIMPLE "), both);
        assert_eq!(parse_protocols("^Simple,LL"), simple);
    }

    #[test]
    fn ll_for_small_simple_for_large() {
        let both = parse_protocols("");
        for n in [2, 4, 8] {
            for kind in CollKind::RINGS {
                assert_eq!(
                    ring_plan_with(kind, 8, n, NCHANNELS, both).0,
                    Proto::Ll,
                    "{kind:?} n={n}"
                );
                assert_eq!(
                    ring_plan_with(kind, 64 << 20, n, NCHANNELS, both).0,
                    Proto::Simple
                );
                // Excluding LL is exactly the Simple choice.
                assert_eq!(
                    ring_plan_with(kind, 4096, n, NCHANNELS, parse_protocols("^LL")),
                    (Proto::Simple, ring_channels(kind, 4096, n, NCHANNELS))
                );
                // LL only: LL at every size.
                assert_eq!(
                    ring_plan_with(kind, 1 << 30, n, NCHANNELS, parse_protocols("LL")).0,
                    Proto::Ll
                );
            }
        }
        assert!(
            ring_time_ll_us(CollKind::AllReduce, 8, 2, 1)
                < ring_time_us(CollKind::AllReduce, 8, 2, 1)
        );
        assert_eq!(p2p_proto_with(8, both), Proto::Ll);
        assert_eq!(p2p_proto_with(64 << 10, both), Proto::Ll);
        assert_eq!(p2p_proto_with((64 << 10) + 1, both), Proto::Simple);
        assert_eq!(p2p_proto_with(8, parse_protocols("Simple")), Proto::Simple);
        assert_eq!(p2p_proto_with(1 << 30, parse_protocols("LL")), Proto::Ll);
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
    fn one_shot_allreduce_for_small_messages_only() {
        let both = parse_protocols("");
        let on = Algorithms { one_shot: true };
        let off = Algorithms { one_shot: false };
        for n in [2, 4, 8] {
            assert!(
                matches!(
                    allreduce_plan_with(8, n, NCHANNELS, both, on),
                    AllReducePlan::Direct { nch: 1 }
                ),
                "n={n}"
            );
            assert!(matches!(
                allreduce_plan_with(64 << 20, n, NCHANNELS, both, on),
                AllReducePlan::Ring {
                    proto: Proto::Simple,
                    ..
                }
            ));
            // NCCL_ALGO set, or LL excluded: never one-shot.
            assert!(matches!(
                allreduce_plan_with(8, n, NCHANNELS, both, off),
                AllReducePlan::Ring { .. }
            ));
            assert!(matches!(
                allreduce_plan_with(8, n, NCHANNELS, parse_protocols("Simple"), on),
                AllReducePlan::Ring {
                    proto: Proto::Simple,
                    ..
                }
            ));
        }
        // Nine ranks and more, or more than DIRECT_MAX_BYTES: ring.
        assert!(matches!(
            allreduce_plan_with(8, 9, NCHANNELS, both, on),
            AllReducePlan::Ring { .. }
        ));
        assert!(matches!(
            allreduce_plan_with(DIRECT_MAX_BYTES + 4, 2, NCHANNELS, both, on),
            AllReducePlan::Ring { .. }
        ));
        // The largest one-shot message is one-shot, on more than one channel.
        match allreduce_plan_with(DIRECT_MAX_BYTES, 2, NCHANNELS, both, on) {
            AllReducePlan::Direct { nch } => assert!(nch > 1 && nch <= DIRECT_MAX_CHANNELS),
            ring => panic!("{DIRECT_MAX_BYTES} bytes on 2 ranks: {ring:?}, not one-shot"),
        }
    }

    #[test]
    fn nccl_algo_parsing() {
        let on = Algorithms { one_shot: true };
        let off = Algorithms { one_shot: false };
        assert_eq!(parse_algorithms(""), (on, false));
        assert_eq!(parse_algorithms("Ring"), (off, false));
        assert_eq!(parse_algorithms("ring,tree"), (off, false));
        assert_eq!(parse_algorithms("Tree"), (off, true));
        assert_eq!(parse_algorithms("^Ring"), (off, true));
        assert_eq!(parse_algorithms("^Tree"), (off, false));
        assert_eq!(
            parse_algorithms("allreduce:tree;broadcast:ring"),
            (off, false)
        );
        assert_eq!(parse_algorithms("allreduce:tree"), (off, true));
    }

    #[test]
    fn p2p_channel_range_is_honoured() {
        assert_eq!(p2p_channels_in(1 << 30, 64, 1, 32), 32);
        assert_eq!(p2p_channels_in(1 << 30, 16, 1, 32), 16);
        assert_eq!(p2p_channels_in(8, 64, 4, 32), 4);
        assert_eq!(p2p_channels_in(8, 2, 4, 32), 2);
        assert_eq!(p2p_channels_in(3 << 20, 64, 1, 2), 2);
    }

    #[test]
    fn p2p_channels_depend_on_bytes_only() {
        assert_eq!(p2p_channels(0, 24), 1);
        assert_eq!(p2p_channels(8, 24), 1);
        assert_eq!(p2p_channels(3 << 20, 24), 12);
        assert_eq!(p2p_channels(512 << 10, 24), 2);
        assert_eq!(p2p_channels(1 << 30, 24), 24);
        assert_eq!(p2p_channels(1 << 30, 64), P2P_MAX_CHANNELS);
        assert_eq!(p2p_channels(1 << 30, 4), 4);
        assert!(copy_channels(1 << 30, 24) == 24 && copy_channels(1, 24) == 1);
        assert_eq!(copy_channels(16 << 20, 64), COPY_MAX_CHANNELS);
        assert_eq!(copy_channels(1 << 20, 64), 4);
        assert_eq!(copy_channels(3 << 20, 2), 2);
        assert_eq!(
            p2p_channels_for(CollKind::AlltoAll, 1 << 30, 64),
            P2P_MAX_CHANNELS / 2
        );
        assert_eq!(
            p2p_channels_for(CollKind::Send, 1 << 30, 64),
            P2P_MAX_CHANNELS
        );
    }

    /// The largest power of two from 8 bytes to 16 MiB for which `proto_of` says LL (4 when
    /// none).
    fn ll_reach(proto_of: impl Fn(u64) -> Proto) -> u64 {
        (3..=24)
            .map(|shift| 1u64 << shift)
            .filter(|&b| proto_of(b) == Proto::Ll)
            .max()
            .unwrap_or(4)
    }

    /// 10 Gbit/s (a socket device of unknown speed, loopback) and 400 Gbit/s.
    fn slow_and_fast() -> (NetLink, NetLink) {
        (
            NetLink::from_properties(10_000, 0.0),
            NetLink::from_properties(400_000, 2.0),
        )
    }

    #[test]
    fn network_links_from_properties() {
        let l = NetLink::from_properties(100_000, 1.5);
        assert_eq!((l.gbps, l.latency_us), (12.5, 1.5));
        // No speed: NCCL's socket default, 10 Gbit/s; a negative or NaN latency: none.
        assert_eq!(NetLink::from_properties(0, -3.0).gbps, 1.25);
        assert_eq!(NetLink::from_properties(-1, f32::NAN).latency_us, 0.0);
        let a = NetLink::from_properties(200_000, 1.0);
        let b = NetLink::from_properties(100_000, 4.0);
        assert_eq!(
            a.slowest(b),
            NetLink {
                gbps: 12.5,
                latency_us: 4.0
            }
        );
        assert_eq!(
            a.beside(b),
            NetLink {
                gbps: 37.5,
                latency_us: 4.0
            }
        );
        // A link reported faster than NVLink is no faster than the in-node link.
        let absurd = NetLink {
            gbps: 1e9,
            latency_us: 0.0,
        };
        let big = 1u64 << 30;
        assert_eq!(
            ring_time_net_us(Proto::Simple, CollKind::AllGather, big, 2, 64, absurd),
            ring_time_net_us(
                Proto::Simple,
                CollKind::AllGather,
                big,
                2,
                64,
                NetLink {
                    gbps: LINK_GBPS,
                    latency_us: 0.0
                }
            )
        );
        // A zero link still gives a finite time.
        let zero = NetLink {
            gbps: 0.0,
            latency_us: 0.0,
        };
        assert!(ring_time_net_us(Proto::Ll, CollKind::AllReduce, 8, 2, 1, zero).is_finite());
    }

    #[test]
    fn rings_over_a_network_keep_their_channels_and_take_ll_only_when_small() {
        let both = parse_protocols("");
        let (slow, fast) = slow_and_fast();
        for n in [2, 4, 8] {
            for kind in CollKind::RINGS {
                let at = |b: u64, link: Option<NetLink>| match link {
                    None => ring_plan_with(kind, b, n, NCHANNELS, both),
                    Some(l) => ring_plan_net_with(kind, b, n, NCHANNELS, both, l),
                };
                // Large: Simple everywhere, never on fewer channels than in a node.
                let big = 256 << 20;
                let (nv, f, s) = (at(big, None), at(big, Some(fast)), at(big, Some(slow)));
                assert_eq!(
                    (nv.0, f.0, s.0),
                    (Proto::Simple, Proto::Simple, Proto::Simple)
                );
                assert!(
                    s.1 >= nv.1 && f.1 >= nv.1 && nv.1 > 2,
                    "{kind:?} n={n}: channels {} (10 Gbit/s), {} (400 Gbit/s), {} (NVLink)",
                    s.1,
                    f.1,
                    nv.1
                );
                // Tiny: LL on one channel.
                assert_eq!(at(8, Some(slow)), (Proto::Ll, 1), "{kind:?} n={n}");
                assert_eq!(at(8, Some(fast)), (Proto::Ll, 1), "{kind:?} n={n}");
                // LL doubles the bytes on the wire: on a ring the slower the link, the sooner
                // Simple wins. A chain (broadcast, reduce) of 3 hops or more over a slow link is
                // the exception: each rank forwards a Simple step only once it is whole, and
                // those steps are 14 times an LL step, so there LL may go on up to the cap.
                let reach = |link| ll_reach(|b| at(b, link).0);
                let (r_nv, r_f, r_s) = (reach(None), reach(Some(fast)), reach(Some(slow)));
                let chain = matches!(kind, CollKind::Broadcast | CollKind::Reduce);
                assert!(
                    r_s >= 8 && r_f <= LL_MAX_BYTES && r_s <= LL_MAX_BYTES,
                    "{kind:?} n={n}: LL up to {r_s} (10 Gbit/s), {r_f} (400 Gbit/s)"
                );
                assert!(
                    (chain && n > 2) || (r_s <= r_f && r_f <= r_nv && r_s < r_nv),
                    "{kind:?} n={n}: LL up to {r_s} (10 Gbit/s), {r_f} (400 Gbit/s), {r_nv} (NVLink)"
                );
                // Excluding a protocol still holds over the network.
                assert_eq!(
                    ring_plan_net_with(kind, 1 << 30, n, NCHANNELS, parse_protocols("LL"), slow).0,
                    Proto::Ll
                );
                assert_eq!(
                    ring_plan_net_with(kind, 8, n, NCHANNELS, parse_protocols("^LL"), slow).0,
                    Proto::Simple
                );
                // The channel cap holds.
                assert!(ring_plan_net_with(kind, big, n, 3, both, fast).1 <= 3);
            }
        }
    }

    #[test]
    fn slow_links_carry_few_connections() {
        let both = parse_protocols("");
        let gbit = |g: i32| NetLink::from_properties(g * 1000, 0.0);
        for kind in CollKind::RINGS {
            for bytes in [16u64 << 20, 64 << 20, 1 << 30] {
                let on = |link| ring_plan_net_with(kind, bytes, 2, NCHANNELS, both, link).1;
                let inside = ring_plan_with(kind, bytes, 2, NCHANNELS, both).1;
                // 1 Gbit/s: at most 16 connections; 4 Gbit/s and up: as many as in a node.
                assert!(on(gbit(1)) <= 16 && on(gbit(1)) >= 2, "{kind:?} {bytes}");
                assert_eq!(on(gbit(4)), inside.min(64), "{kind:?} {bytes}");
                assert_eq!(on(gbit(100)), inside, "{kind:?} {bytes}");
            }
        }
        // A send over a 1 Gbit/s link too; over 100 Gbit/s as without the network.
        let send = |bytes: u64, link| {
            p2p_plan_net_with(
                CollKind::Send,
                bytes,
                NCHANNELS,
                both,
                link,
                (1, P2P_MAX_CHANNELS),
            )
            .1
        };
        let inside = p2p_channels_in(256 << 20, NCHANNELS, 1, P2P_MAX_CHANNELS);
        assert!(send(256 << 20, gbit(1)) <= 16 && inside > 16);
        assert_eq!(send(256 << 20, gbit(100)), inside);
        assert_eq!(net_channel_cap(gbit(1)), 16);
        assert_eq!(net_channel_cap(NetLink::from_properties(50, 0.0)), 2);
        // A set floor (NCCL_MIN_NCHANNELS) still holds on a slow link.
        let lim = Limits {
            min_channels: 32,
            ..Limits::plain(NCHANNELS, both)
        };
        assert!(ring_plan_net_in(CollKind::AllReduce, 16 << 20, 2, &lim, gbit(1)).1 >= 32);
    }

    #[test]
    fn p2p_over_a_network_follows_the_link_and_both_ends_agree() {
        let both = parse_protocols("");
        let (slow, fast) = slow_and_fast();
        let net = |kind, b, link| {
            p2p_plan_net_with(kind, b, NCHANNELS, both, link, (1, P2P_MAX_CHANNELS))
        };
        let big = 256 << 20;
        let nv = p2p_channels_in(big, NCHANNELS, 1, P2P_MAX_CHANNELS);
        let (f, s) = (
            net(CollKind::Send, big, fast),
            net(CollKind::Send, big, slow),
        );
        assert_eq!((f.0, s.0), (Proto::Simple, Proto::Simple));
        assert!(s.1 >= nv && f.1 >= nv && nv > 2, "{s:?} {f:?} {nv}");
        for shift in 0..31 {
            let b = 1u64 << shift;
            for link in [slow, fast] {
                // The receiver plans what the sender plans.
                assert_eq!(net(CollKind::Send, b, link), net(CollKind::Recv, b, link));
                // AlltoAll's operations stay within half the range.
                assert!(net(CollKind::AlltoAll, b, link).1 <= P2P_MAX_CHANNELS / 2);
            }
        }
        // LL for the smallest only, at most as far as without the network.
        let reach = |link| ll_reach(|b| net(CollKind::Send, b, link).0);
        let nv_reach = ll_reach(|b| p2p_proto_with(b, both));
        assert!(
            reach(slow) >= 8 && reach(slow) <= reach(fast) && reach(fast) <= nv_reach,
            "LL up to {} (10 Gbit/s), {} (400 Gbit/s), {nv_reach} (NVLink)",
            reach(slow),
            reach(fast)
        );
        // NCCL_PROTO and the channel range hold.
        let ll_only = parse_protocols("LL");
        let p = p2p_plan_net_with(CollKind::Send, 1 << 30, NCHANNELS, ll_only, slow, (1, 32));
        assert_eq!(p.0, Proto::Ll);
        let p = p2p_plan_net_with(
            CollKind::Send,
            8,
            NCHANNELS,
            parse_protocols("Simple"),
            fast,
            (1, 32),
        );
        assert_eq!(p.0, Proto::Simple);
        for b in [8, 1 << 20, 1 << 30] {
            let (_, c) = p2p_plan_net_with(CollKind::Send, b, NCHANNELS, both, slow, (4, 8));
            assert!((4..=8).contains(&c), "{b} bytes: {c} channels");
            let (_, c) = p2p_plan_net_with(CollKind::Send, b, 3, both, fast, (4, 8));
            assert_eq!(c, 3, "{b} bytes: {c} channels");
        }
        // Without the network: exactly the choice of before.
        for b in [8, 1 << 20, 1 << 30] {
            assert_eq!(
                p2p_plan(CollKind::Send, b, 24, None),
                (p2p_proto(b), p2p_channels_for(CollKind::Send, b, 24))
            );
        }
    }

    #[test]
    fn network_latency_adds_once_per_hop() {
        let quick = NetLink {
            gbps: 12.5,
            latency_us: 0.0,
        };
        let far = NetLink {
            gbps: 12.5,
            latency_us: 25.0,
        };
        let both = parse_protocols("");
        for n in [2, 4, 8] {
            for b in [8u64, 64 << 10, 16 << 20] {
                let kind = CollKind::AllReduce;
                // The same for every protocol and channel count, so the same choice ...
                assert_eq!(
                    ring_plan_net_with(kind, b, n, NCHANNELS, both, quick),
                    ring_plan_net_with(kind, b, n, NCHANNELS, both, far)
                );
                // ... 2(n-1) hops later.
                let d = planned_time_on(kind, b, n, NCHANNELS, Some(far))
                    - planned_time_on(kind, b, n, NCHANNELS, Some(quick));
                assert!(
                    (d - 2.0 * (n - 1) as f64 * 25.0).abs() < 1e-6,
                    "n={n} {b}: {d}"
                );
                // Over the network nothing is faster than over NVLink.
                assert!(
                    planned_time_on(kind, b, n, NCHANNELS, Some(quick))
                        > planned_time_on(kind, b, n, NCHANNELS, None)
                );
            }
        }
        assert_eq!(
            planned_time_on(CollKind::AllGather, 4096, 4, NCHANNELS, None),
            planned_time_us(CollKind::AllGather, 4096, 4, NCHANNELS)
        );
    }
}
