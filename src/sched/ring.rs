//! Ring arithmetic shared by the planner and the simulator: the neighbours of a rank, how a
//! range of elements is cut into pieces, and the step schedule of every ring collective —
//! which block a rank sends, receives, reduces or writes at step `s`. The kernels
//! (`kernels/collectives.cuh`) follow the same schedule; the simulator runs it against them.

use super::CollKind;

/// The rank this rank sends to on a ring channel.
pub fn next(rank: i32, nranks: i32) -> i32 {
    (rank + 1) % nranks
}

/// The rank this rank receives from on a ring channel.
pub fn prev(rank: i32, nranks: i32) -> i32 {
    (rank + nranks - 1) % nranks
}

/// Elements of one 16-byte unit, the granularity ring ranges are cut at.
pub fn element_granularity(elem_size: u64) -> u64 {
    (16 / elem_size).max(1)
}

/// Length of every part (but the last, which may be shorter or empty) when `total` is cut
/// into `parts` parts whose starts are multiples of `gran`.
pub fn part_len(total: u64, parts: u64, gran: u64) -> u64 {
    total.div_ceil(parts).div_ceil(gran) * gran
}

/// What a rank does at one step of a ring collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingStep {
    /// Index of the rank block (all-reduce: of the piece) the step works on.
    pub block: u64,
    /// Reads the user's input (combined with what it receives, if it receives).
    pub input: bool,
    /// Receives the previous rank's data.
    pub recv: bool,
    /// Sends the step's result to the next rank.
    pub send: bool,
    /// Writes the step's result to the user's output.
    pub output: bool,
    /// Applies the op's post transform (the last reduction of a block).
    pub post: bool,
}

fn modn(a: i64, n: i64) -> u64 {
    a.rem_euclid(n) as u64
}

/// Ring all-reduce on `nranks` ranks, 2(n-1) + 1 steps: reduce-scatter of the blocks
/// `rank-1, rank-2, ...` (the last one, the rank's own block, is complete and written out),
/// then all-gather of the completed blocks `rank-1-s` coming round.
pub fn all_reduce_steps(rank: i32, nranks: i32) -> Vec<RingStep> {
    let n = nranks as i64;
    let last = 2 * n - 2;
    (0..=last)
        .map(|s| RingStep {
            block: modn(rank as i64 - 1 - s, n),
            input: s < n,
            recv: s > 0,
            send: s < last,
            output: s >= n - 1,
            post: s == n - 1,
        })
        .collect()
}

/// Ring reduce-scatter: n steps over blocks `rank-1, rank-2, ...`, ending at the rank's own
/// block, which is written out.
pub fn reduce_scatter_steps(rank: i32, nranks: i32) -> Vec<RingStep> {
    let n = nranks as i64;
    (0..n)
        .map(|s| RingStep {
            block: modn(rank as i64 - 1 - s, n),
            input: true,
            recv: s > 0,
            send: s < n - 1,
            output: s == n - 1,
            post: s == n - 1,
        })
        .collect()
}

/// Ring all-gather: n steps over blocks `rank, rank-1, ...`; the first sends the rank's own
/// block from the input (and writes it to the output when `own_block` says so).
pub fn all_gather_steps(rank: i32, nranks: i32, own_block: bool) -> Vec<RingStep> {
    let n = nranks as i64;
    (0..n)
        .map(|s| RingStep {
            block: modn(rank as i64 - s, n),
            input: s == 0,
            recv: s > 0,
            send: s < n - 1,
            output: s > 0 || own_block,
            post: false,
        })
        .collect()
}

/// Position of `rank` on the chain of a Broadcast (0 = the root) or a Reduce (the root
/// last) rooted at `root`: the chain runs along the ring, rank -> rank + 1.
pub fn chain_position(kind: CollKind, rank: i32, root: i32, nranks: i32) -> u64 {
    let shift = if kind == CollKind::Broadcast { 0 } else { 1 };
    modn(rank as i64 - root as i64 - shift, nranks as i64)
}

/// What a rank does at every step of a Broadcast or Reduce chain rooted at `root` (every
/// step of the item alike; `block` is 0).
pub fn chain_step(kind: CollKind, rank: i32, root: i32, nranks: i32) -> RingStep {
    let pos = chain_position(kind, rank, root, nranks);
    let first = pos == 0;
    let last = pos == nranks as u64 - 1;
    let bcast = kind == CollKind::Broadcast;
    RingStep {
        block: 0,
        input: first || !bcast,
        recv: !first,
        send: !last,
        output: if bcast { true } else { last },
        post: !bcast && last,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_reduce_hands_each_block_on_to_the_next_rank() {
        for n in 2..=8 {
            for r in 0..n {
                let steps = all_reduce_steps(r, n);
                assert_eq!(steps.len(), 2 * n as usize - 1);
                let own = &steps[n as usize - 1];
                assert_eq!((own.block, own.post, own.output), (r as u64, true, true));
                assert_eq!(steps.last().unwrap().block, next(r, n) as u64);
                // What this rank sends at step s, the next rank receives at step s + 1.
                let nxt = all_reduce_steps(next(r, n), n);
                for s in 0..steps.len() - 1 {
                    assert_eq!(steps[s].block, nxt[s + 1].block, "n={n} r={r} s={s}");
                }
            }
        }
    }

    #[test]
    fn chains_start_at_the_root_and_end_at_it() {
        for n in 2..=5 {
            for root in 0..n {
                let b = chain_step(CollKind::Broadcast, root, root, n);
                assert!(b.send && !b.recv && b.input);
                let r = chain_step(CollKind::Reduce, root, root, n);
                assert!(r.recv && !r.send && r.post && r.output);
                assert_eq!(prev(next(root, n), n), root);
            }
        }
    }
}
