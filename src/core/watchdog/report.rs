//! The words of the watchdog: who a rank is (host, pid, GPU), what an operation was, and the
//! one-line hang report made from every rank's answer — the operation this rank waits in,
//! the ranks that have not called it, the ranks that called something else under the same
//! number, and the ranks that did not answer or are gone. Pure functions of their inputs.

use super::wire::{Farewell, OpDesc, Query, RankState};
use crate::sched::device::{op, GpuWait, WaitFor};
use crate::sched::CollKind;
use crate::topo::PeerInfo;
use std::fmt;
use std::time::Duration;

/// Who a rank is, for messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ident {
    pub host: String,
    pub pid: u32,
    pub cuda_dev: i32,
    pub bus_id: String,
}

impl From<&PeerInfo> for Ident {
    fn from(p: &PeerInfo) -> Ident {
        Ident {
            host: p.host.clone(),
            pid: p.pid,
            cuda_dev: p.cuda_dev,
            bus_id: p.bus_id.clone(),
        }
    }
}

/// A communicator as messages name it: its handle and its hash (NCCL's `commHash`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommName {
    pub handle: usize,
    pub hash: u64,
}

impl fmt::Display for CommName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "comm {:#x} commHash {:#018x}", self.handle, self.hash)
    }
}

/// "rank 1 (host h, pid 7, cudaDev 0, busId 0000:18:00.0)".
pub fn who(rank: i32, idents: &[Ident]) -> String {
    match idents.get(rank as usize) {
        Some(i) => format!(
            "rank {rank} (host {}, pid {}, cudaDev {}, busId {})",
            i.host, i.pid, i.cuda_dev, i.bus_id
        ),
        None => format!("rank {rank}"),
    }
}

/// "rank 2" or "ranks 0,1,3".
fn ranks(list: &[i32]) -> String {
    let names: Vec<String> = list.iter().map(|r| r.to_string()).collect();
    let s = if list.len() == 1 { "" } else { "s" };
    format!("rank{s} {}", names.join(","))
}

fn op_name(code: u32) -> &'static str {
    match code {
        op::SUM => "sum",
        op::PROD => "prod",
        op::MAX => "max",
        op::MIN => "min",
        op::AVG => "avg",
        op::PREMULSUM => "premulsum",
        _ => "unknown op",
    }
}

fn reduces(kind: CollKind) -> bool {
    matches!(
        kind,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    )
}

/// "ncclAllReduce #57", "ncclSend #3 to rank 2", "ncclRecv #3 from rank 0".
fn title(d: &OpDesc) -> String {
    let base = format!("nccl{} #{}", d.kind.name(), d.seq);
    match d.kind {
        CollKind::Send => format!("{base} to rank {}", d.root),
        CollKind::Recv => format!("{base} from rank {}", d.root),
        _ => base,
    }
}

/// "ncclAllReduce #57 (4096 × float)", with the reduction when `with_op`, and the root of a
/// rooted collective.
fn describe_with(d: &OpDesc, with_op: bool) -> String {
    let mut inner = format!("{} × {}", d.count, d.dtype.name());
    if with_op && reduces(d.kind) {
        inner.push_str(&format!(", {}", op_name(d.op)));
    }
    if d.kind.has_root() && !d.is_p2p() {
        inner.push_str(&format!(", root {}", d.root));
    }
    format!("{} ({inner})", title(d))
}

/// "ncclAllReduce #57 (4096 × float)".
pub fn describe(d: &OpDesc) -> String {
    describe_with(d, false)
}

impl OpDesc {
    fn is_p2p(&self) -> bool {
        matches!(self.kind, CollKind::Send | CollKind::Recv)
    }

    /// What must agree between ranks for one operation: kind, count, type, and the
    /// reduction and root where they matter.
    fn signature(&self) -> (CollKind, u64, u32, Option<u32>, Option<i32>) {
        let root = (self.kind.has_root() && !self.is_p2p()).then_some(self.root);
        let op = reduces(self.kind).then_some(self.op);
        (self.kind, self.count, self.dtype as u32, op, root)
    }

