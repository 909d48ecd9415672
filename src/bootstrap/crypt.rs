//! Encryption of the library's TCP sockets (`ncclSetEncryption`). This build has no TLS:
//! no well-kept Rust TLS library speaks TLS 1.3 with an external pre-shared key without
//! linking a system library (which `libnccl.so.2` must not need at link time). So, as
//! NVIDIA's builds without TLS do, a valid configuration is accepted, and a connection made
//! while a pre-shared key is configured fails, saying why.

use crate::error::{Error, Result};
use parking_lot::RwLock;

/// Shortest pre-shared key accepted, as NVIDIA's.
pub const MIN_PSK_BYTES: usize = 32;

/// The process-wide mode: `Some(key)` while a pre-shared key is configured.
static PSK: RwLock<Option<Vec<u8>>> = RwLock::new(None);

/// A settled encryption request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encryption {
    /// Plain sockets.
    None,
    /// TLS with this pre-shared key.
    Psk(Vec<u8>),
}

/// Make `mode` the process's encryption mode for connections made from now on.
pub fn set(mode: Encryption) {
    *PSK.write() = match mode {
        Encryption::None => None,
        Encryption::Psk(key) => Some(key),
    };
}

/// Fail where a connection would need TLS: NVIDIA's answer when built without it
/// (`ncclInvalidUsage` from communicator creation, with this message).
pub fn check_plaintext(what: &str) -> Result<()> {
    if PSK.read().is_some() {
        return Err(Error::invalid_usage(format!(
            "{what}: oxccl was built without TLS support but a pre-shared key was configured (ncclSetEncryption)"
        )));
    }
    Ok(())
}

/// Read and check a caller's `ncclEncryptionConfig_t` as NVIDIA's `ncclSetEncryption` does:
/// NULL means no change (plain sockets).
///
/// # Safety
/// `cfg` is NULL or points to the caller's initialised config (its `size` bytes readable).
pub unsafe fn read_config(cfg: *const crate::abi::ncclEncryptionConfig_t) -> Result<Encryption> {
    use crate::abi::{ncclEncryptionConfig_t, NCCL_API_MAGIC};
    if cfg.is_null() {
        return Ok(Encryption::None);
    }
    let base = ncclEncryptionConfig_t {
        size: 0,
        magic: 0,
        version: 0,
        mode: 0,
        psk: std::ptr::null(),
    };
    // SAFETY: cfg is non-NULL and the caller's config (the function's contract).
    let (header, c) = unsafe { crate::abi::read_versioned(cfg, base) };
    if header.magic != NCCL_API_MAGIC {
        return Err(Error::invalid_argument(
            "config not initialized via NCCL_ENCRYPTION_CONFIG_INITIALIZER",
        ));
    }
    match c.mode {
        0 => Ok(Encryption::None),
        1 => {
            if c.psk.is_null() {
                return Err(Error::invalid_argument(
                    "NCCL_ENCRYPTION_MODE_PSK requires config->psk",
                ));
            }
            // SAFETY: psk is a NUL-terminated string (NCCL's contract).
            let key = unsafe { std::ffi::CStr::from_ptr(c.psk) }
                .to_bytes()
                .to_vec();
            if key.len() < MIN_PSK_BYTES {
                return Err(Error::invalid_argument(format!(
                    "config->psk must be at least {MIN_PSK_BYTES} bytes"
                )));
            }
            Ok(Encryption::Psk(key))
        }
        m => Err(Error::invalid_argument(format!(
            "config->mode={m} is not a supported encryption mode"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_key_refuses_connections_until_cleared() {
        set(Encryption::Psk(vec![7; MIN_PSK_BYTES]));
        let e = check_plaintext("bootstrap").unwrap_err();
        assert!(e.msg.contains("without TLS support"), "{}", e.msg);
        assert_eq!(e.code, crate::abi::ncclResult_t::ncclInvalidUsage);
        set(Encryption::None);
        assert!(check_plaintext("bootstrap").is_ok());
    }
}
