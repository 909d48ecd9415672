//! Growing a live communicator: `ncclCommGetUniqueId` makes the id new ranks join with, and
//! `ncclCommGrow` builds the larger communicator from the existing ranks and the new ones.
//!
//! The grown communicator is made as `ncclCommInitRank` makes one, from one unique id with
//! the new size: existing rank r joins as rank r, each new rank as the rank it passes. Only
//! the existing root passes the id; the other existing ranks learn it over the parent's
//! bootstrap (`agree_on_id`). Once the rendezvous with an id has happened its root is gone,
//! so the parent records the id as consumed and refuses it in a later grow.

use super::lifecycle::{self, InitJob, Origin};
use super::{Comm, CommConfig};
use crate::abi::{ncclComm_t, ncclConfig_t, ncclUniqueId, NCCL_UNIQUE_ID_BYTES};
use crate::bootstrap::{Bootstrap, BootstrapConfig};
use crate::cuda;
use crate::error::{Error, Result};
use crate::topo;
use parking_lot::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// A communicator's grow ids: the one handed out and not yet used, and those used.
#[derive(Default)]
pub struct GrowIds {
    state: Mutex<GrowState>,
}

#[derive(Default)]
struct GrowState {
    pending: Option<ncclUniqueId>,
    consumed: Vec<ncclUniqueId>,
}

impl GrowIds {
    /// The pending id, or a new one from `make` that becomes pending.
    fn pending_or(&self, make: impl FnOnce() -> Result<ncclUniqueId>) -> Result<ncclUniqueId> {
        let mut s = self.state.lock();
        if let Some(id) = s.pending {
            return Ok(id);
        }
        let id = make()?;
        s.pending = Some(id);
        Ok(id)
    }

    /// Whether an earlier grow's rendezvous used `id`.
    fn is_consumed(&self, id: &ncclUniqueId) -> bool {
        self.state.lock().consumed.iter().any(|c| same_id(c, id))
    }

    /// A grow's rendezvous with `id` was attempted: the id is no longer pending (its root
    /// may be gone), and it is consumed when the rendezvous succeeded.
    fn settle(&self, id: &ncclUniqueId, joined: bool) {
        let mut s = self.state.lock();
        if s.pending.as_ref().is_some_and(|p| same_id(p, id)) {
            s.pending = None;
        }
        if joined && !s.consumed.iter().any(|c| same_id(c, id)) {
            s.consumed.push(*id);
        }
    }
}

fn same_id(a: &ncclUniqueId, b: &ncclUniqueId) -> bool {
    a.internal == b.internal
}

/// `ncclCommGetUniqueId`: the id new ranks of a grow join with. While one handed out is not
/// yet used by a grow, the same id again (NVIDIA's library does not refuse a second call).
pub fn unique_id(comm: &Arc<Comm>) -> Result<ncclUniqueId> {
    comm.grow.pending_or(crate::bootstrap::get_unique_id)
}

/// The arguments one rank can check alone. `parent_nranks` is the size of the caller's
/// communicator (None for a new rank).
pub fn check_args(parent_nranks: Option<i32>, nranks: i32, has_id: bool, rank: i32) -> Result<()> {
    match parent_nranks {
        Some(p) => {
            if nranks <= p {
                crate::bail_arg!("nRanks {nranks} must be more than the communicator's {p} ranks");
            }
            if rank != -1 {
                crate::bail_arg!("an existing rank keeps its rank and passes rank -1, not {rank}");
            }
        }
        None => {
            if nranks < 2 {
                crate::bail_arg!("nRanks {nranks} leaves no room for a new rank");
            }
            if rank < 0 {
                crate::bail_arg!("new rank {rank} is negative");
            }
            if rank >= nranks {
                crate::bail_arg!("new rank {rank} exceeds total ranks {nranks}");
            }
            if !has_id {
                crate::bail_arg!(
                    "new rank {rank} passed no unique id (comm NULL needs the id \
                     from the existing root's ncclCommGetUniqueId)"
                );
            }
        }
    }
    Ok(())
}

