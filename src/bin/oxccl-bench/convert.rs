//! Host-side number formats: conversions between `f64` and the bit patterns of half,
//! bfloat16, fp8 e4m3 (OCP "E4M3FN": no infinities) and fp8 e5m2, plus encoding/decoding of
//! any NCCL data type to and from little-endian bytes. Conversions to the narrow formats round
//! to nearest, ties to even; values too large become infinity (or NaN for e4m3, which has
//! no infinity).

use crate::args::Dtype;

/// A binary floating-point format with an implicit leading bit.
#[derive(Debug, Clone, Copy)]
pub struct SmallFloat {
    pub exp_bits: u32,
    pub mant_bits: u32,
    /// The format has infinities (IEEE style); e4m3 has none and only one NaN pattern per sign.
    pub has_inf: bool,
}

pub const HALF: SmallFloat = SmallFloat {
    exp_bits: 5,
    mant_bits: 10,
    has_inf: true,
};
pub const BF16: SmallFloat = SmallFloat {
    exp_bits: 8,
    mant_bits: 7,
    has_inf: true,
};
pub const E4M3: SmallFloat = SmallFloat {
    exp_bits: 4,
    mant_bits: 3,
    has_inf: false,
};
pub const E5M2: SmallFloat = SmallFloat {
    exp_bits: 5,
    mant_bits: 2,
    has_inf: true,
};

impl SmallFloat {
    fn bias(self) -> i32 {
        (1 << (self.exp_bits - 1)) - 1
    }

    fn sign_bit(self) -> u32 {
        1 << (self.exp_bits + self.mant_bits)
    }

    fn max_exp_field(self) -> u32 {
        (1 << self.exp_bits) - 1
    }

    fn nan_bits(self) -> u32 {
        // Exponent all ones and mantissa all ones: a quiet NaN in every format here.
        (self.max_exp_field() << self.mant_bits) | ((1 << self.mant_bits) - 1)
    }

    /// The largest finite value.
    #[cfg(test)]
    pub fn max_finite(self) -> f64 {
        let (exp_field, mant) = if self.has_inf {
            (self.max_exp_field() - 1, (1u32 << self.mant_bits) - 1)
        } else {
            (self.max_exp_field(), (1u32 << self.mant_bits) - 2)
        };
        self.decode((exp_field << self.mant_bits) | mant)
    }

    /// Value of a bit pattern.
    pub fn decode(self, bits: u32) -> f64 {
        let mant_mask = (1u32 << self.mant_bits) - 1;
        let mant = bits & mant_mask;
        let exp_field = (bits >> self.mant_bits) & self.max_exp_field();
        let negative = bits & self.sign_bit() != 0;
        let magnitude = if exp_field == self.max_exp_field() && self.has_inf {
            if mant == 0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        } else if exp_field == self.max_exp_field() && !self.has_inf && mant == mant_mask {
            f64::NAN
        } else if exp_field == 0 {
            f64::from(mant) * 2f64.powi(1 - self.bias() - self.mant_bits as i32)
        } else {
            (1.0 + f64::from(mant) / f64::from(1u32 << self.mant_bits))
                * 2f64.powi(exp_field as i32 - self.bias())
        };
        if negative {
            -magnitude
        } else {
            magnitude
        }
    }

