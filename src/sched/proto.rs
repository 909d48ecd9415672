//! The protocols a work item moves its steps with, as one type from the cost model's choice
//! to the item's flags. Simple fills the first 7/8 of a slot and publishes it with a fenced
//! `tail` store; LL writes {4 payload bytes, flag} words into the last 1/8 and needs no
//! fence (see `device::OxConn`). The device encoding stays the `FLAG_LL` bit of `OxWork`.

use super::device::{ll_step_bytes, simple_step_bytes, FLAG_LL};

/// How a work item moves its bytes over its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proto {
    /// Bulk protocol: a slot's Simple region, then `tail`.
    Simple,
    /// Low latency: flagged 8-byte words in a slot's LL region.
    Ll,
}

impl Proto {
    /// The item flag bits of this protocol (`FLAG_LL` for LL, none for Simple).
    pub fn flag(self) -> u32 {
        match self {
            Proto::Simple => 0,
            Proto::Ll => FLAG_LL,
        }
    }

    /// The protocol an item's `flags` say.
    pub fn of_flags(flags: u32) -> Proto {
        if flags & FLAG_LL != 0 {
            Proto::Ll
        } else {
            Proto::Simple
        }
    }

    /// Payload bytes of one step on a connection with slots of `slot_bytes`.
    pub fn step_bytes(self, slot_bytes: u32) -> u32 {
        match self {
            Proto::Simple => simple_step_bytes(slot_bytes),
            Proto::Ll => ll_step_bytes(slot_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_round_trip_and_step_sizes() {
        for p in [Proto::Simple, Proto::Ll] {
            assert_eq!(Proto::of_flags(p.flag() | 2 | 8), p);
        }
        assert_eq!(Proto::Simple.step_bytes(512 << 10), 448 << 10);
        assert_eq!(Proto::Ll.step_bytes(512 << 10), 32 << 10);
    }
}
