//! `ncclConfig_t` as callers built against any header from 2.14 to 2.32 pass it: read by the
//! caller's `size` (fields an older caller lacks stay undefined), checked, and completed from
//! the `NCCL_*` environment where the caller left a field undefined.

use crate::abi::{ncclConfig_t, NCCL_CONFIG_MAGIC, NCCL_CONFIG_UNDEF_INT};
use crate::error::{Error, Result};
use std::ffi::CStr;

/// Most channels (CTAs) a communicator may use.
pub const MAX_CHANNELS: i32 = 64;

/// The settled configuration of one communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommConfig {
    pub blocking: bool,
    pub cga_cluster_size: i32,
    pub min_ctas: i32,
    pub max_ctas: i32,
    pub net_name: Option<String>,
    pub split_share: bool,
    pub traffic_class: i32,
    pub comm_name: Option<String>,
    pub collnet_enable: bool,
    pub cta_policy: i32,
    pub shrink_share: bool,
    pub nvls_ctas: i32,
    pub n_channels_per_net_peer: i32,
    pub nvlink_centric_sched: bool,
    /// Contexts and signal indices of one-sided operations (0: the library's default).
    pub num_rma_ctx: i32,
    pub num_rma_sig: i32,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            blocking: true,
            cga_cluster_size: 0,
            min_ctas: 1,
            max_ctas: MAX_CHANNELS,
            net_name: None,
            split_share: false,
            traffic_class: NCCL_CONFIG_UNDEF_INT,
            comm_name: None,
            collnet_enable: false,
            cta_policy: 0,
            shrink_share: false,
            nvls_ctas: NCCL_CONFIG_UNDEF_INT,
            n_channels_per_net_peer: NCCL_CONFIG_UNDEF_INT,
            nvlink_centric_sched: false,
            num_rma_ctx: 0,
            num_rma_sig: 0,
        }
    }
}

/// Read a caller's config struct. Only the first `size` bytes are touched.
///
/// # Safety
/// `cfg` is NULL or points to at least `size` readable bytes, where `size` is the struct's
/// first field (the caller's `sizeof(ncclConfig_t)`).
pub unsafe fn read_user_config(cfg: *const ncclConfig_t) -> Result<Option<ncclConfig_t>> {
    if cfg.is_null() {
        return Ok(None);
    }
    // SAFETY: cfg is non-NULL and the caller's config (the function's contract).
    let (header, out) = unsafe { crate::abi::read_versioned(cfg, ncclConfig_t::default()) };
    let (size, magic) = (header.size, header.magic);
    if magic != NCCL_CONFIG_MAGIC {
        return Err(Error::invalid_argument(format!(
            "config magic {magic:#x} is not NCCL_CONFIG_MAGIC (0xcafebeef): initialise the config with NCCL_CONFIG_INITIALIZER"
        )));
    }
    if !(16..=1 << 16).contains(&size) {
        return Err(Error::invalid_argument(format!(
            "config size {size} is not a valid ncclConfig_t size"
        )));
    }
    // Pointer fields a short struct did not cover must stay NULL, which default() set.
    Ok(Some(out))
}

fn defined(v: i32) -> Option<i32> {
    (v != NCCL_CONFIG_UNDEF_INT).then_some(v)
}

fn check_range(name: &str, v: Option<i32>, lo: i32, hi: i32) -> Result<Option<i32>> {
    match v {
        Some(x) if x < lo || x > hi => Err(Error::invalid_argument(format!(
            "config.{name} = {x} is out of range (valid: {lo}..={hi})"
        ))),
        other => Ok(other),
    }
}

/// NVIDIA's order check of the caller's channel bounds: the fields as given, an undefined one
/// being the `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`) that marks it, so a minimum set without a
/// maximum is refused as well as a minimum above the maximum.
fn check_cta_order(u: &ncclConfig_t) -> Result<()> {
    if u.minCTAs > u.maxCTAs {
        return Err(Error::invalid_argument(format!(
            "Invalid config min/max channels attribute value {}/{}",
            u.minCTAs, u.maxCTAs
        )));
    }
    Ok(())
}

/// A channel bound above what the library has is capped to it, as NVIDIA's does.
fn cap_channels(field: &str, v: i32) -> i32 {
    if v > MAX_CHANNELS {
        crate::info!(
            ENV,
            "{field} {v} is larger than #channels upper limit {MAX_CHANNELS}, cap it to {MAX_CHANNELS}"
        );
        return MAX_CHANNELS;
    }
    v
}

fn string_field(p: *const std::os::raw::c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's config holds a NUL-terminated string here (NCCL's contract).
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

