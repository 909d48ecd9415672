//! The embedded kernels: the fatbin that build.rs compiles from `kernels/`, loaded once per
//! context on first use, and lookup of kernel functions by name.

use crate::error::{Error, Result};

/// TEMPORARY stand-in until the kernel branch lands: the kernel `name` in the current context.
pub fn function(name: &str) -> Result<super::CUfunction> {
    Err(Error::unsupported(&format!("kernel {name}")))
}
