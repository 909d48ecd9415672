//! Tests of the bootstrap: rendezvous and collectives among threads and among processes,
//! strangers, missing and dying ranks, sub-communicators, several roots, and abort.

use super::id::{id_from_hex, id_to_hex, IdInfo};
use super::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Instant;

fn cfg(secs: f64) -> BootstrapConfig {
    BootstrapConfig {
        timeout: Duration::from_secs_f64(secs),
    }
}

fn new_ids(count: usize, c: &BootstrapConfig) -> Vec<ncclUniqueId> {
    (0..count).map(|_| get_unique_id_with(c).unwrap()).collect()
}

/// Run `body` for each rank in `ranks` on its own thread after init; results by position.
fn run_ranks<T: Send>(
    ids: &[ncclUniqueId],
    ranks: &[i32],
    nranks: i32,
    c: &BootstrapConfig,
    body: impl Fn(Bootstrap) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|&rank| {
                let body = &body;
                s.spawn(move || {
                    let abort = Arc::new(AtomicBool::new(false));
                    body(Bootstrap::init_with(ids, rank, nranks, abort, c)?)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The data rank `rank` contributes to allgather round `round`.
fn contribution(rank: i32, round: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (rank as u8).wrapping_mul(31).wrapping_add(i as u8) ^ round)
        .collect()
}

/// Allgather, barrier and send/recv checks every rank runs.
fn exercise(b: &Bootstrap) -> Result<()> {
    let (rank, n) = (b.rank(), b.nranks());
    for (round, len) in [(0u8, 0usize), (1, 1), (2, 100), (3, 5000)] {
        let all = b.allgather(&contribution(rank, round, len))?;
        assert_eq!(all.len(), n as usize);
        for (r, got) in all.iter().enumerate() {
            assert_eq!(
                got,
                &contribution(r as i32, round, len),
                "rank {rank} round {round} from {r}"
            );
        }
    }
    b.barrier()?;
    // Tagged messages to a peer, sent in one order and received in the other.
    let to = (rank + 1) % n;
    let from = (rank + n - 1) % n;
    b.send(to, 7, &[rank as u8; 3])?;
    b.send(to, 9, format!("nine from {rank}").as_bytes())?;
    b.send(to, 7, &[rank as u8, 1])?;
    assert_eq!(b.recv(from, 9)?, format!("nine from {from}").as_bytes());
    assert_eq!(b.recv(from, 7)?, vec![from as u8; 3]);
    assert_eq!(b.recv(from, 7)?, vec![from as u8, 1]);
    // Everyone to everyone (small n only, to bound the number of connections).
    if n <= 8 {
        for peer in 0..n {
            b.send(peer, 1000 + rank as u64, &contribution(rank, 9, 17))?;
        }
        for peer in 0..n {
            assert_eq!(b.recv(peer, 1000 + peer as u64)?, contribution(peer, 9, 17));
        }
    }
    b.barrier()
}

fn threads_case(n: i32) {
    let c = cfg(20.0);
    let ids = new_ids(1, &c);
    let ranks: Vec<i32> = (0..n).collect();
    for (rank, r) in run_ranks(&ids, &ranks, n, &c, |b| exercise(&b))
        .into_iter()
        .enumerate()
    {
        r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
}

#[test]
fn threads_1() {
    threads_case(1);
}

#[test]
fn threads_2() {
    threads_case(2);
}

#[test]
fn threads_8() {
    threads_case(8);
}

#[test]
fn threads_64() {
    threads_case(64);
}

#[test]
fn large_messages() {
    let c = cfg(20.0);
    let ids = new_ids(1, &c);
    let big: Vec<u8> = (0..24 << 20)
        .map(|i: u32| (i * 7 + i / 4096) as u8)
        .collect();
    let results = run_ranks(&ids, &[0, 1], 2, &c, |b| {
        // Both send a large message before either receives: nobody may block.
        let peer = 1 - b.rank();
        b.send(peer, 5, &big)?;
        let got = b.recv(peer, 5)?;
        assert!(got == big, "large message corrupted");
        let all = b.allgather(&big[..3 << 20])?;
        assert!(all.iter().all(|a| a[..] == big[..3 << 20]));
        Ok(())
    });
    for r in results {
        r.unwrap();
    }
}

#[test]
fn several_roots() {
    for (nroots, nranks) in [(2, 2), (2, 7), (3, 7), (3, 3), (3, 10)] {
        let c = cfg(20.0);
        let ids = new_ids(nroots, &c);
        let ranks: Vec<i32> = (0..nranks).collect();
        for (rank, r) in run_ranks(&ids, &ranks, nranks, &c, |b| exercise(&b))
            .into_iter()
            .enumerate()
        {
            r.unwrap_or_else(|e| panic!("{nroots} roots, rank {rank} of {nranks}: {e}"));
        }
    }
}

#[test]
fn sub_communicators() {
    let c = cfg(20.0);
    let ids = new_ids(1, &c);
    let n = 8;
    let ranks: Vec<i32> = (0..n).collect();
    let results = run_ranks(&ids, &ranks, n, &c, |b| {
        let rank = b.rank();
        let reversed: Vec<i32> = (0..n).rev().collect();
        let evens: Vec<i32> = (0..n).filter(|r| r % 2 == 0).collect();
        let odds: Vec<i32> = (0..n).filter(|r| r % 2 == 1).rev().collect();
        let scattered = vec![5, 2, 7];
        let single = vec![rank];
        // Evens and odds split concurrently (same call on every rank, different tags).
        let split = if rank % 2 == 0 {
            (&evens, 1)
        } else {
            (&odds, 2)
        };
        let patterns: Vec<(&Vec<i32>, u64)> =
            vec![(&reversed, 0), split, (&scattered, 3), (&single, 4)];
        for (members, tag) in patterns {
            if !members.contains(&rank) {
                continue;
            }
            let child = b.sub(members, tag, Arc::new(AtomicBool::new(false)))?;
            let new_rank = members.iter().position(|&m| m == rank).unwrap() as i32;
            assert_eq!(child.rank(), new_rank);
            assert_eq!(child.nranks(), members.len() as i32);
            let all = child.allgather(&rank.to_le_bytes())?;
            let parents: Vec<i32> = all
                .iter()
                .map(|v| i32::from_le_bytes(v[..4].try_into().unwrap()))
                .collect();
            assert_eq!(&parents, members, "tag {tag}");
            exercise(&child)?;
            // A grandchild of the child.
            if members.len() >= 2 {
                let grand = child.sub(&[1, 0], 77, Arc::new(AtomicBool::new(false)));
                if child.rank() < 2 {
                    let grand = grand?;
                    grand.barrier()?;
                    assert_eq!(
                        grand.allgather(&[child.rank() as u8])?,
                        vec![vec![1], vec![0]]
                    );
                } else {
                    assert!(grand.is_err(), "a non-member's sub must fail");
                }
            }
        }
        b.barrier()
    });
    for (rank, r) in results.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
}

#[test]
fn missing_rank_is_named() {
    let c = cfg(1.5);
    let ids = new_ids(1, &c);
    let start = Instant::now();
    let results = run_ranks(&ids, &[0, 1, 3, 4, 5], 8, &c, |_| Ok(()));
    let elapsed = start.elapsed();
    for r in results {
        let err = r.expect_err("init must fail with a missing rank");
        assert!(err.msg.contains("[2, 6, 7] of 8"), "{}", err.msg);
        assert!(err.msg.contains("timed out after 1.5 s"), "{}", err.msg);
    }
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
}

#[test]
fn missing_rank_with_several_roots() {
    let c = cfg(1.0);
    let ids = new_ids(2, &c);
    // Ranks 0..3 use root 0, 3..6 root 1; rank 4 never comes. Root 1 names it to ranks 3
    // and 5; rank 3 passes that on to block 0, which root 0 had already completed.
    let start = Instant::now();
    let results = run_ranks(&ids, &[0, 1, 2, 3, 5], 6, &c, |_| Ok(()));
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "took {:?}",
        start.elapsed()
    );
    for r in results {
        let err = r.expect_err("init must fail with a missing rank");
        assert!(err.msg.contains("[4] of 6"), "{}", err.msg);
    }
}

/// Rank 2 registers with the root, then its process "dies" (its connection closes and its
/// listening address refuses connections). The others start `delay` later.
fn dying_rank_case(delay: Duration) -> Vec<Error> {
    let c = cfg(30.0);
    let ids = new_ids(1, &c);
    let info = IdInfo::decode(&ids[0]).unwrap();
    let start = Instant::now();
    let results = std::thread::scope(|s| {
        s.spawn(|| {
            let never = AtomicBool::new(false);
            let limits = Limits::new(Duration::from_secs(5), &never);
            let reg = root::Registration {
                rank: 2,
                nranks: 4,
                root: 0,
                nroots: 1,
                neighbour: false,
                addr: "127.0.0.1:1".parse().unwrap(),
            };
            let stream = root::register(&info.root, &info.secret, &reg, &limits).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            drop(stream);
        });
        std::thread::sleep(delay);
        // A rank whose own init completed still fails at its first collective.
        run_ranks(&ids, &[0, 1, 3], 4, &c, |b| b.barrier())
    });
    assert!(
        start.elapsed() < delay + Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    results
        .into_iter()
        .map(|r| r.expect_err("init must fail when a rank dies"))
        .collect()
}

#[test]
fn rank_dying_before_the_rendezvous_completes() {
    for err in dying_rank_case(Duration::from_millis(600)) {
        assert!(
            err.msg.contains("rank 2 of 4 closed its connection"),
            "{}",
            err.msg
        );
        assert_eq!(err.code, crate::abi::ncclResult_t::ncclRemoteError);
    }
}

#[test]
fn rank_dying_around_the_rendezvous() {
    // Whether the root completes before rank 2 dies depends on timing; either way every
    // other rank fails promptly with an error that names rank 2.
    for err in dying_rank_case(Duration::ZERO) {
        assert!(err.msg.contains("rank 2 "), "{}", err.msg);
        assert_eq!(
            err.code,
            crate::abi::ncclResult_t::ncclRemoteError,
            "{}",
            err.msg
        );
    }
}

#[test]
fn dying_peer_fails_collective_promptly() {
    let c = cfg(30.0);
    let ids = new_ids(1, &c);
    let start = Instant::now();
    let results = run_ranks(&ids, &[0, 1, 2, 3], 4, &c, |b| {
        if b.rank() == 2 {
            drop(b); // Leaves without taking part.
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
        b.barrier()
    });
    for (rank, r) in results.into_iter().enumerate() {
        if rank == 2 {
            continue;
        }
        let err = r.expect_err("a barrier without rank 2 must fail");
        assert!(
            err.msg.contains("closed its connection"),
            "rank {rank}: {}",
            err.msg
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn wrong_nranks_is_named() {
    let c = cfg(5.0);
    let ids = new_ids(1, &c);
    let start = Instant::now();
    let results = std::thread::scope(|s| {
        let bad = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            Bootstrap::init_with(&ids, 2, 5, Arc::new(AtomicBool::new(false)), &c).map(|_| ())
        });
        let good = run_ranks(&ids, &[0, 1, 3], 4, &c, |_| Ok(()));
        (bad.join().unwrap(), good)
    });
    let bad = results.0.expect_err("a wrong nranks must fail");
    assert!(
        bad.msg.contains("rank 2 called init with nranks 5"),
        "{}",
        bad.msg
    );
    for r in results.1 {
        let err = r.expect_err("the others fail too");
        assert!(
            err.msg.contains("rank 2 called init with nranks 5"),
            "{}",
            err.msg
        );
    }
    assert!(start.elapsed() < Duration::from_secs(4));
}

#[test]
fn implausible_registrations_and_answers_are_refused() {
    let c = cfg(10.0);
    let ids = new_ids(1, &c);
    let info = IdInfo::decode(&ids[0]).unwrap();
    let never = AtomicBool::new(false);
    let limits = Limits::new(Duration::from_secs(5), &never);
    // A registration claiming i32::MAX ranks: refused with a message, nothing sized by it.
    let huge = root::Registration {
        rank: 0,
        nranks: i32::MAX,
        root: 0,
        nroots: 1,
        neighbour: false,
        addr: "127.0.0.1:1".parse().unwrap(),
    };
    let stream = root::register(&info.root, &info.secret, &huge, &limits).unwrap();
    let err = root::await_reply(&stream, &info.root, &limits).unwrap_err();
    assert!(
        err.msg.contains("registered with nranks 2147483647"),
        "{}",
        err.msg
    );
    let flag = Arc::new(AtomicBool::new(false));
    assert!(Bootstrap::init_with(&ids, 0, i32::MAX, flag, &c).is_err());
    // A root's answer whose block lies outside the communicator (a neighbour root answering
    // `first = 1000` for 8 ranks) is an error, not an index out of range.
    let addr: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    let answer = |first: i32, n: usize| root::RootReply {
        next: addr,
        first,
        table: vec![addr; n],
    };
    assert!(answer(1000, 1).check(8, &addr).is_err());
    assert!(answer(-1, 2).check(8, &addr).is_err());
    assert!(answer(6, 3).check(8, &addr).is_err());
    assert!(answer(0, 0).check(8, &addr).is_err());
    assert!(answer(6, 2).check(8, &addr).is_ok());
    assert!(answer(0, 8).check(8, &addr).is_ok());
}

#[test]
fn strangers_are_refused() {
    let c = cfg(20.0);
    let ids = new_ids(1, &c);
    let info = IdInfo::decode(&ids[0]).unwrap();
    // Strangers at the root: garbage, a wrong secret, and one that says nothing.
    let mut garbage = TcpStream::connect(info.root).unwrap();
    garbage.write_all(&[0x55; 200]).unwrap();
    let silent = TcpStream::connect(info.root).unwrap();
    let never = AtomicBool::new(false);
    let limits = Limits::new(Duration::from_secs(5), &never);
    let reg = root::Registration {
        rank: 0,
        nranks: 3,
        root: 0,
        nroots: 1,
        neighbour: false,
        addr: "127.0.0.1:1".parse().unwrap(),
    };
    let wrong = root::register(&info.root, b"not the secret!!", &reg, &limits).unwrap();
    let err = root::await_reply(&wrong, &info.root, &limits).unwrap_err();
    assert!(err.msg.contains("closed the connection"), "{}", err.msg);
    let results = run_ranks(&ids, &[0, 1, 2], 3, &c, |b| {
        if b.rank() == 1 {
            // A stranger at this rank's listener: refused (closed), and never taken as a rank.
            let addr = b.peer_addrs()[1].unwrap();
            let mut s = TcpStream::connect(addr).unwrap();
            let mut hello = Vec::from(*b"OXBSHELO");
            hello.extend_from_slice(b"not the secret!!");
            hello.extend_from_slice(&0i32.to_le_bytes());
            hello.extend_from_slice(&3i32.to_le_bytes());
            hello.extend_from_slice(&[0u8; 64]);
            s.write_all(&hello).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 8];
            assert_eq!(
                s.read(&mut buf).unwrap_or(0),
                0,
                "the stranger must be disconnected"
            );
        }
        b.barrier()?;
        exercise(&b)
    });
    for r in results {
        r.unwrap();
    }
    drop((garbage, silent));
}

#[test]
fn abort_ends_waits_promptly() {
    let c = cfg(60.0);
    let ids = new_ids(1, &c);
    let abort = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let (init_result, recv_result) = std::thread::scope(|s| {
        // Rank 0 of 2 waits for a rank that never comes.
        let waiting = s.spawn(|| Bootstrap::init_with(&ids, 0, 2, abort.clone(), &c).map(|_| ()));
        std::thread::sleep(Duration::from_millis(300));
        abort.store(true, Ordering::Release);
        let init_result = waiting.join().unwrap();
        // A receive on a working bootstrap, aborted from another thread.
        let b = Bootstrap::init_with(&new_ids(1, &c), 0, 1, Arc::new(AtomicBool::new(false)), &c)
            .unwrap();
        let flag = b.abort_flag().clone();
        let t = Instant::now();
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            flag.store(true, Ordering::Release);
        });
        let recv_result = b.recv(0, 1);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "recv took {:?}",
            t.elapsed()
        );
        (init_result, recv_result)
    });
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    let err = init_result.unwrap_err();
    assert!(err.msg.contains("aborted"), "{}", err.msg);
    let err = recv_result.unwrap_err();
    assert!(err.msg.contains("aborted"), "{}", err.msg);
}

#[test]
fn bad_arguments() {
    let c = cfg(5.0);
    let ids = new_ids(1, &c);
    let flag = || Arc::new(AtomicBool::new(false));
    assert!(Bootstrap::init_with(&ids, 2, 2, flag(), &c).is_err());
    assert!(Bootstrap::init_with(&ids, -1, 2, flag(), &c).is_err());
    assert!(Bootstrap::init_with(&[], 0, 1, flag(), &c).is_err());
    let zero = ncclUniqueId { internal: [0; 128] };
    assert!(Bootstrap::init_with(&[zero], 0, 1, flag(), &c).is_err());
    let b = Bootstrap::init_with(&ids, 0, 1, flag(), &c).unwrap();
    assert!(b.send(1, 0, &[]).is_err());
    assert!(b.sub(&[0, 0], 1, flag()).is_err());
    assert!(b.sub(&[3], 1, flag()).is_err());
}

// ---- Several processes: the test binary runs itself in a child mode. ----

const CHILD_ENV: &str = "OXCCL_BOOTSTRAP_TEST_CHILD";

/// In a child process: join as the rank named by the environment and exercise the bootstrap.
/// In the normal test run (no variable) it does nothing.
#[test]
fn child_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split(',').collect();
    let rank: i32 = parts[0].parse().unwrap();
    let nranks: i32 = parts[1].parse().unwrap();
    let c = cfg(20.0);
    // "env" means: make the id here from NCCL_COMM_ID, as every process of such a job does.
    let id = if parts[2] == "env" {
        get_unique_id_with(&c).unwrap()
    } else {
        id_from_hex(parts[2]).unwrap()
    };
    let b = Bootstrap::init_with(&[id], rank, nranks, Arc::new(AtomicBool::new(false)), &c)
        .unwrap_or_else(|e| panic!("child rank {rank}: {e}"));
    exercise(&b).unwrap_or_else(|e| panic!("child rank {rank}: {e}"));
    let pids = b.allgather(&std::process::id().to_le_bytes()).unwrap();
    let distinct: std::collections::HashSet<_> = pids.iter().collect();
    assert_eq!(
        distinct.len(),
        nranks as usize,
        "each rank is its own process"
    );
    println!("CHILD_OK rank {rank}");
}

fn spawn_child(rank: i32, nranks: i32, id_text: &str, env: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "bootstrap::tests::child_entry",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, format!("{rank},{nranks},{id_text}"))
    .env_remove("NCCL_COMM_ID")
    .env_remove("NCCL_SOCKET_IFNAME")
    .env_remove("NCCL_SOCKET_FAMILY")
    .env("NCCL_DEBUG", "INFO")
    .env("NCCL_DEBUG_SUBSYS", "BOOTSTRAP")
    .envs(env.iter().copied())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    cmd.spawn().unwrap()
}

