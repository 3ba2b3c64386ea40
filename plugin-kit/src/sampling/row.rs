//! The loops over a whole row of logits that every token runs (a SmolLM2 row is 49152 wide,
//! Gemma 3's 262144): its largest value, its exponentials and their sum.
//!
//! Each is plain arithmetic over fixed lanes, which the compiler turns into SIMD, built a
//! second time for AVX2 where the CPU has it. Both builds do the same IEEE operations in the
//! same order (Rust never fuses a multiply and an add on its own), so a row gives the same bits
//! on every CPU and seeded sampling stays the same everywhere. libm's `expf` one value at a
//! time had cost a visible share of a decode token.

/// Lanes of the largest value's loop: two AVX2 registers of f32, so consecutive steps overlap.
const LANES: usize = 16;

/// Partial sums of the exponentials, in f64: two AVX2 registers.
const SUMS: usize = 8;

/// Values whose exponentials are computed in one loop (on the stack unless the caller wants
/// them) before they are summed.
const BLOCK: usize = 256;

/// Defines `pub fn $name` from a body of lane arithmetic, and beside it `mod $name` with its
/// two builds: `portable` (as the target is built) and `avx2`, which runs where the CPU has it.
macro_rules! with_avx2 {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            if $crate::simd::Simd::Avx2.allowed() && std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                return unsafe { $name::avx2($($arg),*) };
            }
            $name::portable($($arg),*)
        }

        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[inline(always)]
            pub(super) fn portable($($arg: $ty),*) -> $ret $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            pub(super) fn avx2($($arg: $ty),*) -> $ret {
                portable($($arg),*)
            }
        }
    };
}

with_avx2! {
    /// The largest value (-inf for an empty row; NaN is never the largest).
    pub fn max(row: &[f32]) -> f32 {
        let (chunks, tail) = row.as_chunks::<LANES>();
        let mut best = [f32::NEG_INFINITY; LANES];
        for chunk in chunks {
            for (b, &l) in best.iter_mut().zip(chunk) {
                *b = if l > *b { l } else { *b };
            }
        }
        best.into_iter()
            .chain(tail.iter().copied())
            .fold(f32::NEG_INFINITY, |b, l| if l > b { l } else { b })
    }
}

with_avx2! {
    /// Σ exp((l - `max`) / `temperature`) over the row in f64, each term written to `out`
    /// when it is given (as long as the row).
    pub fn exp_sum(row: &[f32], max: f32, temperature: f32, out: Option<&mut [f32]>) -> f64 {
        let mut out = out;
        let mut sums = [0f64; SUMS];
        let mut block = [0f32; BLOCK];
        for (b, values) in row.chunks(BLOCK).enumerate() {
            let terms = match &mut out {
                Some(out) => &mut out[b * BLOCK..b * BLOCK + values.len()],
                None => &mut block[..values.len()],
            };
            // Dividing by 1 changes no bit, and its cost is a quarter of the loop's.
            if temperature == 1.0 {
                for (t, &l) in terms.iter_mut().zip(values) {
                    *t = exp(l - max);
                }
            } else {
                for (t, &l) in terms.iter_mut().zip(values) {
                    *t = exp((l - max) / temperature);
                }
            }
            let (lanes, tail) = terms.as_chunks::<SUMS>();
            for lane in lanes {
                for (s, &t) in sums.iter_mut().zip(lane) {
                    *s += f64::from(t);
                }
            }
            for (s, &t) in sums.iter_mut().zip(tail) {
                *s += f64::from(t);
            }
        }
        sums.into_iter().sum()
    }
}

/// The index of the largest value, the first on ties (0 for an empty row or one of NaN).
pub fn argmax(row: &[f32]) -> usize {
    let best = max(row);
    let (chunks, _) = row.as_chunks::<LANES>();
    let from = chunks
        .iter()
        .position(|c| c.contains(&best))
        .map_or(chunks.len() * LANES, |c| c * LANES);
    row[from..]
        .iter()
        .position(|&l| l == best)
        .map_or(0, |i| from + i)
}