impl CommConfig {
    /// Settle a configuration: the caller's fields where defined, else `parent` (split and
    /// shrink inherit), else the environment, else defaults; then, as NVIDIA's, the settings
    /// the environment makes replace the config's (`apply_env_overrides`). Rejects
    /// out-of-range values.
    pub fn resolve(user: Option<&ncclConfig_t>, parent: Option<&CommConfig>) -> Result<CommConfig> {
        let base = parent.cloned().unwrap_or_else(Self::from_env);
        // No config is a config that defines nothing (NCCL_CONFIG_INITIALIZER's values).
        let undefined = ncclConfig_t::default();
        let u = user.unwrap_or(&undefined);
        let blocking = check_range("blocking", defined(u.blocking), 0, 1)?;
        let cga = check_range("cgaClusterSize", defined(u.cgaClusterSize), 0, 8)?;
        let min_ctas = check_range("minCTAs", defined(u.minCTAs), 1, i32::MAX)?;
        let max_ctas = check_range("maxCTAs", defined(u.maxCTAs), 1, i32::MAX)?;
        check_cta_order(u)?;
        let split_share = check_range("splitShare", defined(u.splitShare), 0, 1)?;
        let collnet = check_range("collnetEnable", defined(u.collnetEnable), 0, 1)?;
        let policy = check_range("CTAPolicy", defined(u.CTAPolicy), 0, 0x03)?;
        let shrink_share = check_range("shrinkShare", defined(u.shrinkShare), 0, 1)?;
        let nvls_ctas = check_range("nvlsCTAs", defined(u.nvlsCTAs), 1, i32::MAX)?;
        let per_peer = check_range(
            "nChannelsPerNetPeer",
            defined(u.nChannelsPerNetPeer),
            1,
            MAX_CHANNELS,
        )?;
        let nvl_sched = check_range("nvlinkCentricSched", defined(u.nvlinkCentricSched), 0, 1)?;
        let mut c = base;
        if let Some(v) = blocking {
            c.blocking = v == 1;
        }
        if let Some(v) = cga {
            c.cga_cluster_size = v;
        }
        if let Some(v) = min_ctas {
            c.min_ctas = cap_channels("minCTAs", v);
        }
        if let Some(v) = max_ctas {
            c.max_ctas = cap_channels("maxCTAs", v);
        }
        if let Some(name) = string_field(u.netName) {
            c.net_name = Some(name);
        }
        if let Some(v) = split_share {
            c.split_share = v == 1;
        }
        if let Some(v) = defined(u.trafficClass) {
            c.traffic_class = v;
        }
        if let Some(name) = string_field(u.commName) {
            c.comm_name = Some(name);
        }
        if let Some(v) = collnet {
            c.collnet_enable = v == 1;
        }
        if let Some(v) = policy {
            c.cta_policy = v;
        }
        if let Some(v) = shrink_share {
            c.shrink_share = v == 1;
        }
        if let Some(v) = nvls_ctas {
            c.nvls_ctas = v;
        }
        if let Some(v) = per_peer {
            c.n_channels_per_net_peer = v;
        }
        if let Some(v) = nvl_sched {
            c.nvlink_centric_sched = v == 1;
        }
        if let Some(v) = check_range("numRmaCtx", defined(u.numRmaCtx), 1, 64)? {
            c.num_rma_ctx = v;
        }
        if let Some(v) = check_range("numRmaSig", defined(u.numRmaSig), 1, 1 << 16)? {
            c.num_rma_sig = v;
        }
        c.apply_env_overrides(u);
        c.settle_channel_bounds();
        Ok(c)
    }

