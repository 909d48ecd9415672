//! The SHM transport: a side's block in host memory that both GPUs reach over the bus. In
//! one process it is pinned, device-mapped memory handed over as a pointer; across processes
//! a `/dev/shm` segment, created exclusively under a fresh name (so two communicators, or a
//! stale segment of a crashed run, can never share one), mapped and registered with the GPU
//! by both sides, and unlinked by its creator.

use super::wire::{Half, Placement};
use super::{Keep, Setup};
use crate::cuda::{self, HostMapped};
use crate::error::{Error, Result};
use crate::sched::Dir;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// Allocate this rank's block of `bytes` in host memory and describe it for `peer`.
pub(super) fn local_half(
    setup: &Setup<'_>,
    ch: u32,
    peer: i32,
    dir: Dir,
    bytes: usize,
) -> Result<(Half, Keep)> {
    if setup.topo.same_process(peer) {
        let mem = HostMapped::new(bytes)?;
        let half = Half {
            local_base: mem.dev(),
            placement: Placement::Pointer(mem.dev()),
        };
        return Ok((half, Box::new(mem)));
    }
    let stem = format!(
        "oxccl-{:x}-{}-{}-{}-{}-{}",
        setup.comm_hash,
        std::process::id(),
        setup.topo.my_rank,
        peer,
        ch,
        if dir == Dir::Send { "s" } else { "r" }
    );
    let (name, segment) = Segment::create(&stem, bytes)?;
    let mapped = Registered::new(segment)?;
    let half = Half {
        local_base: mapped.dev,
        placement: Placement::Shm {
            name,
            bytes: bytes as u64,
        },
    };
    Ok((half, Box::new(mapped)))
}

/// Map a peer's segment into this process and this GPU.
pub(super) fn map_remote(name: &str, bytes: usize) -> Result<(u64, Option<Keep>)> {
    let mapped = Registered::new(Segment::open(name, bytes)?)?;
    Ok((mapped.dev, Some(Box::new(mapped))))
}

/// A `/dev/shm` file mapped shared into this process; the creator unlinks it on drop.
struct Segment {
    host: *mut u8,
    bytes: usize,
    path: PathBuf,
    owner: bool,
}

// SAFETY: plain shared memory owned by this value; access is coordinated by the protocol.
unsafe impl Send for Segment {}
// SAFETY: as above; shared references expose only the raw address.
unsafe impl Sync for Segment {}

/// Distinguishes the segments one process creates under one stem.
static NONCE: AtomicU64 = AtomicU64::new(0);

