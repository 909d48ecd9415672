//! Bandwidth-weighted channels: the route of every channel over the network — the network
//! device its connections use on every rank and that device's bandwidth — and the share of a
//! collective's bytes each channel carries. Both are part of the geometry every rank agrees on
//! at init (`Routes::agree`, from every rank's `RouteClaim`), so every rank splits alike.
//!
//! When the devices are of unequal speed, channels go to devices in proportion to their speed
//! (a smooth weighted round robin, so that every prefix of the channels is close to that
//! proportion too), and the bytes of a collective on `nch` channels go to each channel in
//! proportion to its bottleneck: its device's speed shared by the channels of the prefix on
//! that device, capped by the in-node hop every channel shares. With devices of equal speed,
//! one device, weighting off on any rank (`OXCCL_WEIGHTED_CHANNELS=0`) or ranks with different
//! numbers of devices, the routes are `even`: channel c uses device c mod devices and every
//! channel gets the same share, as NVIDIA's library does — plans are then exactly those of an
//! unweighted communicator.
//!
//! Weights are plain integers computed from agreed integers, so every rank computes the same
//! ones. With `OXCCL_ADAPTIVE_WEIGHTS` on every rank, the speeds are also re-agreed while the
//! communicator runs (`sched::adaptive`, `core::adaptive`): each agreement is an *epoch*, a
//! new set of device speeds over the same channel→device routes, and a collective planned in
//! epoch e splits its bytes by that epoch's speeds (`Routes::at_epoch`). Epoch 0 is the
//! speeds agreed at init; P2P operations always use it.

use super::cost::NetLink;

/// Most network devices a rank claims (more are ignored for weighting).
pub const MAX_DEVICES: usize = 64;

/// What one rank says at init about its network devices, for the routes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RouteClaim {
    /// Speed of each of its devices in Mbit/s (the network's, or `OXCCL_NET_SPEEDS`).
    pub speeds_mbps: Vec<u32>,
    /// `OXCCL_WEIGHTED_CHANNELS` on this rank.
    pub weighted: bool,
    /// Bandwidth in Mbit/s of the in-node hop from this rank to its ring successor, which
    /// every channel crosses (0: the hop is the network, no in-node cap).
    pub hop_mbps: u32,
    /// `OXCCL_ADAPTIVE_WEIGHTS` on this rank.
    pub adaptive: bool,
}

impl RouteClaim {
    /// Bytes of a claim: weighted flag, hop, device count, then each device's speed.
    pub fn to_bytes(&self) -> Vec<u8> {
        let n = self.speeds_mbps.len().min(MAX_DEVICES);
        let mut b = Vec::with_capacity(6 + 4 * n);
        b.push(self.weighted as u8 | (self.adaptive as u8) << 1);
        b.extend_from_slice(&self.hop_mbps.to_le_bytes());
        b.push(n as u8);
        for s in &self.speeds_mbps[..n] {
            b.extend_from_slice(&s.to_le_bytes());
        }
        b
    }

    /// The claim of `b` (`to_bytes`), or None when it is not one.
    pub fn from_bytes(b: &[u8]) -> Option<RouteClaim> {
        let (&flags, rest) = b.split_first()?;
        let hop = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?);
        let (&n, speeds) = rest.get(4..)?.split_first()?;
        if flags > 3 || n as usize > MAX_DEVICES || speeds.len() != 4 * n as usize {
            return None;
        }
        Some(RouteClaim {
            speeds_mbps: speeds
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            weighted: flags & 1 == 1,
            hop_mbps: hop,
            adaptive: flags & 2 == 2,
        })
    }
}

/// Why the routes are weighted or even, for the INFO line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Weighted,
    /// Some rank has `OXCCL_WEIGHTED_CHANNELS=0`.
    Off,
    /// Fewer than two devices.
    OneDevice,
    /// The ranks have different numbers of devices.
    DeviceCounts,
    /// Every device has the same speed.
    EqualSpeeds,
}

