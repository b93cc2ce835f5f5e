//! Division by a divisor fixed in advance, as two multiplications.
//!
//! A policy divides by its window and its emission interval on every
//! check; a hardware 64-bit division is several times slower than the
//! multiply-high sequence below, which is exact for every `u64` numerator
//! (Lemire, Kaser and Kurz, "Faster Remainder by Direct Computation",
//! 2019, theorem 1, with 128 fractional bits for 64-bit operands).

/// A nonzero `u64` divisor with its 128-bit reciprocal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Divisor {
    /// `ceil(2^128 / d)`; zero stands for `d == 1`, whose reciprocal does
    /// not fit.
    m: u128,
}

impl Divisor {
    /// The reciprocal of `d`, which must not be zero.
    pub(crate) const fn new(d: u64) -> Divisor {
        assert!(d != 0, "division by zero");
        let m = if d == 1 { 0 } else { u128::MAX / d as u128 + 1 };
        Divisor { m }
    }

    /// `x / d`, rounded down.
    #[inline]
    pub(crate) const fn div(self, x: u64) -> u64 {
        if self.m == 0 {
            return x;
        }
        let lo = (self.m as u64 as u128 * x as u128) >> 64;
        // m < 2^127 when d >= 2, so this cannot overflow
        let hi = (self.m >> 64) * x as u128;
        ((hi + lo) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::Divisor;
    use proptest::prelude::*;

    #[test]
    fn edges_divide_exactly() {
        let ds = [
            1,
            2,
            3,
            7,
            10,
            1_000_000_000,
            86_400_000_000_000,
            u64::MAX - 1,
            u64::MAX,
        ];
        let xs = [0, 1, 2, 9, 10, 11, u64::MAX / 2, u64::MAX - 1, u64::MAX];
        for d in ds {
            let div = Divisor::new(d);
            for x in xs {
                assert_eq!(div.div(x), x / d, "{x} / {d}");
            }
            for k in [1, 2, 3, u64::MAX / d] {
                let x = d.saturating_mul(k);
                assert_eq!(div.div(x), x / d);
                assert_eq!(div.div(x.saturating_sub(1)), x.saturating_sub(1) / d);
            }
        }
        for shift in 0..64 {
            let d = 1u64 << shift;
            assert_eq!(Divisor::new(d).div(u64::MAX), u64::MAX / d);
            assert_eq!(Divisor::new(d + 1).div(u64::MAX), u64::MAX / (d + 1));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]
        #[test]
        fn any_quotient_is_the_hardware_one(x in any::<u64>(), d in 1..=u64::MAX) {
            prop_assert_eq!(Divisor::new(d).div(x), x / d);
        }

        #[test]
        fn small_divisors_and_multiples(k in any::<u64>(), d in 1u64..100_000, off in 0u64..3) {
            let x = (k / d).saturating_mul(d).saturating_add(off);
            prop_assert_eq!(Divisor::new(d).div(x), x / d);
        }
    }
}