/// `ncclCommGrow`: create this rank's communicator of `nranks` ranks into `*newcomm`, as
/// `ncclCommInitRankConfig` does (blocking, deferred to a group's end, or in the background).
pub fn grow(
    parent: Option<Arc<Comm>>,
    nranks: i32,
    id: Option<ncclUniqueId>,
    rank: i32,
    newcomm: *mut ncclComm_t,
    config: Option<&ncclConfig_t>,
) -> Result<()> {
    check_args(
        parent.as_ref().map(|p| p.nranks()),
        nranks,
        id.is_some(),
        rank,
    )?;
    crate::bootstrap::crypt::check_plaintext("communicator grow")?;
    let child = match &parent {
        Some(p) => {
            p.check_usable()?;
            let config = CommConfig::resolve(config, Some(&p.config))?;
            Comm::new(p.rank(), nranks, p.cuda_dev, config)
        }
        None => {
            lifecycle::announce(rank);
            let config = CommConfig::resolve(config, None)?;
            cuda::driver()?;
            Comm::new(rank, nranks, cuda::current_device()?, config)
        }
    };
    lifecycle::start(
        newcomm,
        InitJob {
            child: Some(Arc::new(child)),
            origin: Origin::Grow { parent, id },
        },
    )
}

/// The grown communicator's bootstrap and identity, for `comm` (already holding its rank and
/// the new size): the existing ranks agree on the id over the parent's bootstrap, then every
/// member joins the id's rendezvous (`rendezvous`).
pub fn bootstrap(
    comm: &Comm,
    parent: Option<&Arc<Comm>>,
    id: Option<&ncclUniqueId>,
) -> Result<(Bootstrap, u64)> {
    join(comm, parent, id).map_err(|e| {
        e.context(format!(
            "rank {} growing to {} ranks",
            comm.rank(),
            comm.nranks()
        ))
    })
}

/// `bootstrap` without the context its errors get.
fn join(
    comm: &Comm,
    parent: Option<&Arc<Comm>>,
    id: Option<&ncclUniqueId>,
) -> Result<(Bootstrap, u64)> {
    let id = match parent {
        Some(p) => {
            let rt = p.rt.lock();
            let rt = rt
                .as_ref()
                .ok_or_else(|| Error::invalid_usage("the communicator is not initialised"))?;
            agree_on_id(&rt.bootstrap, &p.grow, id)?
        }
        None => *id.ok_or_else(|| Error::internal("a new rank's grow without an id"))?,
    };
    let cfg = BootstrapConfig::from_env();
    let from = parent.map(|p| (p.nranks(), &p.grow));
    let boot = rendezvous(
        &id,
        comm.rank(),
        comm.nranks(),
        from,
        comm.abort.clone(),
        &cfg,
    )?;
    let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
    Ok((boot, topo::fnv1a(&bytes)))
}

/// Join the rendezvous of `id` as `rank` of `nranks`, then check every member's role
/// (`check_roles`). `parent` is the parent's size and grow ids for an existing rank, None for
/// a new one; the parent's ids record the rendezvous (`GrowIds::settle`).
fn rendezvous(
    id: &ncclUniqueId,
    rank: i32,
    nranks: i32,
    parent: Option<(i32, &GrowIds)>,
    abort: Arc<AtomicBool>,
    cfg: &BootstrapConfig,
) -> Result<Bootstrap> {
    let joined = Bootstrap::init_with(std::slice::from_ref(id), rank, nranks, abort, cfg);
    if let Some((_, ids)) = parent {
        ids.settle(id, joined.is_ok());
    }
    let boot = joined?;
    let mine = parent.map_or(-1, |(p, _)| p);
    let claims = boot
        .allgather(&mine.to_le_bytes())?
        .iter()
        .enumerate()
        .map(|(r, b)| {
            let b: [u8; 4] = b
                .as_slice()
                .try_into()
                .map_err(|_| Error::internal(format!("rank {r} sent a malformed role")))?;
            Ok(i32::from_le_bytes(b))
        })
        .collect::<Result<Vec<_>>>()?;
    check_roles(&claims)?;
    Ok(boot)
}

