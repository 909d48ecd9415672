//! What each rank sends and what each rank must receive. Inputs are small integers chosen per
//! (rank, element) so that every result is exactly representable in the data type and every
//! partial reduction is exact in any order: then integer and floating types alike can be
//! compared exactly. Only `avg` on floating types (NCCL multiplies by a rounded 1/n) is compared
//! with a tolerance. Also: buffer shapes per collective and the algbw/busbw formulas.

use crate::args::{Coll, Dtype, Op};
use crate::convert;

/// Scalar of the PreMulSum operator: exact in every type, so results stay exact.
pub const PREMULSUM_SCALAR: f64 = 2.0;

/// How many elements a collective moves at one benchmark size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The `count` argument passed to NCCL.
    pub count: usize,
    /// Elements in each rank's send buffer.
    pub send_elems: usize,
    /// Elements in each rank's receive buffer.
    pub recv_elems: usize,
    /// Bytes counted for algbw (the total buffer size, as nccl-tests counts it).
    pub bytes: u64,
}

/// Shape of `coll` at a total size of `size` bytes over `nranks` ranks (nccl-tests semantics:
/// all_gather/alltoall/gather receive `size` bytes, reduce_scatter/scatter send `size` bytes).
pub fn shape(coll: Coll, dtype: Dtype, size: u64, nranks: usize) -> Shape {
    let elt = dtype.size() as u64;
    let total = (size / elt) as usize;
    match coll {
        Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => Shape {
            count: total,
            send_elems: total,
            recv_elems: total,
            bytes: total as u64 * elt,
        },
        Coll::AllGather | Coll::Gather => {
            let per_rank = total / nranks;
            Shape {
                count: per_rank,
                send_elems: per_rank,
                recv_elems: per_rank * nranks,
                bytes: (per_rank * nranks) as u64 * elt,
            }
        }
        Coll::ReduceScatter | Coll::Scatter => {
            let per_rank = total / nranks;
            Shape {
                count: per_rank,
                send_elems: per_rank * nranks,
                recv_elems: per_rank,
                bytes: (per_rank * nranks) as u64 * elt,
            }
        }
        Coll::AlltoAll => {
            let per_rank = total / nranks;
            Shape {
                count: per_rank,
                send_elems: per_rank * nranks,
                recv_elems: per_rank * nranks,
                bytes: (per_rank * nranks) as u64 * elt,
            }
        }
    }
}

/// busbw = algbw × this factor: what one link carries relative to the buffer size.
pub fn bus_factor(coll: Coll, nranks: usize) -> f64 {
    let n = nranks as f64;
    match coll {
        Coll::AllReduce => 2.0 * (n - 1.0) / n,
        Coll::AllGather | Coll::ReduceScatter | Coll::AlltoAll => (n - 1.0) / n,
        Coll::Broadcast | Coll::Reduce | Coll::SendRecv | Coll::Gather | Coll::Scatter => 1.0,
    }
}

/// algbw in GB/s (10^9 bytes per second) for `bytes` moved in `time_us` microseconds.
pub fn algbw_gbs(bytes: u64, time_us: f64) -> f64 {
    if time_us <= 0.0 {
        0.0
    } else {
        bytes as f64 / 1e3 / time_us
    }
}

/// Largest magnitude for which every integer in [-L, L] is exact in `dtype` (kept well inside
/// the type's range; uint8 stops at 254 so that 255 can be the poison value).
pub fn exact_limit(dtype: Dtype) -> i64 {
    match dtype {
        Dtype::Int8 => 127,
        Dtype::Uint8 => 254,
        Dtype::Int32 | Dtype::Uint32 => 1 << 30,
        Dtype::Int64 | Dtype::Uint64 | Dtype::Double => 1 << 40,
        Dtype::Half => 2048,
        Dtype::Bfloat16 => 256,
        Dtype::Float => 1 << 24,
        Dtype::Fp8E4M3 => 16,
        Dtype::Fp8E5M2 => 8,
    }
}