    /// Bit pattern nearest to `value` (ties to even).
    pub fn encode(self, value: f64) -> u32 {
        if value.is_nan() {
            return self.nan_bits();
        }
        let sign = if value.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        let magnitude = value.abs();
        let overflow = if self.has_inf {
            sign | (self.max_exp_field() << self.mant_bits)
        } else {
            sign | self.nan_bits()
        };
        if magnitude.is_infinite() {
            return overflow;
        }
        if magnitude == 0.0 {
            return sign;
        }
        let min_normal_exp = 1 - self.bias();
        // floor(log2(magnitude)) from the f64 exponent field (magnitude is normal in f64 for
        // every value these formats can hold; tiny f64 subnormals round to zero anyway).
        let exp = ((magnitude.to_bits() >> 52) as i32 & 0x7ff) - 1023;
        let scale_exp = exp.max(min_normal_exp) - self.mant_bits as i32;
        // Scaling by a power of two is exact, so only round_ties_even rounds.
        let scaled = (magnitude * 2f64.powi(-scale_exp)).round_ties_even();
        let mut mant_total = scaled as u64;
        let mut exp_field = if exp < min_normal_exp {
            // Subnormal: a result of 2^mant_bits is the smallest normal, which this encoding
            // already yields with exponent field 0 + carry below.
            0i32
        } else {
            exp + self.bias()
        };
        let implicit = 1u64 << self.mant_bits;
        if exp_field == 0 {
            if mant_total >= implicit {
                exp_field = 1;
                mant_total -= implicit;
            }
        } else {
            if mant_total >= implicit << 1 {
                exp_field += 1;
                mant_total >>= 1;
            }
            mant_total -= implicit;
        }
        let bits = ((exp_field as u32) << self.mant_bits) | mant_total as u32;
        let too_big = if self.has_inf {
            exp_field as u32 >= self.max_exp_field()
        } else {
            exp_field as u32 > self.max_exp_field()
                || (exp_field as u32 == self.max_exp_field()
                    && mant_total as u32 == (1 << self.mant_bits) - 1)
        };
        if too_big {
            overflow
        } else {
            sign | bits
        }
    }
}

/// Write `value` (already exactly representable, or rounded as above) into `out` as `dtype`.
pub fn encode(dtype: Dtype, value: f64, out: &mut [u8]) {
    match dtype {
        Dtype::Int8 => out[0] = (value as i8) as u8,
        Dtype::Uint8 => out[0] = value as u8,
        Dtype::Int32 => out.copy_from_slice(&(value as i32).to_le_bytes()),
        Dtype::Uint32 => out.copy_from_slice(&(value as u32).to_le_bytes()),
        Dtype::Int64 => out.copy_from_slice(&(value as i64).to_le_bytes()),
        Dtype::Uint64 => out.copy_from_slice(&(value as u64).to_le_bytes()),
        Dtype::Float => out.copy_from_slice(&(value as f32).to_le_bytes()),
        Dtype::Double => out.copy_from_slice(&value.to_le_bytes()),
        Dtype::Half => out.copy_from_slice(&(HALF.encode(value) as u16).to_le_bytes()),
        Dtype::Bfloat16 => out.copy_from_slice(&(BF16.encode(value) as u16).to_le_bytes()),
        Dtype::Fp8E4M3 => out[0] = E4M3.encode(value) as u8,
        Dtype::Fp8E5M2 => out[0] = E5M2.encode(value) as u8,
    }
}