/// Rounds to the nearest integer (ties to even) when added then subtracted: 1.5 · 2²³.
const ROUND: f32 = 12_582_912.0;

/// e^x for x <= 0, within 2 ulp of libm's `expf` down to -87 and 0 below (where `expf` gives
/// subnormals or 0, nothing a sum of probabilities notices): Cephes' polynomial, the
/// reduction's integer read from the rounding's own bits, so that every step vectorizes.
#[inline(always)]
fn exp(x: f32) -> f32 {
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * 0.693_359_4;
    let r = r - n * -2.121_944_4e-4;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 0.166_666_65;
    let p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    // `t`'s low bits hold n + 2²² (its exponent is 2²³'s); 2ⁿ's exponent field is n + 127.
    let n = (t.to_bits() as i32) - (ROUND.to_bits() as i32);
    let scale = f32::from_bits(((n + 127) as u32) << 23);
    if x < -87.0 {
        0.0
    } else {
        y * scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The distance in representable f32 values.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i32 - b.to_bits() as i32).unsigned_abs()
    }

    #[test]
    fn exp_is_within_two_ulp_of_libm_down_to_minus_87() {
        let mut worst = 0;
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            worst = worst.max(ulps(exp(x), x.exp()));
        }
        assert!(worst <= 2, "{worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-88.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    /// A row with every kind of value the loops meet: a tail past the lanes, ties, -inf.
    fn row() -> Vec<f32> {
        let mut row: Vec<f32> = (0..1003)
            .map(|i| ((i * 7919) % 2003) as f32 * 0.01)
            .collect();
        row[17] = f32::NEG_INFINITY;
        row[500] = 25.0;
        row[900] = 25.0;
        row
    }

    #[test]
    fn max_and_argmax_take_the_first_of_ties() {
        let row = row();
        assert_eq!(max(&row), 25.0);
        assert_eq!(argmax(&row), 500);
        // A row shorter than the lanes: its tail alone.
        let short = &row[..20];
        let top = short.iter().copied().fold(f32::MIN, f32::max);
        assert_eq!(argmax(short), short.iter().position(|&l| l == top).unwrap());
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 3.0, 3.0]), 3);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn exp_sum_matches_f64_and_writes_each_term() {
        let row = row();
        let top = max(&row);
        let exact: f64 = row.iter().map(|&l| f64::from(l - top).exp()).sum();
        let mut terms = vec![f32::NAN; row.len()];
        let sum = exp_sum(&row, top, 1.0, Some(&mut terms));
        assert!((sum - exact).abs() < 1e-6 * exact, "{sum} against {exact}");
        assert_eq!(sum, exp_sum(&row, top, 1.0, None));
        for (&t, &l) in terms.iter().zip(&row) {
            assert!(ulps(t, exp(l - top)) == 0);
        }
        let warm = exp_sum(&row, top, 0.5, None);
        let exact: f64 = row.iter().map(|&l| f64::from((l - top) / 0.5).exp()).sum();
        assert!((warm - exact).abs() < 1e-6 * exact);
    }

    /// The AVX2 build gives the portable build's bits (where this CPU has AVX2).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_build_gives_the_same_bits() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let row = row();
        let top = max::portable(&row);
        // SAFETY: the CPU has AVX2.
        assert_eq!(top, unsafe { max::avx2(&row) });
        let (mut a, mut b) = (vec![0f32; row.len()], vec![0f32; row.len()]);
        let portable = exp_sum::portable(&row, top, 0.7, Some(&mut a));
        // SAFETY: as above.
        let avx2 = unsafe { exp_sum::avx2(&row, top, 0.7, Some(&mut b)) };
        assert_eq!(portable.to_bits(), avx2.to_bits());
        assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