/// Largest power-of-two exponent whose power (and sign) is exact in `dtype`: caps products.
fn power_of_two_limit(dtype: Dtype) -> u32 {
    match dtype {
        Dtype::Int8 => 6,
        Dtype::Uint8 => 7,
        Dtype::Int32 | Dtype::Uint32 => 30,
        Dtype::Int64 | Dtype::Uint64 => 40,
        Dtype::Half => 15,
        Dtype::Bfloat16 | Dtype::Float | Dtype::Double => 60,
        Dtype::Fp8E4M3 => 8,
        Dtype::Fp8E5M2 => 15,
    }
}

/// Byte written over every output buffer before a checked run: a value no result can take
/// (NaN for floating types, the most negative value for signed and the largest for unsigned
/// integers).
pub fn poison_byte(dtype: Dtype) -> u8 {
    if dtype.is_float() || !dtype.is_signed() {
        0xff
    } else {
        0x80
    }
}

/// Relative precision of a floating type (2^-mantissa bits); 0 for integers.
fn epsilon(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::Half => 2f64.powi(-10),
        Dtype::Bfloat16 => 2f64.powi(-7),
        Dtype::Float => 2f64.powi(-23),
        Dtype::Double => 2f64.powi(-52),
        Dtype::Fp8E4M3 => 2f64.powi(-3),
        Dtype::Fp8E5M2 => 2f64.powi(-2),
        _ => 0.0,
    }
}

fn mix(rank: usize, index: usize) -> u64 {
    let mut x = (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (rank as u64 + 1).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 32;
    x
}

/// The input values of one (data type, operator, rank count) combination.
#[derive(Debug, Clone, Copy)]
pub struct Pattern {
    pub dtype: Dtype,
    /// `None` for collectives that do not reduce.
    pub op: Option<Op>,
    pub nranks: usize,
    /// Inputs lie in [-magnitude, magnitude] (signed types) or [0, magnitude].
    magnitude: i64,
}

impl Pattern {
    pub fn new(dtype: Dtype, op: Option<Op>, nranks: usize) -> Pattern {
        let limit = exact_limit(dtype);
        let n = nranks as i64;
        let magnitude = match op {
            None | Some(Op::Max) | Some(Op::Min) | Some(Op::Prod) => limit,
            Some(Op::Sum) => limit / n,
            Some(Op::Avg) if dtype.is_float() => limit / n,
            Some(Op::Avg) => (limit - (n - 1)).max(0) / n,
            Some(Op::PreMulSum) => limit / (2 * n),
        };
        Pattern {
            dtype,
            op,
            nranks,
            magnitude,
        }
    }

    fn base(&self, rank: usize, index: usize) -> i64 {
        let h = mix(rank, index);
        let k = self.magnitude;
        if self.dtype.is_signed() {
            (h % (2 * k as u64 + 1)) as i64 - k
        } else {
            (h % (k as u64 + 1)) as i64
        }
    }

    /// Element `index` of `rank`'s input.
    pub fn input(&self, rank: usize, index: usize) -> f64 {
        match self.op {
            Some(Op::Prod) => {
                let h = mix(rank, index);
                let cap = power_of_two_limit(self.dtype) as usize;
                let magnitude = if rank < cap && h & 1 == 1 { 2.0 } else { 1.0 };
                if self.dtype.is_signed() && h & 6 == 6 {
                    -magnitude
                } else {
                    magnitude
                }
            }
            Some(Op::Avg) if !self.dtype.is_float() && rank == self.nranks - 1 => {
                // Make the sum over ranks a multiple of nranks, so the integer average is
                // exact whichever way the library rounds.
                let sum: i64 = (0..self.nranks).map(|r| self.base(r, index)).sum();
                let adjust = (-sum).rem_euclid(self.nranks as i64);
                (self.base(rank, index) + adjust) as f64
            }
            _ => self.base(rank, index) as f64,
        }
    }

    /// Expected reduction over all ranks of element `index`, and the tolerance allowed.
    pub fn reduced(&self, index: usize) -> (f64, f64) {
        let values = (0..self.nranks).map(|r| self.input(r, index));
        let n = self.nranks as f64;
        match self.op.unwrap_or(Op::Sum) {
            Op::Sum => (values.sum(), 0.0),
            Op::Prod => (values.product(), 0.0),
            Op::Max => (values.fold(f64::NEG_INFINITY, f64::max), 0.0),
            Op::Min => (values.fold(f64::INFINITY, f64::min), 0.0),
            Op::PreMulSum => (values.map(|v| v * PREMULSUM_SCALAR).sum(), 0.0),
            Op::Avg => {
                let (sum, abs_sum) = values.fold((0.0, 0.0), |(s, a), v| (s + v, a + v.abs()));
                let tolerance = (n + 2.0) * epsilon(self.dtype) * abs_sum / n;
                (sum / n, tolerance)
            }
        }
    }
}

/// Expected value (and tolerance) of output element `out_index` on `rank`, or `None` where
/// the collective leaves that rank's output undefined (non-root ranks of reduce and gather).
pub fn expected(
    coll: Coll,
    pattern: &Pattern,
    rank: usize,
    root: usize,
    count: usize,
    out_index: usize,
) -> Option<(f64, f64)> {
    let n = pattern.nranks;
    let exact = |v: f64| Some((v, 0.0));
    match coll {
        Coll::AllReduce => Some(pattern.reduced(out_index)),
        Coll::ReduceScatter => Some(pattern.reduced(rank * count + out_index)),
        Coll::Reduce if rank == root => Some(pattern.reduced(out_index)),
        Coll::Reduce => None,
        Coll::AllGather => exact(pattern.input(out_index / count, out_index % count)),
        Coll::Gather if rank == root => exact(pattern.input(out_index / count, out_index % count)),
        Coll::Gather => None,
        Coll::Broadcast => exact(pattern.input(root, out_index)),
        Coll::AlltoAll => exact(pattern.input(out_index / count, rank * count + out_index % count)),
        Coll::Scatter => exact(pattern.input(root, rank * count + out_index)),
        Coll::SendRecv => exact(pattern.input((rank + n - 1) % n, out_index)),
    }
}

/// Run `work(first_element, chunk)` over `buffer` split into element-aligned chunks on several
/// threads (a single call for small buffers), returning the per-chunk results in order.
fn par_chunks<R: Send>(
    buffer: &mut [u8],
    elt: usize,
    work: impl Fn(usize, &mut [u8]) -> R + Sync,
) -> Vec<R> {
    let elements = buffer.len() / elt;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(32);
    if elements < (1 << 16) || threads == 1 {
        return vec![work(0, buffer)];
    }
    let per_chunk = elements.div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = buffer
            .chunks_mut(per_chunk * elt)
            .enumerate()
            .map(|(i, chunk)| {
                let work = &work;
                scope.spawn(move || work(i * per_chunk, chunk))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("checker thread panicked"))
            .collect()
    })
}

