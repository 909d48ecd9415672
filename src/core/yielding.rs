//! Yielding launches: how a communicator whose ranks share this GPU with other processes,
//! reached over the network, stops its kernels from holding the GPU while they wait for
//! those processes. Without MPS the GPU runs one process's kernels at a time and switches at
//! the end of a time slice (about 2.4 ms on an H200) or when the running process has nothing
//! to run; a kernel that spins for another process's data holds the GPU for the rest of its
//! slice, so an 8-byte all-reduce between two such processes takes two slices
//! (docs/time-slices.md).
//!
//! A yielding launch is `ox_kernel_yield` in mode `YIELD_FRESH`, then `resumes` times a
//! stream wait for the status page's bell followed by the kernel again (`YIELD_RESUME`, the
//! last one `YIELD_LAST`), all on the user's stream. A CTA whose wait on a flagged peer
//! (`FLAG_PARK_*`) lasts `park_ns` parks: it keeps its positions, records where it stopped,
//! writes what it waits for on the status page (its park entry: a counter and a value) and
//! ends; once every CTA has ended or parked, the kernel ends and the stream waits in the
//! GPU's front end, which lets the other process run. The proxy rings the bell once a parked
//! CTA's counter reaches its value; the next kernel goes on where the parked CTAs stopped. A CTA that has
//! finished exits at once in the later kernels, and the last kernel never parks, so a launch
//! always ends, the worst case being today's spinning.
//!
//! Settings (oxccl's own; NVIDIA's library has none): `OXCCL_YIELD` (default 1; 0 spins as
//! before), `OXCCL_YIELD_SPIN_US` (how long a wait spins before it parks, default 30 µs),
//! `OXCCL_YIELD_RESUMES` (kernels after the first, default 2 (n - 1) + 2, at most 32).

use crate::cuda::{self, module, CUstream};
use crate::error::Result;
use crate::sched::device::{YIELD_FRESH, YIELD_LAST, YIELD_RESUME};

/// Default of `OXCCL_YIELD_SPIN_US`.
pub const DEFAULT_SPIN_US: i64 = 30;
/// Most kernels after the first one launch may have.
const MAX_RESUMES: u32 = 32;

/// The settings, read once per communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub enabled: bool,
    /// Nanoseconds a parkable wait spins before it parks (at least 1).
    pub park_ns: u32,
    /// `OXCCL_YIELD_RESUMES`, when set.
    pub resumes: Option<u32>,
}

impl Settings {
    pub fn from_env() -> Settings {
        let us = crate::env::registry::YIELD_SPIN_US
            .int()
            .clamp(1, 1_000_000);
        let resumes = crate::env::registry::YIELD_RESUMES.int();
        Settings {
            enabled: crate::env::registry::YIELD.flag(),
            park_ns: (us * 1000) as u32,
            resumes: (resumes >= 1).then(|| (resumes as u32).min(MAX_RESUMES)),
        }
    }

    /// Kernels after the first one of a launch on `nranks` ranks: a ring round waits on its
    /// neighbour 2 (n - 1) times, so 2 (n - 1) + 2. Every kernel of the chain runs, also
    /// after the work is done (about 40 µs each between two processes on an H200: 8 B
    /// all-reduce 563 µs with 4, 1047 µs with 16, 1701 µs with 32), so no more than that.
    pub fn resumes(&self, nranks: i32) -> u32 {
        self.resumes
            .unwrap_or_else(|| (2 * (nranks.max(2) as u32 - 1) + 2).min(MAX_RESUMES))
    }
}

/// Launch a yielding plan's kernels on `stream`: `items` is the device address of its input
/// (`sched::device::yield_input`), `bell` the device address of the status page's bell.
#[allow(clippy::too_many_arguments)]
pub fn launch(
    kernel: module::Kernel,
    grid: u32,
    block: u32,
    stream: CUstream,
    items: u64,
    nitems: u32,
    bell: u64,
    park_ns: u32,
    resumes: u32,
) -> Result<()> {
    let kernel = |mode: u32| {
        module::launch_args(
            kernel,
            grid,
            block,
            0,
            stream,
            &[
                module::KernelArg::U64(items),
                module::KernelArg::U32(nitems),
                module::KernelArg::U32(mode),
                module::KernelArg::U32(park_ns),
            ],
        )
    };
    kernel(YIELD_FRESH)?;
    for i in 0..resumes {
        cuda::wait_bit0(stream, bell)?;
        kernel(if i + 1 == resumes {
            YIELD_LAST
        } else {
            YIELD_RESUME
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resumes_grow_with_the_ring_and_are_capped() {
        let s = Settings {
            enabled: true,
            park_ns: 30_000,
            resumes: None,
        };
        assert_eq!(s.resumes(2), 4);
        assert_eq!(s.resumes(4), 8);
        assert_eq!(s.resumes(64), MAX_RESUMES);
        let set = Settings {
            resumes: Some(3),
            ..s
        };
        assert_eq!(set.resumes(8), 3);
    }
}
