//! Plans that differ only in where the user's buffers lie. A plan depends on the buffer
//! addresses only through their values in the items and copies and through how the buffers
//! of a group overlap (in place or not). So the plan cache keys a group by its *layout*: every
//! buffer is a region of bytes, overlapping or touching regions merge into one segment, and
//! each address becomes (segment, offset in it). Two groups with the same key have the same
//! plan up to moving every segment, which `relocate` does to the plan's addresses: a loop that
//! calls one collective on ever-different buffers (a caching allocator, nccl-tests' moving
//! offsets) plans once.

use super::device::{OxWork, WORK_SIZE};
use super::plan::Plan;
use super::{CollKind, Task};
use std::mem::offset_of;

/// One merged stretch of buffers: `[base, end]`, both ends included (an item may point at the
/// end of its buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub base: u64,
    pub end: u64,
}

/// Offsets within a segment must fit below the segment number in a key's address.
const OFFSET_BITS: u32 = 48;

/// The bytes a task's send and receive buffers span on a communicator of `nranks` ranks
/// (`Task::count` keeps the API's meaning).
fn buffer_bytes(task: &Task, nranks: i32) -> (u64, u64) {
    let one = task.count as u64 * task.dtype.size() as u64;
    let all = one * nranks.max(1) as u64;
    match task.kind {
        CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => (one, one),
        CollKind::AllGather | CollKind::Gather => (one, all),
        CollKind::ReduceScatter | CollKind::Scatter => (all, one),
        CollKind::AlltoAll => (all, all),
        CollKind::Send => (one, 0),
        CollKind::Recv => (0, one),
    }
}

/// A group's layout: the plan-cache key (`tasks` with every address replaced by its segment
/// number, in the top bits, and its offset in the segment), the segments in order of first
/// appearance and their bases; with the buffers `layout_into` works in, so a caller that keeps
/// one computes layouts without allocating.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub key: Vec<Task>,
    pub segments: Vec<Segment>,
    /// Each segment's base, in the order of `segments`: where a plan moves to (`Move::to`).
    pub bases: Vec<u64>,
    regions: Vec<Segment>,
    merged: Vec<Segment>,
    order: Vec<usize>,
}

/// The key and the segments of `tasks` (`Layout`, in new vectors: for tests); None when an
/// offset is too large to encode.
#[cfg(test)]
pub fn layout(tasks: &[Task], nranks: i32) -> Option<(Vec<Task>, Vec<Segment>)> {
    let mut l = Layout::default();
    layout_into(tasks, nranks, &mut l).then_some((l.key, l.segments))
}

/// `tasks`' layout into `out`, in the buffers it already has; false when an offset is too
/// large to encode (`out` then holds nothing meaningful).
pub fn layout_into(tasks: &[Task], nranks: i32, out: &mut Layout) -> bool {
    out.regions.clear();
    for t in tasks {
        let (send, recv) = buffer_bytes(t, nranks);
        let (Some(send_end), Some(recv_end)) =
            (t.sendbuff.checked_add(send), t.recvbuff.checked_add(recv))
        else {
            return false;
        };
        out.regions.push(Segment {
            base: t.sendbuff,
            end: send_end,
        });
        out.regions.push(Segment {
            base: t.recvbuff,
            end: recv_end,
        });
    }
    merge_into(&out.regions, &mut out.merged);
    out.order.clear();
    out.key.clear();
    out.key.extend_from_slice(tasks);
    let (merged, order) = (&out.merged, &mut out.order);
    let mut encode = |addr: u64| -> Option<u64> {
        let s = merged
            .iter()
            .position(|s| s.base <= addr && addr <= s.end)?;
        let n = match order.iter().position(|&o| o == s) {
            Some(n) => n,
            None => {
                order.push(s);
                order.len() - 1
            }
        };
        let offset = addr - merged[s].base;
        (offset < 1 << OFFSET_BITS).then_some(((n as u64) << OFFSET_BITS) | offset)
    };
    for t in &mut out.key {
        let (Some(send), Some(recv)) = (encode(t.sendbuff), encode(t.recvbuff)) else {
            return false;
        };
        (t.sendbuff, t.recvbuff) = (send, recv);
    }
    out.segments.clear();
    out.segments
        .extend(out.order.iter().map(|&s| out.merged[s]));
    out.bases.clear();
    out.bases.extend(out.segments.iter().map(|s| s.base));
    true
}

/// The union of `regions` as disjoint segments, sorted by address, into `out`; regions that
/// overlap or touch share a segment.
fn merge_into(regions: &[Segment], out: &mut Vec<Segment>) {
    out.clear();
    out.extend_from_slice(regions);
    // Unstable: equal bases merge into one segment whatever their order, and it allocates
    // nothing.
    out.sort_unstable_by_key(|r| r.base);
    let mut kept = 0;
    for i in 0..out.len() {
        let r = out[i];
        if kept > 0 && r.base <= out[kept - 1].end {
            out[kept - 1].end = out[kept - 1].end.max(r.end);
        } else {
            out[kept] = r;
            kept += 1;
        }
    }
    out.truncate(kept);
}

