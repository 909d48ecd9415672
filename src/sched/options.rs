//! Per-call options of a task (`ncclCollConfig_t` of the `ncclXConfig` collectives, as the
//! planner uses them): bounds on the task's channels (CTAs) and the algorithms its call
//! selected. They narrow the communicator's own limits (`NCCL_MIN_CTAS`, its channel count,
//! `NCCL_ALGO`) for this task only; the default options are the plain call's, and plan
//! exactly as it does. Every rank passes the same options for a collective (NCCL's
//! contract), so both ends of every connection still plan alike.
//!
//! `algSelection` takes `NCCL_ALGO`'s syntax: comma-separated names, any case, a leading `^`
//! to exclude the listed ones instead, and clauses separated by `;`, each optionally for one
//! collective (`allreduce:ring;alltoall:p2p`; a clause for the collective wins over one
//! without a prefix; of equals, the last). The names are this library's algorithms (`Algo`):
//! `ring` (the ring, and the broadcast and reduce chains along it) and `p2p` (alltoall,
//! gather and scatter as sends and receives); NVIDIA's other names (`tree`, `collnetdirect`,
//! `collnetchain`, `nvls`, `nvlstree`, `pat`) are known but name nothing that runs here.
//! A selection that applies to a collective turns the one-shot all-reduce off for it, as any
//! `NCCL_ALGO` setting does: the caller gets the ring asked for.

use super::cost::{self, Algo, Algorithms};
use super::CollKind;

/// The options of one task. `Default` is the plain call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TaskOptions {
    /// Fewest channels (CTAs) the task's ring collective (or one-shot all-reduce) runs on,
    /// as `NCCL_MIN_CTAS` raises them; 0: the communicator's floor. The P2P operations of
    /// alltoall, gather and scatter are split by their bytes as always (their CTAs already
    /// come one or more per peer).
    pub min_ctas: u32,
    /// Most channels (CTAs) the task's items use; 0: the communicator's channels.
    pub max_ctas: u32,
    /// What the call's algorithm selection leaves of the cost model's choices.
    pub algorithms: Algorithms,
}

impl Default for TaskOptions {
    fn default() -> Self {
        TaskOptions {
            min_ctas: 0,
            max_ctas: 0,
            algorithms: Algorithms { one_shot: true },
        }
    }
}

impl TaskOptions {
    /// Most channels the task may use on a communicator of `nchannels` channels.
    pub fn max_channels(&self, nchannels: u32) -> u32 {
        match self.max_ctas {
            0 => nchannels,
            m => m.min(nchannels),
        }
        .max(1)
    }

    /// The channel floor of the task: the communicator's (`NCCL_MIN_CTAS`) raised to the
    /// task's `min_ctas`, never above `max_channels`.
    pub fn min_channels(&self, communicator_floor: u32, max_channels: u32) -> u32 {
        communicator_floor
            .max(self.min_ctas)
            .min(max_channels.max(1))
    }

    /// The algorithms the cost model may pick for the task: the communicator's
    /// (`NCCL_ALGO`) and the call's.
    pub fn algorithms_with(&self, communicator: Algorithms) -> Algorithms {
        Algorithms {
            one_shot: communicator.one_shot && self.algorithms.one_shot,
        }
    }
}

/// What an `algSelection` says for one collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Nothing (empty, or no clause for this collective): the automatic choice.
    Automatic,
    /// It allows the collective's algorithm.
    Chosen,
    /// It allows no algorithm the collective can run here, or cannot be read; the reason.
    Unsatisfiable(String),
}

/// NVIDIA's algorithm names that name nothing this library runs.
const FOREIGN_ALGORITHMS: [&str; 6] = [
    "tree",
    "collnetdirect",
    "collnetchain",
    "nvls",
    "nvlstree",
    "pat",
];

/// This library's name of an algorithm (`algSelection`).
pub fn algo_name(algo: Algo) -> &'static str {
    match algo {
        Algo::Copy => "copy",
        Algo::Ring => "ring",
        Algo::P2p => "p2p",
    }
}

/// The algorithm a collective of `kind` runs on more than one rank (a one-rank communicator
/// copies whatever was selected).
pub fn algorithm_of(kind: CollKind) -> Algo {
    cost::algorithm(kind, 2)
}

/// The collective a clause prefix names (NCCL's function names, any case).
fn collective_named(name: &str) -> Option<CollKind> {
    CollKind::ALL
        .into_iter()
        .find(|k| k.name().eq_ignore_ascii_case(name))
}

/// Whether `name` is an algorithm name at all (ours or NVIDIA's).
fn known_algorithm(name: &str) -> bool {
    let ours = [Algo::Ring, Algo::P2p].map(algo_name);
    ours.iter()
        .chain(FOREIGN_ALGORITHMS.iter())
        .any(|n| n.eq_ignore_ascii_case(name))
}

/// One clause of a selection: the collective it is for (None: all), and its list.
struct Clause<'a> {
    kind: Option<CollKind>,
    exclude: bool,
    names: Vec<&'a str>,
}