/// The routes of a communicator's channels, the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Routes {
    /// `[channel]`: the device of ring channel c and of P2P row `nchannels + c`; empty when
    /// the routes are even.
    dev_of: Vec<u32>,
    /// The agreed speed of every device in Mbit/s (the least any rank claimed); empty when
    /// even.
    speeds: Vec<u32>,
    /// The in-node hop every channel shares, Mbit/s (`u32::MAX`: none).
    hop_mbps: u32,
    /// Every rank asked for weights that follow measurements (`OXCCL_ADAPTIVE_WEIGHTS`).
    adaptive: bool,
    /// Later epochs' speeds (`sched::adaptive`), oldest first, at most `KEPT_EPOCHS`.
    epochs: Vec<(u32, Vec<u32>)>,
}

/// Epochs a `Routes` keeps the speeds of (a task is planned soon after its epoch was
/// assigned, and epochs are at least one exchange period apart).
const KEPT_EPOCHS: usize = 8;

/// Weight of a channel alone on a device of 1 Mbit/s: weights are `speed * SCALE / sharers`,
/// integers fine enough for 64 channels.
const SCALE: u64 = 1 << 20;

impl Routes {
    /// Even routes: channel c on device c mod devices, equal shares (NVIDIA's).
    pub fn even() -> Routes {
        Routes::default()
    }

    /// Whether bytes are split by weight.
    pub fn is_weighted(&self) -> bool {
        !self.dev_of.is_empty()
    }

    /// The routes of `nchannels` channels from every rank's claim, and why they are what
    /// they are.
    pub fn agree(nchannels: u32, claims: &[RouteClaim]) -> (Routes, Verdict) {
        let even = |v| (Routes::even(), v);
        if claims.is_empty() || claims.iter().any(|c| !c.weighted) {
            return even(Verdict::Off);
        }
        let ndev = claims[0].speeds_mbps.len();
        if claims.iter().any(|c| c.speeds_mbps.len() != ndev) {
            return even(Verdict::DeviceCounts);
        }
        if ndev < 2 {
            return even(Verdict::OneDevice);
        }
        let speeds: Vec<u32> = (0..ndev)
            .map(|d| {
                claims
                    .iter()
                    .map(|c| c.speeds_mbps[d].max(1))
                    .min()
                    .unwrap()
            })
            .collect();
        let adaptive = claims.iter().all(|c| c.adaptive);
        if speeds.iter().all(|&s| s == speeds[0]) && !adaptive {
            return even(Verdict::EqualSpeeds);
        }
        let hop_mbps = claims
            .iter()
            .map(|c| c.hop_mbps)
            .filter(|&h| h > 0)
            .min()
            .unwrap_or(u32::MAX);
        let routes = Routes {
            dev_of: assign_channels(nchannels.max(1), &speeds),
            speeds,
            hop_mbps,
            adaptive,
            epochs: Vec::new(),
        };
        (routes, Verdict::Weighted)
    }

    /// Whether the speeds are re-agreed from measurements while the communicator runs.
    pub fn is_adaptive(&self) -> bool {
        self.adaptive && self.is_weighted()
    }

    /// The device speeds agreed at init (epoch 0), Mbit/s; empty when even.
    pub fn speeds(&self) -> &[u32] {
        &self.speeds
    }

    /// Whether the speeds of `epoch` are known here.
    pub fn knows_epoch(&self, epoch: u32) -> bool {
        epoch == 0 || self.epochs.iter().any(|(e, _)| *e == epoch)
    }

    /// Keep `speeds` (one per device) as those of `epoch` (forgetting the oldest beyond
    /// `KEPT_EPOCHS`).
    pub fn add_epoch(&mut self, epoch: u32, speeds: Vec<u32>) {
        if self.knows_epoch(epoch) || speeds.len() != self.speeds.len() {
            return;
        }
        if self.epochs.len() == KEPT_EPOCHS {
            self.epochs.remove(0);
        }
        self.epochs.push((epoch, speeds));
    }

    /// The routes as epoch `epoch` weighs them: the same channels on the same devices, the
    /// devices at that epoch's speeds; None when the epoch is not known here.
    pub fn at_epoch(&self, epoch: u32) -> Option<Routes> {
        if epoch == 0 {
            return Some(self.clone());
        }
        let (_, speeds) = self.epochs.iter().find(|(e, _)| *e == epoch)?;
        Some(Routes {
            dev_of: self.dev_of.clone(),
            speeds: speeds.clone(),
            hop_mbps: self.hop_mbps,
            adaptive: self.adaptive,
            epochs: Vec::new(),
        })
    }

