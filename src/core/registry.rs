//! Buffers registered with `ncclCommRegister`. Our kernels stage data through connection
//! buffers, so registration changes no data path yet: it records the buffer and hands out a
//! handle that `ncclCommDeregister` checks, so callers that register (PyTorch's NCCL memory
//! pool) work unchanged.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;

/// The registered buffers of one communicator, by handle.
#[derive(Default)]
pub struct Registrations {
    inner: Mutex<Table>,
}

/// Handles handed out so far, and the live ones with their (pointer, size).
#[derive(Default)]
struct Table {
    issued: u64,
    live: HashMap<u64, (u64, usize)>,
}

impl Registrations {
    /// Record `[ptr, ptr+size)` and return its handle (never 0).
    pub fn register(&self, ptr: u64, size: usize) -> u64 {
        let mut t = self.inner.lock();
        t.issued += 1;
        // Handles look like pointers to C; keep them distinct from small integers.
        let handle = 0x0c00_0000_0000 + t.issued * 16;
        t.live.insert(handle, (ptr, size));
        crate::info!(
            REG,
            "registered buffer {ptr:#x} size {size} as handle {handle:#x}"
        );
        handle
    }

    /// Forget a handle from `register`; unknown handles are `ncclInvalidArgument`.
    pub fn deregister(&self, handle: u64) -> Result<()> {
        self.inner
            .lock()
            .live
            .remove(&handle)
            .map(|_| ())
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "handle {handle:#x} was not registered on this communicator"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_and_deregister() {
        let r = Registrations::default();
        let a = r.register(0x1000, 64);
        let b = r.register(0x2000, 64);
        assert_ne!(a, b);
        r.deregister(a).unwrap();
        assert!(r.deregister(a).is_err());
        assert!(r.deregister(12345).is_err());
        r.deregister(b).unwrap();
    }
}