/// Read one `;`-separated clause.
fn parse_clause(clause: &str) -> Result<Clause<'_>, String> {
    let (kind, list) = match clause.split_once(':') {
        Some((coll, list)) => {
            let kind = collective_named(coll.trim())
                .ok_or_else(|| format!("'{}' is not a collective", coll.trim()))?;
            (Some(kind), list.trim())
        }
        None => (None, clause),
    };
    let (exclude, list) = match list.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let names: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if let Some(bad) = names.iter().find(|n| !known_algorithm(n)) {
        return Err(format!("'{bad}' is not an algorithm"));
    }
    if names.is_empty() {
        return Err(format!("the clause '{clause}' names no algorithm"));
    }
    Ok(Clause {
        kind,
        exclude,
        names,
    })
}

/// What the selection `spec` says for a collective of `kind`.
pub fn select(spec: &str, kind: CollKind) -> Selection {
    let mut general = None;
    let mut specific = None;
    for text in spec.split(';').map(str::trim).filter(|c| !c.is_empty()) {
        let clause = match parse_clause(text) {
            Ok(c) => c,
            Err(why) => return Selection::Unsatisfiable(why),
        };
        match clause.kind {
            None => general = Some(clause),
            Some(k) if k == kind => specific = Some(clause),
            Some(_) => {}
        }
    }
    let Some(clause) = specific.or(general) else {
        return Selection::Automatic;
    };
    let ours = algo_name(algorithm_of(kind));
    let named = clause.names.iter().any(|n| n.eq_ignore_ascii_case(ours));
    if named != clause.exclude {
        Selection::Chosen
    } else {
        Selection::Unsatisfiable(format!("it leaves out {ours}"))
    }
}

/// The options of a call whose selection for its collective was `selection` (after the
/// caller decided what an unsatisfiable one means).
pub fn algorithms_of(selection: &Selection) -> Algorithms {
    Algorithms {
        one_shot: matches!(selection, Selection::Automatic),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_syntax() {
        use CollKind::*;
        let unsat = |s: &str, k| matches!(select(s, k), Selection::Unsatisfiable(_));
        assert_eq!(select("", AllReduce), Selection::Automatic);
        assert_eq!(select(" ; ", AllReduce), Selection::Automatic);
        assert_eq!(select("ring", AllReduce), Selection::Chosen);
        assert_eq!(select("RING", Broadcast), Selection::Chosen);
        assert_eq!(select("tree,ring", ReduceScatter), Selection::Chosen);
        assert_eq!(select("^tree", AllGather), Selection::Chosen);
        assert_eq!(select("^nvls", AllReduce), Selection::Chosen);
        assert!(unsat("tree", AllReduce));
        assert!(unsat("^ring", Reduce));
        assert!(unsat("nvls,pat", AllGather));
        // Alltoall, gather and scatter run as sends and receives: p2p, not ring.
        assert_eq!(select("p2p", AlltoAll), Selection::Chosen);
        assert_eq!(select("^ring", Gather), Selection::Chosen);
        assert!(unsat("ring", Scatter));
        assert!(unsat("p2p", AllReduce));
        // Per collective: the collective's clause wins, others don't apply.
        let per = "allreduce:tree;broadcast:ring";
        assert!(unsat(per, AllReduce));
        assert_eq!(select(per, Broadcast), Selection::Chosen);
        assert_eq!(select(per, AllGather), Selection::Automatic);
        assert_eq!(select("tree;allreduce:ring", AllReduce), Selection::Chosen);
        assert!(unsat("tree;allreduce:ring", Reduce));
        assert_eq!(select("AllToAll:p2p", AlltoAll), Selection::Chosen);
        // Unreadable: unknown names and collectives, empty lists.
        assert!(unsat("rign", AllReduce));
        assert!(unsat("allreduce:ring;bcast:ring", AllReduce));
        assert!(unsat("^", AllReduce));
        assert!(unsat("allreduce:", AllReduce));
    }

    #[test]
    fn options_narrow_the_communicator() {
        let plain = TaskOptions::default();
        assert_eq!(plain.max_channels(64), 64);
        assert_eq!(plain.min_channels(1, 64), 1);
        assert_eq!(plain.min_channels(3, 2), 2);
        let on = Algorithms { one_shot: true };
        let off = Algorithms { one_shot: false };
        assert_eq!(plain.algorithms_with(on), on);
        assert_eq!(plain.algorithms_with(off), off);
        let o = TaskOptions {
            min_ctas: 4,
            max_ctas: 8,
            algorithms: algorithms_of(&Selection::Chosen),
        };
        assert_eq!(o.max_channels(64), 8);
        assert_eq!(o.max_channels(3), 3);
        assert_eq!(o.min_channels(1, 8), 4);
        assert_eq!(o.min_channels(6, 8), 6);
        assert_eq!(o.min_channels(1, 3), 3);
        assert_eq!(o.algorithms_with(on), off);
    }
}
