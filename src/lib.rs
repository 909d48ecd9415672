//! oxccl: NVIDIA's NCCL (the 2.32.3 ABI) rebuilt in Rust, shipped as a drop-in `libnccl.so.2`.
//!
//! Layers, top down (never up): `api` (the `extern "C"` entry points) → `core`
//! (communicators, groups, enqueue) → `sched` (planning), `transport` (connections),
//! `bootstrap` (rendezvous), `topo` (node topology) → `cuda` (the driver). `abi` holds the C
//! types, `error` the error type and last-error messages, `env` every `NCCL_*` setting,
//! `debug` the logging and `plugin` the loading of NVIDIA's plugin libraries.
#![allow(clippy::missing_safety_doc)]

pub mod abi;
pub mod api;
pub mod bootstrap;
pub mod core;
pub mod cuda;
pub mod debug;
pub mod env;
pub mod error;
pub mod plugin;
pub mod profile;
pub mod sched;
pub mod topo;
pub mod transport;

pub use error::{Error, Result};
