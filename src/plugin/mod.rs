//! NVIDIA's plugin libraries, as its loader finds them: which file names a setting stands for
//! (`NCCL_NET_PLUGIN`, `NCCL_TUNER_PLUGIN`), opening them ([`dl`]), and the log function a
//! plugin gets ([`logger`]). The net plugin's adapter is the network's
//! (`transport::net::plugin`); the tuner plugin's is [`tuner`].

pub mod dl;
pub mod logger;
pub mod tuner;

use crate::debug::{self, subsys, Level};
use parking_lot::Mutex;

/// Which kind of plugin a library is looked for as: its name prefix and how its lines read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Net,
    Tuner,
}

impl Kind {
    /// NVIDIA's prefix of the library names (`libnccl-net`, `libnccl-tuner`).
    fn prefix(self) -> &'static str {
        match self {
            Kind::Net => "libnccl-net",
            Kind::Tuner => "libnccl-tuner",
        }
    }

    /// How its INFO lines start (`NET/Plugin`, `TUNER/Plugin`).
    fn tag(self) -> &'static str {
        match self {
            Kind::Net => "NET",
            Kind::Tuner => "TUNER",
        }
    }

    /// The subsystems its INFO lines are logged under.
    fn subsystems(self) -> u32 {
        match self {
            Kind::Net => subsys::INIT | subsys::NET,
            Kind::Tuner => subsys::INIT | subsys::TUNING,
        }
    }

    /// The library tried when its setting is unset (`libnccl-net.so`, `libnccl-tuner.so`).
    pub fn default_library(self) -> String {
        format!("{}.so", self.prefix())
    }
}

/// Log an INFO line for the plugin kind `kind`.
pub(crate) fn info(kind: Kind, args: std::fmt::Arguments<'_>) {
    let sys = kind.subsystems();
    if debug::enabled(Level::Info, sys) {
        debug::log(Level::Info, sys, crate::here!(), args);
    }
}

/// The names `dlopen` is tried with for one entry, in order; None opens the program itself.
/// As NVIDIA's: first the entry as given (`STATIC_PLUGIN`, or any prefix of it in any case,
/// means the program), then `<prefix>-<entry>.so` unless the entry is a path (has a '/') or
/// already a library name (`lib*.so`).
pub fn candidates(kind: Kind, entry: &str) -> Vec<Option<String>> {
    let is_static = !entry.is_empty()
        && "STATIC_PLUGIN"
            .get(..entry.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(entry));
    let mut out = vec![(!is_static).then(|| entry.to_string())];
    let library_name = entry.starts_with("lib") && entry.ends_with(".so");
    if !entry.contains('/') && !library_name {
        out.push(Some(format!("{}-{entry}.so", kind.prefix())));
    }
    out
}

/// The first of an entry's candidates that `dlopen` opens, and the name it was opened by;
/// NVIDIA's INFO lines for those it could not.
pub fn open_library(kind: Kind, entry: &str) -> Option<(dl::Library, String)> {
    let mut missing = String::new();
    for candidate in candidates(kind, entry) {
        let shown = candidate.clone().unwrap_or_else(|| entry.to_string());
        match dl::Library::open(candidate.as_deref()) {
            Ok(lib) => return Some((lib, shown)),
            Err(e) if e.not_found => missing.push_str(&format!(" {shown}")),
            Err(e) => info(
                kind,
                format_args!("{}/Plugin: {shown}: {}", kind.tag(), e.text),
            ),
        }
    }
    if !missing.is_empty() {
        info(
            kind,
            format_args!("{}/Plugin: Could not find:{missing}", kind.tag()),
        );
    }
    None
}

/// The file of the net plugin in use, where a tuner is looked for when its own library is
/// not found (NVIDIA's: a net plugin may carry the tuner).
static NET_LIBRARY: Mutex<Option<String>> = Mutex::new(None);

/// Remember the file of the net plugin that loaded.
pub fn note_net_library(path: &str) {
    *NET_LIBRARY.lock() = Some(path.to_string());
}

/// The file of the net plugin that loaded, if one did.
pub fn net_library() -> Option<String> {
    NET_LIBRARY.lock().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_tries_its_own_names() {
        assert_eq!(Kind::Tuner.default_library(), "libnccl-tuner.so");
        assert_eq!(
            candidates(Kind::Tuner, "ofi"),
            vec![Some("ofi".into()), Some("libnccl-tuner-ofi.so".into())]
        );
        assert_eq!(
            candidates(Kind::Net, "ofi"),
            vec![Some("ofi".into()), Some("libnccl-net-ofi.so".into())]
        );
        assert_eq!(
            candidates(Kind::Tuner, "/x/libt.so"),
            vec![Some("/x/libt.so".into())]
        );
    }
}