    /// The device of connection row `row` of a communicator of `nchannels` channels on a
    /// network of `ndev` devices: the route of its channel when weighted (and the network
    /// has the agreed devices), else row mod devices.
    pub fn device_of_row(&self, row: u32, nchannels: u32, ndev: i32) -> i32 {
        let ndev = ndev.max(1);
        if self.is_weighted() && self.speeds.len() == ndev as usize {
            return self.dev_of[(row % nchannels.max(1)) as usize % self.dev_of.len()] as i32;
        }
        (row % ndev as u32) as i32
    }

    /// Channels of each device among the first `nch`.
    fn sharers(&self, nch: u32) -> Vec<u64> {
        let mut n = vec![0u64; self.speeds.len()];
        for &d in self.dev_of.iter().take(nch as usize) {
            n[d as usize] += 1;
        }
        n
    }

    /// The weight of each of channels `0..nch`: its device's speed shared by the channels of
    /// the prefix on that device, at most the in-node hop shared by all `nch`. None when the
    /// routes are even or the weights are all equal (split evenly).
    pub fn weights(&self, nch: u32) -> Option<Vec<u64>> {
        if !self.is_weighted() || nch < 2 {
            return None;
        }
        let nch = nch.min(self.dev_of.len() as u32);
        let sharers = self.sharers(nch);
        let cap = self.hop_mbps as u64 * SCALE / nch as u64;
        let w: Vec<u64> = self.dev_of[..nch as usize]
            .iter()
            .map(|&d| (self.speeds[d as usize] as u64 * SCALE / sharers[d as usize]).min(cap))
            .collect();
        (!w.iter().all(|&x| x == w[0])).then_some(w)
    }

    /// The link channels `0..nch` get together, for the cost model: `base` (the agreed link)
    /// when even; weighted, the devices they use side by side, at most the in-node hop.
    pub fn link_for(&self, nch: u32, base: NetLink) -> NetLink {
        if !self.is_weighted() {
            return base;
        }
        let sharers = self.sharers(nch.max(1));
        let mbps: u64 = self
            .speeds
            .iter()
            .zip(&sharers)
            .filter(|(_, &n)| n > 0)
            .map(|(&s, _)| s as u64)
            .sum();
        NetLink {
            gbps: mbps.min(self.hop_mbps as u64) as f64 / 8000.0,
            latency_us: base.latency_us,
        }
    }

    /// Most channels `0..nch` may be while every device carries at most
    /// `cost::net_channel_cap` of its own speed (channels are connections on their device);
    /// None when even (the caller caps by the agreed link).
    pub fn channel_cap(&self) -> Option<u32> {
        if !self.is_weighted() {
            return None;
        }
        let caps: Vec<u32> = self
            .speeds
            .iter()
            .map(|&s| {
                let mbps = s.min(i32::MAX as u32) as i32;
                super::cost::net_channel_cap(NetLink::from_properties(mbps, 0.0))
            })
            .collect();
        let mut on = vec![0u32; self.speeds.len()];
        for (c, &d) in self.dev_of.iter().enumerate() {
            on[d as usize] += 1;
            if on[d as usize] > caps[d as usize] {
                return Some((c as u32).max(1));
            }
        }
        Some(self.dev_of.len() as u32)
    }

    /// For the INFO line: each device's agreed speed and how many of `nchannels` channels it
    /// carries, e.g. `dev 0 (eth0) 4000 Mbit/s: 51 channels`.
    pub fn describe(&self, nchannels: u32, names: &[String]) -> Vec<String> {
        let sharers = self.sharers(nchannels);
        self.speeds
            .iter()
            .zip(&sharers)
            .enumerate()
            .map(|(d, (s, n))| {
                let name = names.get(d).map_or("?", String::as_str);
                format!("dev {d} ({name}) {s} Mbit/s: {n} channels")
            })
            .collect()
    }
}