/// What an existing rank contributes to the id exchange.
#[derive(Clone, Copy)]
pub enum IdClaim {
    /// Passed NULL (a non-root existing rank).
    Absent,
    /// Passed this id (the root).
    Given(ncclUniqueId),
    /// Passed an id an earlier grow of this communicator consumed.
    Consumed,
}

const CLAIM_BYTES: usize = 1 + NCCL_UNIQUE_ID_BYTES;

impl IdClaim {
    fn to_bytes(self) -> Vec<u8> {
        let mut b = vec![0u8; CLAIM_BYTES];
        match self {
            IdClaim::Absent => {}
            IdClaim::Given(id) => {
                b[0] = 1;
                for (o, &c) in b[1..].iter_mut().zip(id.internal.iter()) {
                    *o = c as u8;
                }
            }
            IdClaim::Consumed => b[0] = 2,
        }
        b
    }

    fn from_bytes(b: &[u8]) -> Option<IdClaim> {
        if b.len() != CLAIM_BYTES {
            return None;
        }
        match b[0] {
            0 => Some(IdClaim::Absent),
            1 => {
                let mut id = ncclUniqueId {
                    internal: [0; NCCL_UNIQUE_ID_BYTES],
                };
                for (o, &c) in id.internal.iter_mut().zip(b[1..].iter()) {
                    *o = c as std::ffi::c_char;
                }
                Some(IdClaim::Given(id))
            }
            2 => Some(IdClaim::Consumed),
            _ => None,
        }
    }
}

/// Every existing rank says whether it passed the id, over the parent's bootstrap, and all
/// take the one id (`choose_id`), or all fail alike.
fn agree_on_id(
    parent: &Bootstrap,
    ids: &GrowIds,
    mine: Option<&ncclUniqueId>,
) -> Result<ncclUniqueId> {
    let claim = match mine {
        None => IdClaim::Absent,
        Some(id) if ids.is_consumed(id) => IdClaim::Consumed,
        Some(id) => IdClaim::Given(*id),
    };
    let claims = parent
        .allgather(&claim.to_bytes())?
        .iter()
        .enumerate()
        .map(|(r, b)| {
            IdClaim::from_bytes(b)
                .ok_or_else(|| Error::internal(format!("rank {r} sent a malformed id claim")))
        })
        .collect::<Result<Vec<_>>>()?;
    choose_id(&claims)
}

/// The id of the grow, from every existing rank's claim (indexed by rank): exactly one rank
/// (the root) gave one, and not a consumed one.
pub fn choose_id(claims: &[IdClaim]) -> Result<ncclUniqueId> {
    if let Some(r) = claims.iter().position(|c| matches!(c, IdClaim::Consumed)) {
        crate::bail_usage!(
            "rank {r} passed a unique id that an earlier grow consumed; each id \
             serves one grow (get a new one with ncclCommGetUniqueId)"
        );
    }
    let given: Vec<(usize, ncclUniqueId)> = claims
        .iter()
        .enumerate()
        .filter_map(|(r, c)| match c {
            IdClaim::Given(id) => Some((r, *id)),
            _ => None,
        })
        .collect();
    match given.as_slice() {
        [(_, id)] => Ok(*id),
        [] => Err(Error::invalid_usage(
            "no existing rank passed the unique id (the root passes it, the \
             others NULL)",
        )),
        many => {
            let ranks: Vec<usize> = many.iter().map(|(r, _)| *r).collect();
            Err(Error::invalid_usage(format!(
                "existing ranks {ranks:?} each passed a unique id; only the root \
                 passes it, the others NULL"
            )))
        }
    }
}

