//! Reduction operators: the built-in ones and the per-communicator table of user-created
//! `PreMulSum` ops (`ncclRedOpCreatePreMulSum` / `ncclRedOpDestroy`).

use crate::abi::{ncclDataType_t, RawRedOp};
use crate::error::{Error, Result};
use parking_lot::Mutex;

/// Where a PreMulSum scalar lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    /// Copied at creation: the value's bytes (little-endian, `dtype.size()` long).
    Host([u8; 8]),
    /// A device pointer read by the kernel while it runs.
    Device(u64),
}

/// A reduction as the kernels understand it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
    /// Sum then divide by the number of ranks.
    Avg,
    /// Multiply each input by a scalar, then sum.
    PreMulSum(Scalar),
}

impl RedOp {
    /// The kernels' op code (`OX_SUM`..`OX_PREMULSUM`, defined in `sched::device`).
    pub fn code(self) -> u32 {
        crate::sched::device::op_code(self)
    }
}

#[derive(Clone, Copy, Debug)]
struct UserOp {
    dtype: ncclDataType_t,
    scalar: Scalar,
}

/// The user-created ops of one communicator; handle = `ncclNumOps + index`.
#[derive(Default)]
pub struct RedOpTable {
    slots: Mutex<Vec<Option<UserOp>>>,
}

const NUM_BUILTIN: i32 = 5;

impl RedOpTable {
    /// Add a PreMulSum op and return its handle.
    pub fn create(&self, dtype: ncclDataType_t, scalar: Scalar) -> RawRedOp {
        let mut slots = self.slots.lock();
        let op = UserOp { dtype, scalar };
        let idx = match slots.iter().position(Option::is_none) {
            Some(i) => {
                slots[i] = Some(op);
                i
            }
            None => {
                slots.push(Some(op));
                slots.len() - 1
            }
        };
        RawRedOp(NUM_BUILTIN + idx as i32)
    }

    /// Remove a user op; built-in or unknown handles are `ncclInvalidArgument`.
    pub fn destroy(&self, op: RawRedOp) -> Result<()> {
        if (0..NUM_BUILTIN).contains(&op.0) {
            return Err(Error::invalid_argument(format!(
                "operator {} is a NCCL builtin",
                op.0
            )));
        }
        let mut slots = self.slots.lock();
        match op
            .0
            .checked_sub(NUM_BUILTIN)
            .and_then(|i| slots.get_mut(i as usize))
        {
            Some(slot @ Some(_)) => {
                *slot = None;
                Ok(())
            }
            _ => Err(Error::invalid_argument(format!(
                "operator {} was not created on this communicator",
                op.0
            ))),
        }
    }

    /// Resolve an op handle for a collective on `dtype`.
    pub fn resolve(&self, op: RawRedOp, dtype: ncclDataType_t) -> Result<RedOp> {
        Ok(match op.0 {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Max,
            3 => RedOp::Min,
            4 => RedOp::Avg,
            n => {
                let slots = self.slots.lock();
                let user = n
                    .checked_sub(NUM_BUILTIN)
                    .and_then(|i| slots.get(i as usize).copied().flatten())
                    .ok_or_else(|| {
                        Error::invalid_argument(format!("invalid reduction operator {n}"))
                    })?;
                if user.dtype != dtype {
                    return Err(Error::invalid_argument(format!(
                        "operator {n} was created for {} but the call uses {}",
                        user.dtype.name(),
                        dtype.name()
                    )));
                }
                RedOp::PreMulSum(user.scalar)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::ncclDataType_t::*;

    #[test]
    fn create_resolve_destroy() {
        let t = RedOpTable::default();
        let a = t.create(ncclFloat32, Scalar::Host([0, 0, 0x80, 0x3f, 0, 0, 0, 0]));
        let b = t.create(ncclFloat64, Scalar::Device(0x1000));
        assert_eq!((a.0, b.0), (5, 6));
        assert!(matches!(
            t.resolve(a, ncclFloat32),
            Ok(RedOp::PreMulSum(Scalar::Host(_)))
        ));
        assert!(t.resolve(a, ncclFloat64).is_err());
        assert!(t.destroy(RawRedOp(2)).is_err());
        t.destroy(a).unwrap();
        assert!(t.destroy(a).is_err());
        assert!(t.resolve(a, ncclFloat32).is_err());
        // Freed slots are reused.
        assert_eq!(t.create(ncclInt32, Scalar::Device(0)).0, 5);
        assert_eq!(t.resolve(RawRedOp(3), ncclInt8).unwrap(), RedOp::Min);
        assert!(t.resolve(RawRedOp(-1), ncclInt8).is_err());
    }
}