    /// The operation a peer must call to match this one, for its kind and count.
    fn matching_kind(&self) -> CollKind {
        match self.kind {
            CollKind::Send => CollKind::Recv,
            CollKind::Recv => CollKind::Send,
            k => k,
        }
    }
}

/// "not known" markers of counts older than the kept history.
fn count_text(n: u64) -> String {
    if n == u64::MAX {
        "?".into()
    } else {
        n.to_string()
    }
}

/// What another rank answered, or why it did not.
#[derive(Clone, Debug)]
pub enum Answer {
    State(RankState),
    /// No answer within the exchange's limit, or the query could not be sent (why).
    Silent(String),
    /// It left in order (its farewell).
    Left(Farewell),
    /// It is gone (why).
    Lost(String),
}

/// A hang report: its line, and whether it names other ranks as the cause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub line: String,
    pub blames_others: bool,
}

/// Everything a report is made from.
pub struct Findings<'a> {
    pub name: CommName,
    pub me: i32,
    pub idents: &'a [Ident],
    /// This rank's own state, `asked` being its own waiting operation.
    pub mine: &'a RankState,
    pub stuck: Duration,
    /// Every other rank's answer.
    pub answers: &'a [(i32, Answer)],
    /// Whether the operation waits in the collective check (`OXCCL_CHECK_COLLECTIVES`), not
    /// launched yet.
    pub in_check: bool,
    /// What this rank's running kernel's CTAs wait for, from its status page
    /// (`sched::device::PROGRESS_OFFSET`), by CTA.
    pub gpu_waits: &'a [GpuWait],
}

/// What one wait waits for, without its CTA: "LL data from rank 1", or by the item's fan
/// index when the address named no connection ("data from receive peer 0 of item 2").
fn gpu_wait_target(w: &GpuWait) -> String {
    let (what, dir) = match w.wait.what {
        WaitFor::SendSlot => ("a free slot".to_string(), ("to", "send")),
        WaitFor::RecvSlot => ("data".to_string(), ("from", "receive")),
        WaitFor::LlData => ("LL data".to_string(), ("from", "receive")),
        WaitFor::Other(c) => (format!("something unknown (code {c})"), ("on", "")),
    };
    let peer = match (w.peer, w.wait.item) {
        (Some(r), _) => format!("rank {r}"),
        (None, Some(i)) => format!("{} peer {} of item {i}", dir.1, w.wait.fan),
        (None, None) => format!("{} peer {} of its item", dir.1, w.wait.fan),
    };
    format!("{what} {} {peer} (step {})", dir.0, w.wait.step)
}

/// "CTA 3", "CTAs 0-6", "CTAs 0-2, 5" for CTAs in increasing order.
fn ctas_text(ctas: &[u32]) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &c in ctas {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == c => *hi = c,
            _ => runs.push((c, c)),
        }
    }
    let parts: Vec<String> = runs
        .iter()
        .map(|&(lo, hi)| match hi - lo {
            0 => lo.to_string(),
            _ => format!("{lo}-{hi}"),
        })
        .collect();
    let s = if ctas.len() == 1 { "" } else { "s" };
    format!("CTA{s} {}", parts.join(", "))
}