/// Fill `out` (a whole number of elements) with `rank`'s input elements, starting at 0.
pub fn fill_input(pattern: &Pattern, rank: usize, out: &mut [u8]) {
    let elt = pattern.dtype.size();
    par_chunks(out, elt, |first, chunk| {
        for (i, element) in chunk.chunks_exact_mut(elt).enumerate() {
            convert::encode(pattern.dtype, pattern.input(rank, first + i), element);
        }
    });
}

/// Result of comparing one rank's output.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mismatches {
    pub wrong: u64,
    /// The first few wrong elements: (index, expected, got).
    pub first: Vec<(usize, f64, f64)>,
}

/// Compare `got` (the rank's whole output buffer) with the expected values.
pub fn compare(
    coll: Coll,
    pattern: &Pattern,
    rank: usize,
    root: usize,
    count: usize,
    got: &mut [u8],
) -> Mismatches {
    let elt = pattern.dtype.size();
    let parts = par_chunks(got, elt, |first, chunk| {
        let mut found = Mismatches::default();
        for (i, element) in chunk.chunks_exact(elt).enumerate() {
            let index = first + i;
            let Some((want, tolerance)) = expected(coll, pattern, rank, root, count, index) else {
                continue;
            };
            let value = convert::decode(pattern.dtype, element);
            let ok = if tolerance == 0.0 {
                value == want
            } else {
                (value - want).abs() <= tolerance
            };
            if !ok {
                found.wrong += 1;
                if found.first.len() < 4 {
                    found.first.push((index, want, value));
                }
            }
        }
        found
    });
    let mut total = Mismatches::default();
    for part in parts {
        total.wrong += part.wrong;
        for item in part.first {
            if total.first.len() < 4 {
                total.first.push(item);
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulate the collective on the host: every rank's send buffer in, outputs out, written
    /// the straightforward way with the reduction applied in the data type's own arithmetic
    /// (rounding after each step), so the exactness of the chosen inputs is tested too.
    fn simulate(coll: Coll, pattern: &Pattern, root: usize, count: usize) -> Vec<Vec<f64>> {
        let n = pattern.nranks;
        let elems = shape_elems(coll, count, n);
        let send: Vec<Vec<f64>> = (0..n)
            .map(|r| (0..elems.0).map(|i| pattern.input(r, i)).collect())
            .collect();
        let round = |v: f64| {
            let mut bytes = vec![0u8; pattern.dtype.size()];
            convert::encode(pattern.dtype, v, &mut bytes);
            convert::decode(pattern.dtype, &bytes)
        };
        let reduce = |index: usize| -> f64 {
            let op = pattern.op.unwrap_or(Op::Sum);
            let pre = |v: f64| {
                if op == Op::PreMulSum {
                    round(v * PREMULSUM_SCALAR)
                } else {
                    v
                }
            };
            let mut acc = pre(send[0][index]);
            for rank_values in &send[1..] {
                let v = pre(rank_values[index]);
                acc = round(match op {
                    Op::Sum | Op::PreMulSum | Op::Avg => acc + v,
                    Op::Prod => acc * v,
                    Op::Max => acc.max(v),
                    Op::Min => acc.min(v),
                });
            }
            if op == Op::Avg {
                round(acc / n as f64)
            } else {
                acc
            }
        };
        (0..n)
            .map(|rank| {
                (0..elems.1)
                    .map(|o| match coll {
                        Coll::AllReduce => reduce(o),
                        Coll::ReduceScatter => reduce(rank * count + o),
                        Coll::Reduce if rank == root => reduce(o),
                        Coll::Reduce | Coll::Gather if rank != root => f64::NAN,
                        Coll::AllGather | Coll::Gather => send[o / count][o % count],
                        Coll::Broadcast => send[root][o],
                        Coll::AlltoAll => send[o / count][rank * count + o % count],
                        Coll::Scatter => send[root][rank * count + o],
                        Coll::SendRecv => send[(rank + n - 1) % n][o],
                        _ => unreachable!(),
                    })
                    .collect()
            })
            .collect()
    }

    fn shape_elems(coll: Coll, count: usize, n: usize) -> (usize, usize) {
        match coll {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => (count, count),
            Coll::AllGather | Coll::Gather => (count, count * n),
            Coll::ReduceScatter | Coll::Scatter => (count * n, count),
            Coll::AlltoAll => (count * n, count * n),
        }
    }

    fn encode_all(dtype: Dtype, values: &[f64]) -> Vec<u8> {
        let mut bytes = vec![0u8; values.len() * dtype.size()];
        for (v, out) in values.iter().zip(bytes.chunks_exact_mut(dtype.size())) {
            convert::encode(dtype, *v, out);
        }
        bytes
    }

    #[test]
    fn expected_matches_simulation_for_every_combination() {
        for coll in Coll::ALL {
            let ops: Vec<Option<Op>> = if coll.has_op() {
                Op::ALL.iter().map(|o| Some(*o)).collect()
            } else {
                vec![None]
            };
            for dtype in Dtype::ALL {
                for op in &ops {
                    for nranks in [1, 2, 3, 4, 8] {
                        let pattern = Pattern::new(dtype, *op, nranks);
                        let root = nranks / 2;
                        let count = 37;
                        let outputs = simulate(coll, &pattern, root, count);
                        for (rank, output) in outputs.iter().enumerate() {
                            let mut bytes = encode_all(dtype, output);
                            let result = compare(coll, &pattern, rank, root, count, &mut bytes);
                            let skipped = output.iter().all(|v| v.is_nan());
                            assert_eq!(
                                result.wrong, 0,
                                "{coll} {dtype} {op:?} n={nranks} rank={rank}: {:?}",
                                result.first
                            );
                            // A poisoned buffer must be caught wherever output is defined.
                            let mut poisoned = vec![poison_byte(dtype); bytes.len()];
                            let caught = compare(coll, &pattern, rank, root, count, &mut poisoned);
                            if !skipped {
                                assert_eq!(caught.wrong as usize, output.len(), "{coll} {dtype}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn inputs_differ_per_rank_and_element() {
        let pattern = Pattern::new(Dtype::Float, Some(Op::Sum), 4);
        let a: Vec<f64> = (0..64).map(|i| pattern.input(0, i)).collect();
        let b: Vec<f64> = (0..64).map(|i| pattern.input(1, i)).collect();
        assert_ne!(a, b);
        assert!(a.windows(2).any(|w| w[0] != w[1]));
        // fp8 sums over 8 ranks keep enough range to be meaningful.
        let pattern = Pattern::new(Dtype::Fp8E4M3, Some(Op::Sum), 8);
        assert!((0..256).any(|i| pattern.input(3, i) != 0.0));
    }

    #[test]
    fn wrong_values_are_counted() {
        let pattern = Pattern::new(Dtype::Int32, Some(Op::Sum), 2);
        let count = 10;
        let want: Vec<f64> = (0..count).map(|i| pattern.reduced(i).0).collect();
        let mut bytes = encode_all(Dtype::Int32, &want);
        bytes[4..8].copy_from_slice(&12345i32.to_le_bytes());
        let result = compare(Coll::AllReduce, &pattern, 0, 0, count, &mut bytes);
        assert_eq!(result.wrong, 1);
        assert_eq!(result.first[0].0, 1);
        assert_eq!(result.first[0].2, 12345.0);
    }

    #[test]
    fn float_avg_has_tolerance_integer_avg_is_exact() {
        let pattern = Pattern::new(Dtype::Half, Some(Op::Avg), 3);
        let (_, tolerance) = pattern.reduced(5);
        assert!(tolerance >= 0.0);
        let pattern = Pattern::new(Dtype::Int32, Some(Op::Avg), 3);
        for i in 0..100 {
            let (value, tolerance) = pattern.reduced(i);
            assert_eq!(tolerance, 0.0);
            assert_eq!(value.fract(), 0.0, "integer average must be exact");
        }
    }

    #[test]
    fn large_buffers_use_parallel_chunks() {
        let pattern = Pattern::new(Dtype::Float, Some(Op::Sum), 2);
        let count = 200_003;
        let mut out = vec![0u8; count * 4];
        fill_input(&pattern, 1, &mut out);
        for i in [0, 1, 99_999, 200_002] {
            assert_eq!(
                convert::decode(Dtype::Float, &out[i * 4..i * 4 + 4]),
                pattern.input(1, i)
            );
        }
    }

    #[test]
    fn shapes_and_bandwidth() {
        let s = shape(Coll::AllGather, Dtype::Float, 1000, 3);
        assert_eq!(
            s,
            Shape {
                count: 83,
                send_elems: 83,
                recv_elems: 249,
                bytes: 996
            }
        );
        let s = shape(Coll::ReduceScatter, Dtype::Half, 64, 4);
        assert_eq!(
            s,
            Shape {
                count: 8,
                send_elems: 32,
                recv_elems: 8,
                bytes: 64
            }
        );
        let s = shape(Coll::AllReduce, Dtype::Double, 17, 2);
        assert_eq!(
            s,
            Shape {
                count: 2,
                send_elems: 2,
                recv_elems: 2,
                bytes: 16
            }
        );
        let s = shape(Coll::AlltoAll, Dtype::Int8, 10, 4);
        assert_eq!(
            s,
            Shape {
                count: 2,
                send_elems: 8,
                recv_elems: 8,
                bytes: 8
            }
        );
        assert_eq!(bus_factor(Coll::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(Coll::AllGather, 4), 0.75);
        assert_eq!(bus_factor(Coll::ReduceScatter, 2), 0.5);
        assert_eq!(bus_factor(Coll::AlltoAll, 8), 0.875);
        for coll in [
            Coll::Broadcast,
            Coll::Reduce,
            Coll::SendRecv,
            Coll::Gather,
            Coll::Scatter,
        ] {
            assert_eq!(bus_factor(coll, 8), 1.0);
        }
        assert_eq!(algbw_gbs(1_000_000_000, 1_000_000.0), 1.0);
        assert_eq!(algbw_gbs(1 << 20, 0.0), 0.0);
        assert!((algbw_gbs(8 << 20, 100.0) - 83.886_08).abs() < 1e-9);
    }
}