impl Segment {
    /// Create a new segment of `bytes` (zero-filled) under `stem` plus a fresh suffix; the
    /// name never matches an existing file (O_EXCL), so a leftover is skipped, not reused.
    fn create(stem: &str, bytes: usize) -> Result<(String, Segment)> {
        for _ in 0..64 {
            let name = format!("{stem}-{}", NONCE.fetch_add(1, Ordering::Relaxed));
            let path = shm_path(&name);
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => {
                    let mut seg = Segment::map(file, bytes, path, true)?;
                    seg.owner = true;
                    return Ok((name, seg));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(Error::system(format!(
                        "shared memory {}: {e}",
                        path.display()
                    )))
                }
            }
        }
        Err(Error::system(format!(
            "shared memory: every name tried under /dev/shm/{stem}-* already exists"
        )))
    }

    /// Open the peer's existing segment of `bytes`.
    fn open(name: &str, bytes: usize) -> Result<Segment> {
        if name.contains('/') || name.is_empty() {
            return Err(Error::internal(format!(
                "malformed shared memory name '{name}' from a peer"
            )));
        }
        let path = shm_path(name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::system(format!("shared memory {}: {e}", path.display())))?;
        Segment::map(file, bytes, path, false)
    }

    /// Size the file (creator) and map it shared, read-write.
    fn map(file: std::fs::File, bytes: usize, path: PathBuf, create: bool) -> Result<Segment> {
        let fail = |what: &str, e: std::io::Error| {
            if create {
                let _ = std::fs::remove_file(&path);
            }
            Error::system(format!("{what} {}: {e}", path.display()))
        };
        if create {
            file.set_len(bytes as u64)
                .map_err(|e| fail("shared memory", e))?;
        } else {
            let len = file.metadata().map_err(|e| fail("shared memory", e))?.len();
            if len < bytes as u64 {
                return Err(Error::system(format!(
                    "shared memory {}: {len} bytes, the peer announced {bytes}",
                    path.display()
                )));
            }
        }
        // SAFETY: maps `bytes` of a file at least that long, shared, read-write.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if host == libc::MAP_FAILED {
            return Err(fail("mmap of", std::io::Error::last_os_error()));
        }
        Ok(Segment {
            host: host as *mut u8,
            bytes,
            path,
            owner: false,
        })
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`, once.
        unsafe { libc::munmap(self.host as *mut libc::c_void, self.bytes.max(1)) };
        if self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn shm_path(name: &str) -> PathBuf {
    PathBuf::from("/dev/shm").join(name)
}

/// A segment registered with the GPU; `dev` is its device address. Unregistered before the
/// segment is unmapped (field order).
struct Registered {
    dev: u64,
    segment: Segment,
}

impl Registered {
    fn new(segment: Segment) -> Result<Registered> {
        // SAFETY: the segment's mapping stays alive as long as the registration (it is moved
        // into the value that unregisters it first).
        let dev = unsafe { cuda::host_register(segment.host, segment.bytes.max(1))? };
        Ok(Registered { dev, segment })
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // SAFETY: `segment.host` was registered in `new` and is still mapped.
        unsafe { cuda::host_unregister(self.segment.host) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stem() -> String {
        format!("oxccl-test-{}-{:x}", std::process::id(), rand_u64())
    }

    fn rand_u64() -> u64 {
        use std::hash::{BuildHasher, RandomState};
        RandomState::new().hash_one(std::time::SystemTime::now())
    }

    #[test]
    fn segments_of_one_stem_get_distinct_names_and_share_bytes() {
        let stem = stem();
        let (a, seg_a) = Segment::create(&stem, 8192).unwrap();
        let (b, _seg_b) = Segment::create(&stem, 8192).unwrap();
        assert_ne!(a, b);
        let peer = Segment::open(&a, 8192).unwrap();
        // SAFETY: both map the same 8192-byte file; one byte written, then read.
        unsafe {
            *seg_a.host.add(100) = 42;
            assert_eq!(*peer.host.add(100), 42);
        }
        drop(peer);
        drop(seg_a);
        assert!(!shm_path(&a).exists(), "the creator unlinks its segment");
    }

    #[test]
    fn a_leftover_file_is_skipped_never_reused() {
        let stem = stem();
        let next = NONCE.load(Ordering::Relaxed);
        // Leftovers under the next few names (as a crashed run with this pid would leave).
        let stale: Vec<PathBuf> = (next..next + 4)
            .map(|n| shm_path(&format!("{stem}-{n}")))
            .collect();
        for p in &stale {
            std::fs::write(p, b"stale").unwrap();
        }
        let (name, seg) = Segment::create(&stem, 4096).unwrap();
        assert!(stale.iter().all(|p| *p != shm_path(&name)), "{name}");
        // SAFETY: reads one byte of the fresh, zero-filled mapping.
        assert_eq!(unsafe { *seg.host }, 0);
        for p in &stale {
            assert_eq!(std::fs::read(p).unwrap(), b"stale", "leftover untouched");
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn a_peer_segment_shorter_than_announced_or_a_bad_name_is_refused() {
        let (name, _seg) = Segment::create(&stem(), 4096).unwrap();
        assert!(Segment::open(&name, 8192).is_err());
        assert!(Segment::open("../etc/passwd", 4096).is_err());
        assert!(Segment::open("", 4096).is_err());
    }
}