    /// NVIDIA's `envConfigOverride`: a setting made in the environment replaces the config's
    /// field, whatever the caller's config says (with an INFO line where it said something):
    /// `NCCL_COMM_BLOCKING`, `NCCL_CGA_CLUSTER_SIZE`, `NCCL_MIN_CTAS`, `NCCL_MAX_CTAS`,
    /// `NCCL_NET`, `NCCL_COMM_SPLIT_SHARE_RESOURCES`, `NCCL_COMM_SHRINK_SHARE_RESOURCES`.
    fn apply_env_overrides(&mut self, user: &ncclConfig_t) {
        use crate::env::registry as env;
        let note = |field: &str, configured: bool, var: &str, value: &dyn std::fmt::Display| {
            if configured {
                crate::info!(ENV, "Comm config {field} reset to {var}={value}");
            }
        };
        let set_int = |p: &'static crate::env::Param| p.raw().map(|_| p.int());
        if let Some(v) = set_int(&env::COMM_BLOCKING).filter(|v| matches!(v, 0 | 1)) {
            note(
                "blocking",
                defined(user.blocking).is_some(),
                env::COMM_BLOCKING.name,
                &v,
            );
            self.blocking = v == 1;
        }
        if let Some(v) = set_int(&env::CGA_CLUSTER_SIZE).filter(|&v| v >= 0) {
            let v = v.min(8) as i32;
            note(
                "cgaClusterSize",
                defined(user.cgaClusterSize).is_some(),
                env::CGA_CLUSTER_SIZE.name,
                &v,
            );
            self.cga_cluster_size = v;
        }
        for (param, field, value, configured) in [
            (
                &env::MIN_CTAS,
                "minCTAs",
                &mut self.min_ctas,
                defined(user.minCTAs).is_some(),
            ),
            (
                &env::MAX_CTAS,
                "maxCTAs",
                &mut self.max_ctas,
                defined(user.maxCTAs).is_some(),
            ),
        ] {
            if let Some(v) = set_int(param).filter(|&v| v > 0) {
                let v = v.min(MAX_CHANNELS as i64) as i32;
                note(field, configured, param.name, &v);
                *value = v;
            }
        }
        if let Some(name) = env::NET.get() {
            note("netName", !user.netName.is_null(), env::NET.name, &name);
            self.net_name = Some(name);
        }
        for (param, field, value, configured) in [
            (
                &env::COMM_SPLIT_SHARE_RESOURCES,
                "splitShare",
                &mut self.split_share,
                defined(user.splitShare).is_some(),
            ),
            (
                &env::COMM_SHRINK_SHARE_RESOURCES,
                "shrinkShare",
                &mut self.shrink_share,
                defined(user.shrinkShare).is_some(),
            ),
        ] {
            if let Some(v) = set_int(param) {
                note(field, configured, param.name, &v);
                *value = v != 0;
            }
        }
    }

    /// Defaults with the environment applied: the older names of the channel bounds
    /// (`NCCL_MIN_NCHANNELS` over the legacy `NCCL_MIN_NRINGS`, the same for the maximum), then
    /// every setting that stands for a config field (`apply_env_overrides`, `NCCL_MIN_CTAS`
    /// among them, so the newest name that is set wins).
    pub fn from_env() -> CommConfig {
        use crate::env::registry as env;
        let d = CommConfig::default();
        let clamp = |v: i64| v.clamp(1, MAX_CHANNELS as i64) as i32;
        let mut c = CommConfig {
            min_ctas: clamp(env::MIN_NCHANNELS.int_or(env::MIN_NRINGS.int_or(d.min_ctas as i64))),
            max_ctas: clamp(env::MAX_NCHANNELS.int_or(env::MAX_NRINGS.int_or(d.max_ctas as i64))),
            ..d
        };
        c.apply_env_overrides(&ncclConfig_t::default());
        c.settle_channel_bounds();
        c
    }