/// "this rank's GPU: CTAs 0-6 wait for LL data from rank 1 (step 3), CTA 7 waits for ...":
/// CTAs that wait for the same thing are named together, in the order of their first CTA;
/// None when no CTA has said anything.
pub fn gpu_waits_text(waits: &[GpuWait]) -> Option<String> {
    let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
    for w in waits {
        let target = gpu_wait_target(w);
        match groups.iter_mut().find(|(t, _)| *t == target) {
            Some((_, ctas)) => ctas.push(w.cta),
            None => groups.push((target, vec![w.cta])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(target, ctas)| {
            let verb = if ctas.len() == 1 { "waits" } else { "wait" };
            format!("{} {verb} for {target}", ctas_text(ctas))
        })
        .collect();
    (!parts.is_empty()).then(|| format!("this rank's GPU: {}", parts.join(", ")))
}

/// The WARN line of a rank whose GPU has waited `stuck` for the same things in work its
/// counters do not show (a CUDA graph's replay: graph operations are numbered once, at
/// capture): what its CTAs wait for, from whom. None when they wait for nothing.
pub fn gpu_wait_report(
    name: CommName,
    me: i32,
    idents: &[Ident],
    stuck: Duration,
    waits: &[GpuWait],
) -> Option<String> {
    let text = gpu_waits_text(waits)?;
    Some(format!(
        "{name} {}: the GPU has waited {} s in work that no operation this rank has pending \
         accounts for (a CUDA graph replay?); {text}",
        who(me, idents),
        stuck.as_secs()
    ))
}

/// The one WARN line of a rank whose operation made no progress.
pub fn hang_report(f: &Findings<'_>) -> Verdict {
    let note = if f.in_check {
        " (waiting in the collective check, OXCCL_CHECK_COLLECTIVES=1)"
    } else {
        ""
    };
    let gpu = gpu_waits_text(f.gpu_waits)
        .map(|t| format!("; {t}"))
        .unwrap_or_default();
    let Some(waiting) = f.mine.waiting else {
        return Verdict {
            line: format!(
                "{} {}: work made no progress for {} s{note}{gpu}",
                f.name,
                who(f.me, f.idents),
                f.stuck.as_secs()
            ),
            blames_others: false,
        };
    };
    let mut parts = Vec::new();
    if waiting.is_p2p() {
        p2p_findings(f, &waiting, &mut parts);
    } else {
        collective_findings(f, &waiting, &mut parts);
    }
    absent_findings(f, &waiting, &mut parts);
    let blames_others = !parts.is_empty();
    if parts.is_empty() {
        parts.push(if waiting.is_p2p() {
            format!("rank {} has called the matching operation", waiting.root)
        } else {
            "every rank has called it (and waits in it or has completed it)".into()
        });
    }
    Verdict {
        line: format!(
            "{} {}: {} has made no progress for {} s{note}; {}{gpu}",
            f.name,
            who(f.me, f.idents),
            describe(&waiting),
            f.stuck.as_secs(),
            parts.join("; ")
        ),
        blames_others,
    }
}

/// The other ranks' states, by rank.
fn states<'a>(f: &'a Findings<'_>) -> impl Iterator<Item = (i32, &'a RankState)> {
    f.answers.iter().filter_map(|(r, a)| match a {
        Answer::State(s) => Some((*r, s)),
        _ => None,
    })
}

fn collective_findings(f: &Findings<'_>, waiting: &OpDesc, parts: &mut Vec<String>) {
    let n = waiting.seq;
    let laggards: Vec<String> = states(f)
        .filter(|(_, s)| s.collectives < n)
        .map(|(r, s)| format!("{} ({})", who(r, f.idents), how_far(s)))
        .collect();
    if !laggards.is_empty() {
        let s = if laggards.len() == 1 { "" } else { "s" };
        parts.push(format!(
            "not called by {} rank{s}: {}",
            laggards.len(),
            laggards.join(", ")
        ));
    }
    // The ranks that did call #n, grouped by what they called.
    let mut callers: Vec<(i32, OpDesc)> = vec![(f.me, *waiting)];
    for (r, s) in states(f).filter(|(_, s)| s.collectives >= n) {
        if let Some(asked) = s.asked.filter(|a| !a.is_p2p() && a.seq == n) {
            callers.push((r, asked));
        }
    }
    if let Some(text) = mismatch_text(&callers) {
        parts.push(text);
    }
    // A collective some rank completed, every rank took part in: whoever still counts it as
    // pending has only not seen its end yet.
    let known_done = |s: &RankState| Some(s.collectives_done).filter(|&d| d != u64::MAX);
    let done_somewhere = states(f)
        .filter_map(|(_, s)| known_done(s))
        .chain(known_done(f.mine))
        .max()
        .unwrap_or(0);
    for (r, s) in states(f) {
        let earlier = |w: &OpDesc| !w.is_p2p() && w.seq < n && w.seq > done_somewhere;
        if let Some(w) = s.waiting.filter(earlier) {
            parts.push(format!(
                "{} still waits in {}",
                who(r, f.idents),
                describe(&w)
            ));
        }
    }
}

/// "last enqueued ncclAllReduce #3 (4096 × float), last completed ncclAllReduce #3".
fn how_far(s: &RankState) -> String {
    let enqueued = match &s.last_collective {
        Some(d) => describe(d),
        None if s.collectives == 0 => "none".into(),
        None => format!("collective #{}", s.collectives),
    };
    let completed = match &s.last_collective_done {
        Some(d) => title(d),
        None if s.collectives_done == 0 => "none".into(),
        None => format!("collective #{}", count_text(s.collectives_done)),
    };
    format!("last enqueued {enqueued}, last completed {completed}")
}

/// "rank 2 called ncclAllGather #57 (1024 × float) where ranks 0,1,3 called ncclAllReduce #57
/// (4096 × float)", when the callers of one number did not all call the same; None if they
/// did. The largest group (the one with the lowest rank among equals) is the reference; each
/// group is described by its lowest rank's call, so every rank words it alike.
pub fn mismatch_text(callers: &[(i32, OpDesc)]) -> Option<String> {
    let mut callers = callers.to_vec();
    callers.sort_by_key(|(r, _)| *r);
    let mut groups: Vec<(OpDesc, Vec<i32>)> = Vec::new();
    for (r, d) in &callers {
        let sig = signature_of(d);
        match groups.iter_mut().find(|(g, _)| signature_of(g) == sig) {
            Some((_, members)) => members.push(*r),
            None => groups.push((*d, vec![*r])),
        }
    }
    if groups.len() < 2 {
        return None;
    }
    for (_, members) in &mut groups {
        members.sort();
    }
    groups.sort_by_key(|(_, m)| (std::cmp::Reverse(m.len()), m[0]));
    let ops_differ = groups.iter().any(|(d, _)| d.op != groups[0].0.op);
    let text = |(d, m): &(OpDesc, Vec<i32>)| {
        format!("{} called {}", ranks(m), describe_with(d, ops_differ))
    };
    let others: Vec<String> = groups[1..].iter().map(text).collect();
    Some(format!("{} where {}", others.join("; "), text(&groups[0])))
}

/// What must agree, with a send and a receive counted as one kind (the two sides of one
/// transfer).
fn signature_of(d: &OpDesc) -> (CollKind, u64, u32, Option<u32>, Option<i32>) {
    let mut sig = d.signature();
    if d.is_p2p() {
        sig.0 = CollKind::Send;
    }
    sig
}

fn p2p_findings(f: &Findings<'_>, waiting: &OpDesc, parts: &mut Vec<String>) {
    let peer = waiting.root;
    let Some(s) = states(f).find(|(r, _)| *r == peer).map(|(_, s)| s) else {
        return;
    };
    let k = waiting.seq;
    let (theirs, enqueued, done) = if waiting.kind == CollKind::Send {
        ("receives from", s.p2p.recvs, s.p2p.recvs_done)
    } else {
        ("sends to", s.p2p.sends, s.p2p.sends_done)
    };
    let matching = OpDesc {
        kind: waiting.matching_kind(),
        root: f.me,
        ..*waiting
    };
    if enqueued < k {
        parts.push(format!(
            "{} has not called the matching {} (its {theirs} rank {}: {} enqueued, {} completed)",
            who(peer, f.idents),
            title(&matching),
            f.me,
            enqueued,
            count_text(done)
        ));
    } else if let Some(asked) = s.asked {
        if let Some(text) = mismatch_text(&[(f.me, *waiting), (peer, asked)]) {
            parts.push(text);
        }
    }
}

/// The ranks that did not answer, left or are gone (for a send or receive, only its peer).
fn absent_findings(f: &Findings<'_>, waiting: &OpDesc, parts: &mut Vec<String>) {
    for (r, a) in f.answers {
        if waiting.is_p2p() && *r != waiting.root {
            continue;
        }
        let text = match a {
            Answer::State(_) => continue,
            Answer::Silent(why) => format!("no answer from {}: {why}", who(*r, f.idents)),
            Answer::Left(fw) => format!(
                "{} left ({}) after completing {} collective(s)",
                who(*r, f.idents),
                fw.reason.call(),
                fw.collectives_done
            ),
            Answer::Lost(why) => format!("{} is gone: {why}", who(*r, f.idents)),
        };
        parts.push(text);
    }
}

/// "ncclAllReduce #3 (4096 × float)", "none" or "collective #3" (older than the history).
fn last_text(d: &Option<OpDesc>, n: u64) -> String {
    match d {
        Some(d) => describe(d),
        None if n == 0 => "none".into(),
        None => format!("collective #{}", count_text(n)),
    }
}

/// One rank's line of an on-demand status.
fn status_line(s: &RankState) -> String {
    let doing = match &s.waiting {
        Some(w) if s.stalled_s > 0 => {
            format!("waiting in {} for {} s", describe(w), s.stalled_s)
        }
        Some(w) => format!("running {}", describe(w)),
        None => "idle".into(),
    };
    format!(
        "last enqueued {}, last completed {}, {} operation(s) enqueued, {} completed; {doing}",
        last_text(&s.last_collective, s.collectives),
        last_text(&s.last_collective_done, s.collectives_done),
        s.enqueued,
        s.completed
    )
}

/// The on-demand status of one communicator: a header, then one line per rank.
pub fn status_text(
    name: CommName,
    me: i32,
    idents: &[Ident],
    mine: &RankState,
    answers: &[(i32, Answer)],
) -> String {
    let mut rows: Vec<(i32, String)> = vec![(me, status_line(mine))];
    for (r, a) in answers {
        let text = match a {
            Answer::State(s) => status_line(s),
            Answer::Silent(why) => format!("no answer: {why}"),
            Answer::Left(f) => format!(
                "left ({}) after completing {} collective(s)",
                f.reason.call(),
                f.collectives_done
            ),
            Answer::Lost(why) => format!("gone: {why}"),
        };
        rows.push((*r, text));
    }
    rows.sort_by_key(|(r, _)| *r);
    let mut out = format!(
        "{name}: {} ranks, as rank {me} sees them\n",
        idents.len().max(rows.len())
    );
    for (r, text) in rows {
        out.push_str(&format!("  {}: {text}\n", who(r, idents)));
    }
    out
}

/// The one WARN line of a rank that is not stuck itself, asked by a stuck one about an
/// operation it has not called or called differently (then `true`); None when it has nothing
/// to add.
pub fn behind_report(
    name: CommName,
    me: i32,
    idents: &[Ident],
    mine: &RankState,
    asker: i32,
    q: &Query,
) -> Option<(String, bool)> {
    let w = q.waiting.as_ref().filter(|_| !q.status)?;
    let head = format!("{name} {}", who(me, idents));
    let waited = format!(
        "rank {asker} has waited {} s in {}",
        q.stalled_s,
        describe(w)
    );
    let (reached, how) = match w.kind {
        CollKind::Send | CollKind::Recv => {
            let (enq, done) = if w.kind == CollKind::Send {
                (mine.p2p.recvs, mine.p2p.recvs_done)
            } else {
                (mine.p2p.sends, mine.p2p.sends_done)
            };
            let matching = OpDesc {
                kind: w.matching_kind(),
                root: asker,
                ..*w
            };
            (
                enq >= w.seq,
                format!(
                    "rank {me} has not called the matching {} ({} enqueued, {} completed)",
                    title(&matching),
                    enq,
                    count_text(done)
                ),
            )
        }
        _ => (
            mine.collectives >= w.seq,
            format!("which rank {me} has not called ({})", how_far(mine)),
        ),
    };
    if !reached {
        let sep = if w.is_p2p() { ", but" } else { "," };
        return Some((format!("{head}: {waited}{sep} {how}"), false));
    }
    let asked = mine.asked?;
    let text = mismatch_text(&[(asker, *w), (me, asked)])?;
    let line = format!("{head}: {text} (rank {asker} has waited {} s)", q.stalled_s);
    Some((line, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::device::{
        decode_wait, WAIT_FAN_SHIFT, WAIT_ITEM_SHIFT, WAIT_ITEM_UNKNOWN, WAIT_LL_DATA,
        WAIT_RECV_SLOT, WAIT_SEND_SLOT, WAIT_WHAT_SHIFT,
    };

    fn wait(cta: u32, what: u32, fan: u32, item: u32, step: u32, peer: Option<i32>) -> GpuWait {
        let word = ((what as u64) << WAIT_WHAT_SHIFT)
            | ((fan as u64) << WAIT_FAN_SHIFT)
            | ((item as u64) << WAIT_ITEM_SHIFT)
            | step as u64;
        GpuWait {
            cta,
            wait: decode_wait(word).unwrap(),
            peer,
        }
    }

    #[test]
    fn gpu_waits_are_worded() {
        assert_eq!(gpu_waits_text(&[]), None);
        let page = [
            wait(3, WAIT_RECV_SLOT, 0, 2, 17, None),
            wait(5, WAIT_SEND_SLOT, 1, 0, 4, None),
            wait(6, WAIT_LL_DATA, 0, WAIT_ITEM_UNKNOWN, 9, None),
        ];
        assert_eq!(
            gpu_waits_text(&page).unwrap(),
            "this rank's GPU: CTA 3 waits for data from receive peer 0 of item 2 (step 17), \
             CTA 5 waits for a free slot to send peer 1 of item 0 (step 4), \
             CTA 6 waits for LL data from receive peer 0 of its item (step 9)"
        );
    }

    #[test]
    fn gpu_waits_on_one_peer_are_named_together() {
        let mut page: Vec<GpuWait> = (0..7)
            .map(|c| wait(c, WAIT_LL_DATA, 0, c, 3, Some(1)))
            .collect();
        page.push(wait(9, WAIT_LL_DATA, 0, 9, 3, Some(1)));
        page.push(wait(8, WAIT_SEND_SLOT, 0, 8, 2, Some(3)));
        assert_eq!(
            gpu_waits_text(&page).unwrap(),
            "this rank's GPU: CTAs 0-6, 9 wait for LL data from rank 1 (step 3), \
             CTA 8 waits for a free slot to rank 3 (step 2)"
        );
    }

    #[test]
    fn the_hang_report_appends_the_gpu_waits() {
        let mine = RankState {
            rank: 0,
            enqueued: 1,
            launched: 1,
            completed: 0,
            collectives: 1,
            collectives_done: 0,
            last_collective: None,
            last_collective_done: None,
            waiting: None,
            stalled_s: 3,
            asked: None,
            p2p: Default::default(),
        };
        let page = [wait(1, WAIT_RECV_SLOT, 0, 0, 2, Some(1))];
        let mut f = Findings {
            name: CommName {
                handle: 0x10,
                hash: 1,
            },
            me: 0,
            idents: &[],
            mine: &mine,
            stuck: Duration::from_secs(3),
            answers: &[],
            in_check: false,
            gpu_waits: &page,
        };
        assert_eq!(
            hang_report(&f).line,
            "comm 0x10 commHash 0x0000000000000001 rank 0: work made no progress for 3 s; \
             this rank's GPU: CTA 1 waits for data from rank 1 (step 2)"
        );
        f.gpu_waits = &[];
        assert_eq!(
            hang_report(&f).line,
            "comm 0x10 commHash 0x0000000000000001 rank 0: work made no progress for 3 s"
        );
    }
}
