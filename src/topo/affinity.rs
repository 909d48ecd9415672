//! Which CPUs a communicator's host threads run on, as NVIDIA's `ncclTopoGetCpuAffinity`
//! decides: the CPUs of the GPU's NUMA node, within the CPUs the process may use (all of the
//! node's with `NCCL_IGNORE_CPU_AFFINITY=1`); none (the caller's as they are) where the GPU
//! has no NUMA node or the two do not meet. NVIDIA pins its init thread there while it makes
//! its threads and host buffers, which then run and lie near the GPU; oxccl does the same
//! around the creation of a communicator and of its connections ([`Pinned`]), where its
//! proxy, socket and verbs threads start and its staging buffers are first touched.

use super::pci::Sysfs;

/// Parse a kernel CPU list (`0-3,8,10-11`); None where it is malformed.
pub fn parse_cpulist(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// A CPU list as the kernel and NVIDIA write it (`0-3,8,10-11`).
pub fn format_cpulist(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        while i + 1 < cpus.len() && cpus[i + 1] == cpus[i] + 1 {
            i += 1;
        }
        out.push(match cpus[i] {
            end if end == start => start.to_string(),
            end => format!("{start}-{end}"),
        });
        i += 1;
    }
    out.join(",")
}

/// The CPUs of the NUMA node of the GPU `bus_id`, from `sysfs`; None where it has none.
pub fn gpu_cpus(sysfs: &Sysfs, bus_id: &str) -> Option<Vec<usize>> {
    let path = sysfs.pci_device_path(bus_id)?;
    let node = sysfs.numa_node(&path);
    if node < 0 {
        return None;
    }
    parse_cpulist(&sysfs.node_cpulist(node)?)
}

/// The CPUs the calling thread may run on.
pub fn thread_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; set is a live cpu_set_t of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: i is below CPU_SETSIZE, within the set.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Restrict the calling thread to `cpus` (true when the kernel took them).
fn set_thread_cpus(cpus: &[usize]) -> bool {
    // SAFETY: as in `thread_cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: cpu is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; set is a live cpu_set_t of the size passed.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

/// NVIDIA's choice: the GPU's CPUs within the thread's (`ignore_process`: the GPU's alone);
/// None where there are none.
pub fn choose(gpu: &[usize], thread: &[usize], ignore_process: bool) -> Option<Vec<usize>> {
    let chosen: Vec<usize> = if ignore_process {
        gpu.to_vec()
    } else {
        gpu.iter().copied().filter(|c| thread.contains(c)).collect()
    };
    (!chosen.is_empty()).then_some(chosen)
}

/// The CPUs for a communicator on the GPU `bus_id` of device `dev`, with NVIDIA's INFO line
/// (`Affinity for GPU 0 is 0-15. (GPU affinity = 0-15 ; CPU affinity = 0-31).`).
pub fn for_gpu(sysfs: &Sysfs, bus_id: &str, dev: i32) -> Option<Vec<usize>> {
    let ignore = crate::env::registry::IGNORE_CPU_AFFINITY.flag();
    let gpu = gpu_cpus(sysfs, bus_id)?;
    let thread = thread_cpus();
    let chosen = choose(&gpu, &thread, ignore);
    let what = chosen
        .as_deref()
        .map_or_else(|| "empty, ignoring".to_string(), format_cpulist);
    let process = if ignore {
        String::new()
    } else {
        format!(" ; CPU affinity = {}", format_cpulist(&thread))
    };
    crate::info!(
        INIT,
        "ncclTopoGetCpuAffinity: Affinity for GPU {dev} is {what}. (GPU affinity = {}{process}).",
        format_cpulist(&gpu)
    );
    chosen
}

/// The calling thread on a communicator's CPUs while this lives, then back on its own.
pub struct Pinned {
    saved: Option<Vec<usize>>,
}

impl Pinned {
    /// Pin the calling thread to `cpus` (nothing for None, or where the kernel refuses).
    pub fn enter(cpus: Option<&[usize]>) -> Pinned {
        let saved = cpus.and_then(|cpus| {
            let before = thread_cpus();
            (before.as_slice() != cpus && set_thread_cpus(cpus)).then_some(before)
        });
        Pinned { saved }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(before) = &self.saved {
            set_thread_cpus(before);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::pci::tests::FakeSysfs;

    #[test]
    fn cpu_lists_read_and_write_as_the_kernels() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("a"), None);
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[5]), "5");
        assert_eq!(format_cpulist(&[]), "");
    }

    #[test]
    fn the_gpus_node_within_the_process_as_nvidias() {
        assert_eq!(choose(&[0, 1, 2, 3], &[2, 3, 4], false), Some(vec![2, 3]));
        assert_eq!(choose(&[0, 1], &[2, 3], false), None, "empty, ignoring");
        assert_eq!(choose(&[0, 1], &[2, 3], true), Some(vec![0, 1]));
        let fake = FakeSysfs::new();
        let sysfs = fake.sysfs();
        fake.device("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0", 1, true);
        fake.device(
            "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0",
            -1,
            true,
        );
        fake.node_cpus(1, "16-31,48-63");
        assert_eq!(
            gpu_cpus(&sysfs, "0000:01:00.0"),
            Some((16..32).chain(48..64).collect())
        );
        assert_eq!(gpu_cpus(&sysfs, "0000:81:00.0"), None, "no NUMA node");
        assert_eq!(gpu_cpus(&sysfs, "0000:99:00.0"), None, "no such device");
    }

    #[test]
    fn a_pinned_thread_comes_back_to_its_own_cpus() {
        std::thread::spawn(|| {
            let own = thread_cpus();
            assert!(!own.is_empty());
            let first = [own[0]];
            {
                let _pinned = Pinned::enter(Some(&first));
                assert_eq!(thread_cpus(), first);
                let child = std::thread::spawn(thread_cpus).join().unwrap();
                assert_eq!(child, first, "threads started meanwhile inherit the CPUs");
            }
            assert_eq!(thread_cpus(), own);
            let _none = Pinned::enter(None);
            assert_eq!(thread_cpus(), own);
        })
        .join()
        .unwrap();
    }
}