/// Device of each of `nchannels` channels, in proportion to `speeds`: a smooth weighted round
/// robin (each device gains its speed per channel, the one with the most takes the channel
/// and pays the total; ties to the lower device), so every prefix is near the proportion and
/// equal speeds give channel c device c mod devices.
fn assign_channels(nchannels: u32, speeds: &[u32]) -> Vec<u32> {
    let total: i64 = speeds.iter().map(|&s| s as i64).sum();
    let mut credit = vec![0i64; speeds.len()];
    (0..nchannels)
        .map(|_| {
            for (c, &s) in credit.iter_mut().zip(speeds) {
                *c += s as i64;
            }
            let mut best = 0;
            for d in 1..credit.len() {
                if credit[d] > credit[best] {
                    best = d;
                }
            }
            credit[best] -= total;
            best as u32
        })
        .collect()
}

/// Split `total` into contiguous ranges in proportion to `weights`, each start a multiple of
/// `gran` (the last range ends at `total`); returns (start, len) for every part, empty ones
/// included.
pub fn split_weighted(total: u64, weights: &[u64], gran: u64) -> Vec<(u64, u64)> {
    let gran = gran.max(1) as u128;
    let sum: u128 = weights.iter().map(|&w| w as u128).sum::<u128>().max(1);
    let mut cum: u128 = 0;
    let mut start = 0u64;
    weights
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            cum += w as u128;
            let end = if i + 1 == weights.len() {
                total
            } else {
                ((total as u128 * cum / sum) / gran * gran) as u64
            };
            let end = end.clamp(start, total);
            let part = (start, end - start);
            start = end;
            part
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(speeds: &[u32]) -> RouteClaim {
        RouteClaim {
            speeds_mbps: speeds.to_vec(),
            weighted: true,
            hop_mbps: 0,
            adaptive: false,
        }
    }

    #[test]
    fn claims_round_trip_and_bad_bytes_are_refused() {
        let c = RouteClaim {
            speeds_mbps: vec![4000, 1000, 7],
            weighted: true,
            hop_mbps: 96_000,
            adaptive: false,
        };
        assert_eq!(RouteClaim::from_bytes(&c.to_bytes()), Some(c.clone()));
        let b = c.to_bytes();
        assert_eq!(RouteClaim::from_bytes(&b[..b.len() - 1]), None);
        assert_eq!(RouteClaim::from_bytes(&[]), None);
        let mut bad = b.clone();
        bad[0] = 4;
        assert_eq!(RouteClaim::from_bytes(&bad), None);
    }

    #[test]
    fn equal_speeds_one_device_or_weighting_off_give_even_routes() {
        let (r, v) = Routes::agree(64, &[claim(&[10_000, 10_000]), claim(&[10_000, 10_000])]);
        assert_eq!((r.is_weighted(), v), (false, Verdict::EqualSpeeds));
        let (r, v) = Routes::agree(64, &[claim(&[4000]), claim(&[1000])]);
        assert_eq!((r.is_weighted(), v), (false, Verdict::OneDevice));
        let (r, v) = Routes::agree(64, &[claim(&[4000, 1000]), claim(&[4000])]);
        assert_eq!((r.is_weighted(), v), (false, Verdict::DeviceCounts));
        let mut off = claim(&[4000, 1000]);
        off.weighted = false;
        let (r, v) = Routes::agree(64, &[claim(&[4000, 1000]), off]);
        assert_eq!((r.is_weighted(), v), (false, Verdict::Off));
        // Even routes: row mod devices, no weights, the base link.
        let base = NetLink::from_properties(10_000, 3.0);
        for row in 0..200 {
            assert_eq!(r.device_of_row(row, 64, 3), (row % 3) as i32);
        }
        assert_eq!(r.weights(64), None);
        assert_eq!(r.link_for(64, base), base);
    }

    #[test]
    fn channels_go_to_devices_in_proportion_to_speed_in_every_prefix() {
        let (r, v) = Routes::agree(64, &[claim(&[4000, 1000]), claim(&[4000, 2000])]);
        assert_eq!(v, Verdict::Weighted);
        // Agreed speeds are the least claimed per device.
        assert_eq!(r.speeds, vec![4000, 1000]);
        let n = r.sharers(64);
        assert_eq!(n, vec![51, 13]);
        for nch in 1..=64u32 {
            let fast = r.sharers(nch)[0] as f64;
            assert!((fast - nch as f64 * 0.8).abs() <= 1.0, "{nch}: {fast}");
        }
        // Equal speeds would give c mod devices.
        assert_eq!(assign_channels(6, &[5, 5, 5]), vec![0, 1, 2, 0, 1, 2]);
        // P2P rows follow their channel's device.
        assert_eq!(r.device_of_row(64 + 2, 64, 2), r.device_of_row(2, 64, 2));
        // A network that does not have the agreed devices falls back to row mod devices.
        assert_eq!(r.device_of_row(5, 64, 3), 2);
    }

    #[test]
    fn no_device_carries_more_channels_than_its_speed_allows() {
        // 4000 + 1000 Mbit/s: 51 + 13 of 64 channels, within 64 and 16.
        let (r, _) = Routes::agree(64, &[claim(&[4000, 1000]), claim(&[4000, 1000])]);
        assert_eq!(r.channel_cap(), Some(64));
        // The fast device cut to 1000 (a later epoch): at most 16 channels on it, so the
        // prefix stops before its 17th.
        let mut cut = r.clone();
        cut.add_epoch(1, vec![1000, 1000]);
        let cut = cut.at_epoch(1).unwrap();
        let cap = cut.channel_cap().unwrap();
        assert_eq!(cut.sharers(cap)[0], 16);
        assert_eq!(cut.sharers(cap + 1)[0], 17);
        // Even routes leave the cap to the agreed link.
        assert_eq!(Routes::even().channel_cap(), None);
    }

    #[test]
    fn weights_give_each_device_bytes_in_proportion_to_its_speed() {
        let (r, _) = Routes::agree(64, &[claim(&[4000, 1000]), claim(&[4000, 1000])]);
        for nch in [3u32, 5, 16, 64] {
            // None: the prefix's channels already are in proportion (5 = 4 + 1), equal weights.
            let w = r.weights(nch).unwrap_or(vec![1; nch as usize]);
            let mut per_dev = [0u64; 2];
            for (c, &x) in w.iter().enumerate() {
                per_dev[r.dev_of[c] as usize] += x;
            }
            let ratio = per_dev[0] as f64 / per_dev[1] as f64;
            assert!((ratio - 4.0).abs() < 1e-3, "{nch}: {per_dev:?}");
        }
        // Two channels both on the fast device, or 4 + 1: equal weights, even split.
        assert_eq!(r.weights(2), None);
        assert_eq!(r.weights(5), None);
        assert!(r.weights(3).is_some());
        // The cost model sees the devices the channels use side by side.
        let base = NetLink::from_properties(5000, 2.0);
        assert_eq!(r.link_for(2, base).gbps, 0.5);
        assert_eq!(r.link_for(64, base).gbps, 5000.0 / 8000.0);
        assert_eq!(r.link_for(64, base).latency_us, 2.0);
    }

    #[test]
    fn a_slower_shared_in_node_hop_evens_the_weights() {
        let mut a = claim(&[400_000, 100_000]);
        a.hop_mbps = 8000 * 24; // PCIe, 24 GB/s
        let (r, v) = Routes::agree(64, &[a, claim(&[400_000, 100_000])]);
        assert_eq!(v, Verdict::Weighted);
        assert_eq!(r.weights(64), None);
        assert_eq!(r.link_for(64, NetLink::from_properties(0, 0.0)).gbps, 24.0);
    }

    #[test]
    fn weighted_splits_are_contiguous_aligned_and_proportional() {
        let p = split_weighted(1000, &[4, 1], 16);
        assert_eq!(p, vec![(0, 800), (800, 200)]);
        let p = split_weighted(1001, &[1, 1, 1], 16);
        assert_eq!(p, vec![(0, 320), (320, 336), (656, 345)]);
        for total in [0u64, 1, 15, 17, 1 << 20, 12_345_679] {
            for w in [vec![3u64, 1, 0, 7], vec![1], vec![5, 5], vec![0, 0, 9]] {
                let p = split_weighted(total, &w, 4);
                assert_eq!(p.len(), w.len());
                let mut at = 0;
                for &(s, l) in &p {
                    assert_eq!(s, at);
                    assert!(s % 4 == 0 || l == 0 || s == total);
                    at = s + l;
                }
                assert_eq!(at, total);
            }
        }
    }
}