/// Wait for every child to pass; returns their output.
fn wait_children(children: Vec<std::process::Child>) -> Vec<String> {
    let mut outputs = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && stdout.contains(&format!("CHILD_OK rank {rank}")),
            "child rank {rank} failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        outputs.push(stdout);
    }
    outputs
}

#[test]
fn processes_4() {
    let c = cfg(20.0);
    let id = get_unique_id_with(&c).unwrap();
    let hex = id_to_hex(&id);
    let children: Vec<_> = (0..4).map(|rank| spawn_child(rank, 4, &hex, &[])).collect();
    for out in wait_children(children) {
        assert!(out.contains("NCCL INFO Bootstrap: Using "), "{out}");
    }
}

/// A free port on `ip` (for a root that rank 0 starts).
fn free_port(ip: &str) -> Option<u16> {
    let probe = std::net::TcpListener::bind((ip, 0)).ok()?;
    Some(probe.local_addr().ok()?.port())
}

#[test]
fn processes_with_comm_id() {
    let comm_id = format!("127.0.0.1:{}", free_port("127.0.0.1").unwrap());
    let env = [
        ("NCCL_COMM_ID", comm_id.as_str()),
        ("NCCL_SOCKET_IFNAME", "=lo"),
    ];
    let children: Vec<_> = (0..4)
        .map(|rank| spawn_child(rank, 4, "env", &env))
        .collect();
    for out in wait_children(children) {
        assert!(
            out.contains("NCCL INFO Bootstrap: Using lo:127.0.0.1<0>"),
            "{out}"
        );
    }
}

#[test]
fn processes_over_ipv6() {
    let Some(port) = free_port("::1") else {
        eprintln!("no IPv6 loopback here; skipping");
        return;
    };
    let comm_id = format!("[::1]:{port}");
    let env = [
        ("NCCL_COMM_ID", comm_id.as_str()),
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_SOCKET_FAMILY", "AF_INET6"),
    ];
    let children: Vec<_> = (0..3)
        .map(|rank| spawn_child(rank, 3, "env", &env))
        .collect();
    for out in wait_children(children) {
        assert!(
            out.contains("NCCL INFO Bootstrap: Using lo:::1<0>"),
            "{out}"
        );
    }
}

#[test]
fn bootstrap_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Bootstrap>();
}