/// Where every address of a plan moves: from segment `from[i]` to base `to[i]`.
pub struct Move<'a> {
    pub from: &'a [Segment],
    pub to: &'a [u64],
}

impl Move<'_> {
    /// `addr` moved with its segment; 0 (an unused pointer) stays 0. None when `addr` lies in
    /// no segment: the plan holds an address it did not take from the tasks' buffers.
    fn apply(&self, addr: u64) -> Option<u64> {
        if addr == 0 {
            return Some(0);
        }
        let i = self
            .from
            .iter()
            .position(|s| s.base <= addr && addr <= s.end)?;
        Some(
            addr.wrapping_sub(self.from[i].base)
                .wrapping_add(self.to[i]),
        )
    }
}

const SRC_AT: usize = offset_of!(OxWork, src);
const DST_AT: usize = offset_of!(OxWork, dst);

fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Move the buffer addresses of the `nitems` items that start at `bytes[at..]` (a plan's items,
/// or the launch input that begins with a copy of them). False, with nothing changed, when an
/// address lies outside every segment.
pub fn move_items(bytes: &mut [u8], at: usize, nitems: usize, mv: &Move) -> bool {
    let items = &mut bytes[at..at + nitems * WORK_SIZE];
    // First check every address, then move them: nothing changes unless all can move.
    let movable = items.chunks_exact(WORK_SIZE).all(|item| {
        [SRC_AT, DST_AT]
            .iter()
            .all(|&field| mv.apply(read_u64(item, field)).is_some())
    });
    if !movable {
        return false;
    }
    for item in items.chunks_exact_mut(WORK_SIZE) {
        for field in [SRC_AT, DST_AT] {
            let moved = mv.apply(read_u64(item, field)).expect("checked above");
            item[field..field + 8].copy_from_slice(&moved.to_ne_bytes());
        }
    }
    true
}

/// `plan` with its items and copies moved; None when some address of it lies outside every
/// segment (such a plan is not served for other buffers).
pub fn relocate(plan: &Plan, mv: &Move) -> Option<Plan> {
    let mut out = plan.clone();
    move_plan(&mut out, mv).then_some(out)
}

/// Move `plan`'s items and copies in place; false, with nothing changed, when some address of
/// it lies outside every segment.
pub fn move_plan(plan: &mut Plan, mv: &Move) -> bool {
    let copies: Option<Vec<(u64, u64)>> = plan
        .copies
        .iter()
        .map(|c| Some((mv.apply(c.src)?, mv.apply(c.dst)?)))
        .collect();
    let Some(copies) = copies else {
        return false;
    };
    if !move_items(&mut plan.items, 0, plan.nitems as usize, mv) {
        return false;
    }
    for (c, (src, dst)) in plan.copies.iter_mut().zip(copies) {
        c.src = src;
        c.dst = dst;
    }
    true
}

/// The new segment bases of `tasks`, whose key equals the one `layout` gave for `planned`: the
/// bases of `layout(tasks)` itself, in the same order.
#[cfg(test)]
pub fn bases(segments: &[Segment]) -> Vec<u64> {
    segments.iter().map(|s| s.base).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::ncclDataType_t;
    use crate::sched::device::WorkKind;
    use crate::sched::plan::LocalCopy;
    use crate::sched::redop::RedOp;
    use crate::sched::TaskOptions;

    fn task(kind: CollKind, count: usize, send: u64, recv: u64) -> Task {
        Task {
            kind,
            dtype: ncclDataType_t::ncclFloat32,
            op: RedOp::Sum,
            count,
            sendbuff: send,
            recvbuff: recv,
            root: 0,
            opts: TaskOptions::default(),
            weights_epoch: 0,
        }
    }

    #[test]
    fn a_layout_kept_between_groups_gives_what_a_fresh_one_gives() {
        let groups: Vec<Vec<Task>> = vec![
            vec![task(CollKind::AllReduce, 256, 0x10000, 0x20000)],
            vec![
                task(CollKind::AllGather, 64, 0x40000, 0x50000),
                task(CollKind::AllReduce, 16, 0x50000, 0x50000),
                task(CollKind::Send, 8, 0x90000, 0),
            ],
            vec![task(CollKind::ReduceScatter, 300, 0x8000, 0x8000 + 300 * 4)],
            vec![task(CollKind::AllReduce, 1, u64::MAX - 2, 0x10)],
            vec![task(CollKind::Broadcast, 4, 0x30000, 0x30000)],
        ];
        let mut kept = Layout::default();
        for g in &groups {
            let fresh = layout(g, 4);
            assert_eq!(layout_into(g, 4, &mut kept), fresh.is_some(), "{g:?}");
            if let Some((key, segments)) = fresh {
                assert_eq!((&kept.key, &kept.segments), (&key, &segments));
                let bases: Vec<u64> = segments.iter().map(|s| s.base).collect();
                assert_eq!(kept.bases, bases);
            }
        }
    }

    #[test]
    fn moved_buffers_share_a_key() {
        let a = layout(&[task(CollKind::AllReduce, 256, 0x10000, 0x20000)], 2).unwrap();
        let b = layout(&[task(CollKind::AllReduce, 256, 0x10400, 0x90000)], 2).unwrap();
        assert_eq!(a.0, b.0);
        assert_eq!(bases(&a.1), vec![0x10000, 0x20000]);
        assert_eq!(bases(&b.1), vec![0x10400, 0x90000]);
    }

    #[test]
    fn in_place_and_out_of_place_differ() {
        let out = layout(&[task(CollKind::AllReduce, 256, 0x10000, 0x20000)], 2).unwrap();
        let inp = layout(&[task(CollKind::AllReduce, 256, 0x30000, 0x30000)], 2).unwrap();
        assert_ne!(out.0, inp.0);
        assert_eq!(inp.1.len(), 1);
        // In-place all-gather: the input is this rank's block of the output.
        let r1 = layout(&[task(CollKind::AllGather, 64, 0x1100, 0x1000)], 4).unwrap();
        let r2 = layout(&[task(CollKind::AllGather, 64, 0x1200, 0x1000)], 4).unwrap();
        assert_eq!(r1.1.len(), 1);
        assert_ne!(r1.0, r2.0);
    }

    #[test]
    fn touching_buffers_merge_and_must_stay_touching() {
        // 1 KiB input right before the output: one segment; apart: two.
        let touching = layout(&[task(CollKind::AllReduce, 256, 0x1000, 0x1400)], 2).unwrap();
        let apart = layout(&[task(CollKind::AllReduce, 256, 0x1000, 0x1800)], 2).unwrap();
        assert_eq!(touching.1.len(), 1);
        assert_eq!(apart.1.len(), 2);
        assert_ne!(touching.0, apart.0);
    }

    #[test]
    fn a_group_keys_every_buffer() {
        let g1 = [
            task(CollKind::Send, 16, 0x1000, 0),
            task(CollKind::Recv, 16, 0, 0x8000),
        ];
        let g2 = [
            task(CollKind::Send, 16, 0x5000, 0),
            task(CollKind::Recv, 16, 0, 0x3000),
        ];
        let (k1, s1) = layout(&g1, 2).unwrap();
        let (k2, s2) = layout(&g2, 2).unwrap();
        assert_eq!(k1, k2);
        // Segments in order of first appearance: the unused 0s, the send, the receive.
        assert_eq!(bases(&s1), vec![0x1000, 0, 0x8000]);
        assert_eq!(bases(&s2), vec![0x5000, 0, 0x3000]);
    }

    fn item(src: u64, dst: u64) -> OxWork {
        let mut w = OxWork::new(WorkKind::Copy);
        w.src = src;
        w.dst = dst;
        w
    }

    fn plan_of(items: &[OxWork], copies: Vec<LocalCopy>) -> Plan {
        Plan {
            copies,
            ..Plan::of_items(items, 1, 64)
        }
    }

    #[test]
    fn relocation_moves_items_and_copies_with_their_segment() {
        let (_, from) = layout(&[task(CollKind::AllReduce, 256, 0x10000, 0x20000)], 2).unwrap();
        let plan = plan_of(
            &[item(0x10000, 0x20000), item(0x10200, 0x20400)],
            vec![LocalCopy::new(0x20100, 0x10100, 16)],
        );
        let to = [0x70000u64, 0x50000];
        let moved = relocate(
            &plan,
            &Move {
                from: &from,
                to: &to,
            },
        )
        .unwrap();
        let items = crate::sched::device::deserialize_all(&moved.items);
        assert_eq!((items[0].src, items[0].dst), (0x70000, 0x50000));
        assert_eq!((items[1].src, items[1].dst), (0x70200, 0x50400));
        assert_eq!(
            (moved.copies[0].src, moved.copies[0].dst),
            (0x70100, 0x50100)
        );
        // Everything but the addresses is as it was.
        let mut back = items.clone();
        back[0].src = 0x10000;
        back[0].dst = 0x20000;
        back[1].src = 0x10200;
        back[1].dst = 0x20400;
        assert_eq!(back, crate::sched::device::deserialize_all(&plan.items));
    }

    #[test]
    fn an_address_from_elsewhere_is_not_relocated() {
        let (_, from) = layout(&[task(CollKind::AllReduce, 256, 0x10000, 0x20000)], 2).unwrap();
        let plan = plan_of(&[item(0x10000, 0x99999)], Vec::new());
        let to = [0x70000u64, 0x50000];
        assert!(relocate(
            &plan,
            &Move {
                from: &from,
                to: &to
            }
        )
        .is_none());
    }
}