/// Every member's role in the grown communicator, indexed by its rank: the parent's size for
/// an existing rank, -1 for a new one. The existing ranks must be ranks 0..P of one parent of
/// P ranks, and the new ones the ranks from P on.
pub fn check_roles(claims: &[i32]) -> Result<()> {
    let parent = claims.iter().copied().max().unwrap_or(-1);
    if parent < 1 {
        crate::bail_usage!("no existing rank joined the grown communicator");
    }
    for (r, &c) in claims.iter().enumerate() {
        let r = r as i32;
        if c >= 0 && c != parent {
            crate::bail_usage!(
                "rank {r} comes from a communicator of {c} ranks, others from one \
                 of {parent}"
            );
        }
        if r < parent && c < 0 {
            crate::bail_usage!(
                "new rank {r} is below {parent}: ranks 0..{} are the existing \
                 ranks'",
                parent - 1
            );
        }
        if r >= parent && c >= 0 {
            crate::bail_usage!(
                "rank {r} is an existing rank but its communicator has {parent} \
                 ranks"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(fill: u8) -> ncclUniqueId {
        ncclUniqueId {
            internal: [fill as std::ffi::c_char; NCCL_UNIQUE_ID_BYTES],
        }
    }

    fn choose_err(claims: &[IdClaim]) -> Error {
        match choose_id(claims) {
            Ok(_) => panic!("an id was chosen"),
            Err(e) => e,
        }
    }

    fn code(r: Result<()>) -> crate::abi::ncclResult_t {
        r.err()
            .map(|e| e.code)
            .unwrap_or(crate::abi::ncclResult_t::ncclSuccess)
    }

    #[test]
    fn each_rank_checks_its_own_arguments() {
        use crate::abi::ncclResult_t::{ncclInvalidArgument as Arg, ncclSuccess as Ok};
        // Existing ranks of a 2-rank communicator.
        assert_eq!(code(check_args(Some(2), 4, true, -1)), Ok);
        assert_eq!(code(check_args(Some(2), 4, false, -1)), Ok);
        assert_eq!(code(check_args(Some(2), 2, true, -1)), Arg);
        assert_eq!(code(check_args(Some(2), 1, false, -1)), Arg);
        assert_eq!(code(check_args(Some(2), 4, false, 0)), Arg);
        // New ranks.
        assert_eq!(code(check_args(None, 4, true, 2)), Ok);
        assert_eq!(code(check_args(None, 4, true, 3)), Ok);
        assert_eq!(code(check_args(None, 4, false, 2)), Arg);
        assert_eq!(code(check_args(None, 4, true, 4)), Arg);
        assert_eq!(code(check_args(None, 4, true, -1)), Arg);
        assert_eq!(code(check_args(None, 1, true, 0)), Arg);
        let e = check_args(None, 4, true, 7).unwrap_err();
        assert!(
            e.msg.contains("new rank 7 exceeds total ranks 4"),
            "{}",
            e.msg
        );
        let e = check_args(Some(4), 3, false, -1).unwrap_err();
        assert!(
            e.msg.contains("nRanks 3") && e.msg.contains("4 ranks"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn exactly_one_existing_rank_gives_the_id() {
        let chosen = choose_id(&[IdClaim::Given(id(7)), IdClaim::Absent, IdClaim::Absent]);
        assert!(same_id(&chosen.unwrap(), &id(7)));
        let chosen = choose_id(&[IdClaim::Absent, IdClaim::Given(id(3))]);
        assert!(same_id(&chosen.unwrap(), &id(3)));
        let none = choose_err(&[IdClaim::Absent, IdClaim::Absent]);
        assert!(none.msg.contains("no existing rank"), "{}", none.msg);
        let two = choose_err(&[
            IdClaim::Given(id(1)),
            IdClaim::Absent,
            IdClaim::Given(id(1)),
        ]);
        assert!(two.msg.contains("[0, 2]"), "{}", two.msg);
        let used = choose_err(&[IdClaim::Absent, IdClaim::Consumed]);
        assert!(used.msg.contains("rank 1") && used.msg.contains("consumed"));
        assert_eq!(used.code, crate::abi::ncclResult_t::ncclInvalidUsage);
    }

    #[test]
    fn id_claims_survive_the_wire() {
        for c in [IdClaim::Absent, IdClaim::Given(id(0xa5)), IdClaim::Consumed] {
            let back = IdClaim::from_bytes(&c.to_bytes()).unwrap();
            match (c, back) {
                (IdClaim::Absent, IdClaim::Absent) | (IdClaim::Consumed, IdClaim::Consumed) => {}
                (IdClaim::Given(a), IdClaim::Given(b)) => assert!(same_id(&a, &b)),
                _ => panic!("claim changed on the wire"),
            }
        }
        assert!(IdClaim::from_bytes(&[1u8; 5]).is_none());
        assert!(IdClaim::from_bytes(&[9u8; CLAIM_BYTES]).is_none());
    }

    #[test]
    fn existing_ranks_come_first_and_new_ones_after() {
        assert!(check_roles(&[2, 2, -1, -1]).is_ok());
        assert!(check_roles(&[3, 3, 3, -1]).is_ok());
        let low = check_roles(&[2, -1, -1, -1]).unwrap_err();
        assert!(low.msg.contains("new rank 1 is below 2"), "{}", low.msg);
        let mixed = check_roles(&[2, 2, 3, -1]).unwrap_err();
        assert!(mixed.msg.contains("rank 0") || mixed.msg.contains("rank 2"));
        let nobody = check_roles(&[-1, -1]).unwrap_err();
        assert!(nobody.msg.contains("no existing rank"), "{}", nobody.msg);
    }

    #[test]
    fn a_pending_id_is_handed_out_until_a_grow_uses_it() {
        let ids = GrowIds::default();
        let first = ids.pending_or(|| Ok(id(1))).unwrap();
        let again = ids.pending_or(|| Ok(id(2))).unwrap();
        assert!(same_id(&first, &again));
        // A failed rendezvous frees the slot without consuming the id.
        ids.settle(&first, false);
        assert!(!ids.is_consumed(&first));
        let second = ids.pending_or(|| Ok(id(2))).unwrap();
        assert!(same_id(&second, &id(2)));
        ids.settle(&second, true);
        assert!(ids.is_consumed(&second));
        let third = ids.pending_or(|| Ok(id(3))).unwrap();
        assert!(same_id(&third, &id(3)));
    }

    /// Two existing ranks (threads with a 2-rank parent bootstrap) and two new ones grow to
    /// four through the id exchange and the rendezvous; a second grow with the same id fails
    /// on both existing ranks.
    #[test]
    fn two_ranks_grow_to_four_and_the_id_is_consumed() {
        let cfg = BootstrapConfig {
            timeout: std::time::Duration::from_secs(20),
        };
        let parent_id = crate::bootstrap::get_unique_id_with(&cfg).unwrap();
        let root_ids = GrowIds::default();
        let other_ids = GrowIds::default();
        let id = root_ids
            .pending_or(|| crate::bootstrap::get_unique_id_with(&cfg))
            .unwrap();
        let member = |m: i32| -> Result<(i32, i32, bool)> {
            let abort = Arc::new(AtomicBool::new(false));
            let (boot, again) = if m < 2 {
                let parent = Bootstrap::init_with(&[parent_id], m, 2, abort.clone(), &cfg)?;
                let ids = if m == 0 { &root_ids } else { &other_ids };
                let given = (m == 0).then_some(&id);
                let chosen = agree_on_id(&parent, ids, given)?;
                let boot = rendezvous(&chosen, m, 4, Some((2, ids)), abort.clone(), &cfg)?;
                // The same id again: refused by both existing ranks before any rendezvous.
                let again = agree_on_id(&parent, ids, given);
                (boot, again.is_err())
            } else {
                (rendezvous(&id, m, 4, None, abort, &cfg)?, true)
            };
            let sum: i32 = boot
                .allgather(&m.to_le_bytes())?
                .iter()
                .map(|b| i32::from_le_bytes(b.as_slice().try_into().unwrap()))
                .sum();
            assert_eq!(sum, 6);
            Ok((boot.rank(), boot.nranks(), again))
        };
        let results: Vec<Result<(i32, i32, bool)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4).map(|m| s.spawn(move || member(m))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (m, r) in results.into_iter().enumerate() {
            let (rank, nranks, refused) = r.unwrap_or_else(|e| panic!("member {m}: {}", e.msg));
            assert_eq!((rank, nranks, refused), (m as i32, 4, true));
        }
        assert!(root_ids.is_consumed(&id));
        let next = root_ids
            .pending_or(|| crate::bootstrap::get_unique_id_with(&cfg))
            .unwrap();
        assert!(!same_id(&next, &id));
    }
}