/// Read one `dtype` element from `bytes`.
pub fn decode(dtype: Dtype, bytes: &[u8]) -> f64 {
    let two = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
    let four = |b: &[u8]| [b[0], b[1], b[2], b[3]];
    let eight = |b: &[u8]| [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
    match dtype {
        Dtype::Int8 => f64::from(bytes[0] as i8),
        Dtype::Uint8 => f64::from(bytes[0]),
        Dtype::Int32 => f64::from(i32::from_le_bytes(four(bytes))),
        Dtype::Uint32 => f64::from(u32::from_le_bytes(four(bytes))),
        Dtype::Int64 => i64::from_le_bytes(eight(bytes)) as f64,
        Dtype::Uint64 => u64::from_le_bytes(eight(bytes)) as f64,
        Dtype::Float => f64::from(f32::from_le_bytes(four(bytes))),
        Dtype::Double => f64::from_le_bytes(eight(bytes)),
        Dtype::Half => HALF.decode(u32::from(two(bytes))),
        Dtype::Bfloat16 => BF16.decode(u32::from(two(bytes))),
        Dtype::Fp8E4M3 => E4M3.decode(u32::from(bytes[0])),
        Dtype::Fp8E5M2 => E5M2.decode(u32::from(bytes[0])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_known_values() {
        assert_eq!(HALF.encode(1.0), 0x3c00);
        assert_eq!(HALF.encode(-2.0), 0xc000);
        assert_eq!(HALF.encode(65504.0), 0x7bff);
        assert_eq!(HALF.encode(65520.0), 0x7c00); // rounds up to infinity
        assert_eq!(HALF.encode(f64::INFINITY), 0x7c00);
        assert_eq!(HALF.encode(2f64.powi(-24)), 0x0001); // smallest subnormal
        assert_eq!(HALF.encode(2f64.powi(-14)), 0x0400); // smallest normal
        assert_eq!(HALF.encode(0.1), 0x2e66);
        assert_eq!(HALF.encode(2049.0), 0x6800); // tie to even: 2048
        assert_eq!(HALF.encode(2051.0), 0x6802); // tie to even: 2052
        assert_eq!(HALF.decode(0x3555), 0.333_251_953_125);
        assert!(HALF.decode(0x7e00).is_nan());
        assert_eq!(HALF.max_finite(), 65504.0);
    }

    #[test]
    fn bf16_known_values() {
        assert_eq!(BF16.encode(1.0), 0x3f80);
        assert_eq!(BF16.encode(-1.5), 0xbfc0);
        assert_eq!(BF16.encode(3.140625), 0x4049);
        assert_eq!(BF16.encode(257.0), 0x4380); // tie to even: 256
        assert_eq!(BF16.decode(0x7f80), f64::INFINITY);
        // bfloat16 is the top half of f32 for exactly representable values.
        for v in [0.5f32, 7.0, -123.0, 1e30, 3.0e-38] {
            let top = (v.to_bits() >> 16) as u16;
            if f32::from_bits(u32::from(top) << 16) == v {
                assert_eq!(BF16.encode(f64::from(v)), u32::from(top), "{v}");
            }
        }
    }

    #[test]
    fn fp8_known_values() {
        assert_eq!(E4M3.encode(1.0), 0x38);
        assert_eq!(E4M3.encode(448.0), 0x7e);
        assert_eq!(E4M3.encode(-448.0), 0xfe);
        assert_eq!(E4M3.encode(500.0), 0x7f); // no infinity: NaN
        assert_eq!(E4M3.encode(2f64.powi(-9)), 0x01);
        assert_eq!(E4M3.max_finite(), 448.0);
        assert!(E4M3.decode(0x7f).is_nan());
        assert_eq!(E4M3.decode(0x78), 256.0);
        assert_eq!(E5M2.encode(1.0), 0x3c);
        assert_eq!(E5M2.encode(57344.0), 0x7b);
        assert_eq!(E5M2.encode(f64::INFINITY), 0x7c);
        assert_eq!(E5M2.encode(2f64.powi(-16)), 0x01);
        assert_eq!(E5M2.max_finite(), 57344.0);
        assert_eq!(E5M2.encode(5.0), 0x45);
        assert_eq!(E5M2.encode(9.0), 0x48); // tie to even: 8
    }

    #[test]
    fn every_bit_pattern_round_trips() {
        for format in [E4M3, E5M2, HALF, BF16] {
            let count = 1u32 << (1 + format.exp_bits + format.mant_bits);
            for bits in 0..count {
                let value = format.decode(bits);
                if value.is_nan() {
                    assert!(format.decode(format.encode(value)).is_nan());
                } else {
                    assert_eq!(format.encode(value), bits, "{format:?} {bits:#x} = {value}");
                }
            }
        }
    }

    #[test]
    fn small_integers_are_exact() {
        for (format, limit) in [(E4M3, 16), (E5M2, 8), (HALF, 2048), (BF16, 256)] {
            for v in -limit..=limit {
                assert_eq!(format.decode(format.encode(f64::from(v))), f64::from(v));
            }
        }
    }

    #[test]
    fn dtype_byte_round_trips() {
        for dtype in Dtype::ALL {
            for v in [0.0, 1.0, 7.0, 12.0, 100.0] {
                let mut bytes = vec![0u8; dtype.size()];
                encode(dtype, v, &mut bytes);
                let limit = if dtype == Dtype::Fp8E5M2 || dtype == Dtype::Fp8E4M3 {
                    12.0
                } else {
                    1e9
                };
                if v <= limit {
                    assert_eq!(decode(dtype, &bytes), v, "{dtype} {v}");
                }
            }
            if dtype.is_signed() {
                let mut bytes = vec![0u8; dtype.size()];
                encode(dtype, -3.0, &mut bytes);
                assert_eq!(decode(dtype, &bytes), -3.0, "{dtype}");
            }
        }
    }
}
