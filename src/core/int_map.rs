//! `IntMap`: a hash map for the small integer keys of the per-call path (communicator
//! handles, (peer, direction) pairs), hashed by one folded multiplication instead of the
//! default SipHash, which costs a lookup about 100 instructions. The keys are the library's
//! own handles and ranks, not input an attacker picks, so a keyed hash buys nothing there.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` whose keys are hashed by `IntHasher`.
pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// Each integer written is mixed into the state by the 128-bit product with an odd constant,
/// folded, so both the high bits (hashbrown's tags) and the low bits (its bucket index) depend
/// on every bit of the key, aligned addresses included.
#[derive(Default)]
pub struct IntHasher(u64);

impl IntHasher {
    fn add(&mut self, n: u64) {
        let m = ((self.0.rotate_left(29) ^ n) as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

impl Hasher for IntHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(n as u64);
    }

    fn write_u32(&mut self, n: u32) {
        self.add(n as u64);
    }

    fn write_i32(&mut self, n: i32) {
        self.add(n as u32 as u64);
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn aligned_addresses_spread_over_the_low_and_high_bits() {
        let build = BuildHasherDefault::<IntHasher>::default();
        let hashes: Vec<u64> = (0..4096usize)
            .map(|i| build.hash_one(0x7f00_1234_0000usize + i * 4096))
            .collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 0xff).collect();
        let high: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(low.len() > 250, "{} of 256 low bytes", low.len());
        assert_eq!(high.len(), 128, "every 7-bit tag");
        let pairs: std::collections::HashSet<u64> = (0..64i32)
            .flat_map(|peer| [true, false].map(|send| build.hash_one((peer, send))))
            .collect();
        assert_eq!(pairs.len(), 128, "(peer, direction) pairs do not collide");
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut m: IntMap<usize, usize> = IntMap::default();
        for i in 0..1000 {
            m.insert(i * 64, i);
        }
        assert!((0..1000).all(|i| m.get(&(i * 64)) == Some(&i)));
        assert_eq!(m.get(&1), None);
    }
}