    /// Bounds that cross (the environment's may) are both set to the maximum's value, as NVIDIA's.
    fn settle_channel_bounds(&mut self) {
        if self.min_ctas > self.max_ctas {
            crate::info!(
                ENV,
                "minCTAs {} is larger than maxCTAs {}, set both to {}",
                self.min_ctas,
                self.max_ctas,
                self.max_ctas
            );
            self.min_ctas = self.max_ctas;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2.14 layout: everything up to and including netName.
    #[repr(C)]
    struct ConfigV21400 {
        size: usize,
        magic: u32,
        version: u32,
        blocking: i32,
        cga_cluster_size: i32,
        min_ctas: i32,
        max_ctas: i32,
        net_name: *const std::os::raw::c_char,
    }

    #[test]
    fn the_newest_channel_setting_wins_and_the_legacy_rings_count() {
        use crate::env::tests::sources;
        let ctas = |env: &[(&str, &str)]| {
            sources::with(env, &[], || {
                let c = CommConfig::from_env();
                (c.min_ctas, c.max_ctas)
            })
        };
        assert_eq!(
            ctas(&[("NCCL_MIN_NRINGS", "2"), ("NCCL_MAX_NRINGS", "8")]),
            (2, 8)
        );
        assert_eq!(
            ctas(&[("NCCL_MAX_NRINGS", "8"), ("NCCL_MAX_NCHANNELS", "16")]),
            (1, 16)
        );
        assert_eq!(
            ctas(&[("NCCL_MAX_NCHANNELS", "16"), ("NCCL_MAX_CTAS", "4")]),
            (1, 4)
        );
    }

    #[test]
    fn the_environment_overrides_the_config_as_nvidias() {
        use crate::env::tests::sources;
        let cfg = ncclConfig_t {
            blocking: 1,
            maxCTAs: 32,
            splitShare: 0,
            ..Default::default()
        };
        let env = [
            ("NCCL_COMM_BLOCKING", "0"),
            ("NCCL_MAX_CTAS", "4"),
            ("NCCL_COMM_SPLIT_SHARE_RESOURCES", "1"),
            ("NCCL_COMM_SHRINK_SHARE_RESOURCES", "1"),
            ("NCCL_NET", "Socket"),
            ("NCCL_CGA_CLUSTER_SIZE", "12"),
        ];
        let parent = CommConfig::default();
        for (user, parent) in [
            (Some(&cfg), None),
            (Some(&cfg), Some(&parent)),
            (None, Some(&parent)),
        ] {
            let c = sources::with(&env, &[], || CommConfig::resolve(user, parent)).unwrap();
            assert!(!c.blocking);
            assert_eq!(c.max_ctas, 4);
            assert!(c.split_share && c.shrink_share);
            assert_eq!(c.net_name.as_deref(), Some("Socket"));
            assert_eq!(c.cga_cluster_size, 8, "limited to 8");
        }
        // Unset or out of range: the config stands.
        let env = [("NCCL_COMM_BLOCKING", "7"), ("NCCL_MAX_CTAS", "0")];
        let c = sources::with(&env, &[], || CommConfig::resolve(Some(&cfg), None)).unwrap();
        assert!(c.blocking);
        assert_eq!(c.max_ctas, 32);
        // Bounds the environment crosses are both set to the maximum's value, as NVIDIA's.
        let env = [("NCCL_MIN_CTAS", "16"), ("NCCL_MAX_CTAS", "4")];
        let c = sources::with(&env, &[], || CommConfig::resolve(Some(&cfg), None)).unwrap();
        assert_eq!((c.min_ctas, c.max_ctas), (4, 4));
    }

    #[test]
    fn old_header_config_is_read_by_size() {
        let old = ConfigV21400 {
            size: std::mem::size_of::<ConfigV21400>(),
            magic: NCCL_CONFIG_MAGIC,
            version: 21403,
            blocking: 0,
            cga_cluster_size: NCCL_CONFIG_UNDEF_INT,
            min_ctas: 2,
            max_ctas: 4,
            net_name: std::ptr::null(),
        };
        // SAFETY: `old` is a live struct of the size it declares.
        let read = unsafe { read_user_config(&old as *const ConfigV21400 as *const ncclConfig_t) }
            .unwrap()
            .unwrap();
        assert_eq!(read.blocking, 0);
        assert_eq!(read.maxCTAs, 4);
        assert_eq!(read.splitShare, NCCL_CONFIG_UNDEF_INT);
        assert!(read.commName.is_null());
        let c = CommConfig::resolve(Some(&read), Some(&CommConfig::default())).unwrap();
        assert!(!c.blocking);
        assert_eq!((c.min_ctas, c.max_ctas), (2, 4));
    }

    #[test]
    fn bad_magic_and_ranges_are_rejected() {
        let cfg = ncclConfig_t {
            magic: 0,
            ..Default::default()
        };
        // SAFETY: cfg is a full-size live struct.
        let e = unsafe { read_user_config(&cfg) }.err().unwrap();
        assert_eq!(e.code, crate::abi::ncclResult_t::ncclInvalidArgument);
        let cfg = ncclConfig_t {
            blocking: 7,
            ..Default::default()
        };
        assert!(CommConfig::resolve(Some(&cfg), Some(&CommConfig::default())).is_err());
        let cfg = ncclConfig_t {
            minCTAs: 8,
            maxCTAs: 2,
            ..Default::default()
        };
        assert!(CommConfig::resolve(Some(&cfg), Some(&CommConfig::default())).is_err());
    }

    #[test]
    fn channel_bounds_are_checked_and_capped_as_nvidias() {
        let resolve = |min, max| {
            let cfg = ncclConfig_t {
                minCTAs: min,
                maxCTAs: max,
                ..Default::default()
            };
            CommConfig::resolve(Some(&cfg), Some(&CommConfig::default()))
                .map(|c| (c.min_ctas, c.max_ctas))
        };
        let undef = NCCL_CONFIG_UNDEF_INT;
        // A minimum without a maximum compares with the undefined marker, INT_MIN.
        assert!(resolve(4, undef).is_err());
        assert_eq!(resolve(undef, 4).unwrap(), (1, 4));
        assert!(resolve(0, 4).is_err());
        assert!(resolve(1, -3).is_err());
        // Above the library's channels: capped, not refused.
        assert_eq!(resolve(8, 1000).unwrap(), (8, MAX_CHANNELS));
        assert_eq!(resolve(100, 1000).unwrap(), (MAX_CHANNELS, MAX_CHANNELS));
        assert!(resolve(1000, 100).is_err());
    }

    #[test]
    fn parent_config_is_inherited() {
        let parent = CommConfig {
            blocking: false,
            max_ctas: 3,
            ..CommConfig::default()
        };
        assert_eq!(CommConfig::resolve(None, Some(&parent)).unwrap(), parent);
    }
}
