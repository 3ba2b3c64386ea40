//! Q5_0, Q4_K and Q6_K: with Q8_0 what Q4_K_M GGUF files hold (Gemma 3 270M's among them).
//! Q5_0 meets the 32-value [`BlockQ8`] activation blocks, as the other 32-value types do. The
//! K-quants meet [`BlockQ8K`], llama.cpp's Q8_K: one activation scale per 256-value
//! super-block, so each super-block's products sum as integers (weight scales included) and
//! are scaled once. Activation blocks of 32 were tried first; their float scaling per 32
//! values made these kernels 2.4x (Q4_K) and 1.5x (Q6_K) slower than candle's Q8_K ones.

#[cfg(target_arch = "x86_64")]
use super::{avx2::Avx2, avx512::Avx512, Tile};
use super::{f16_bytes, Activations, Block, BlockQ8, Quantized, BLOCK};

/// Values per K-quant super-block.
pub(super) const QK_K: usize = 256;
/// 32-value sub-blocks per super-block.
pub(super) const SUBS: usize = QK_K / BLOCK;

/// 256 activations for the K-quants (llama.cpp's `block_q8_K`): `x ≈ d · qs`, and `bsums`,
/// the sums of each 16 values' `qs`, for Q4_K's minimums.
pub(super) struct BlockQ8K {
    pub(super) d: f32,
    pub(super) qs: [i8; QK_K],
    pub(super) bsums: [i16; QK_K / 16],
}

impl Activations for BlockQ8K {
    const VALUES: usize = QK_K;

    const ZERO: BlockQ8K = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };

    /// llama.cpp's `quantize_row_q8_K_ref`: the value of largest magnitude becomes -127, the
    /// others round to the nearest step, ties to even, as its `nearest_int` does.
    #[inline(always)]
    fn blocks(lhs: &[f32], blocks: &mut [BlockQ8K]) {
        for (x, out) in lhs.chunks_exact(QK_K).zip(blocks) {
            let (mut max, mut amax) = (0f32, 0f32);
            for &v in x {
                if v.abs() > amax {
                    (max, amax) = (v, v.abs());
                }
            }
            let mut block = BlockQ8K {
                d: 0.0,
                qs: [0; QK_K],
                bsums: [0; QK_K / 16],
            };
            if amax != 0.0 {
                let iscale = -127.0 / max;
                for (q, v) in block.qs.iter_mut().zip(x) {
                    *q = (v * iscale).round_ties_even().min(127.0) as i8;
                }
                for (sum, qs) in block.bsums.iter_mut().zip(block.qs.chunks_exact(16)) {
                    *sum = qs.iter().map(|&q| i16::from(q)).sum();
                }
                block.d = 1.0 / iscale;
            }
            *out = block;
        }
    }

    fn of(x: &Quantized) -> &[BlockQ8K] {
        &x.q8k
    }
}

/// candle's `k_quants::BlockQ5_0`: `w = d · (q - 16)`, q's low 4 bits are nibbles as in Q4_0
/// (values 0..16 low, 16..32 high), its bit 4 for value j is bit j of `qh` (little-endian).
#[repr(C)]
pub(super) struct BlockQ5_0 {
    pub(super) d: [u8; 2],
    pub(super) qh: [u8; 4],
    pub(super) qs: [u8; BLOCK / 2],
}

/// candle's `k_quants::BlockQ4K`: 8 sub-blocks of 32, `w = d · sc_j · q - dmin · m_j` with 6-bit
/// `sc_j`, `m_j` packed in `scales` ([`scales_mins`]). Bytes 32c..32c+32 of `qs` hold sub-block
/// 2c in their low nibbles and 2c+1 in their high ones.
#[repr(C)]
pub(super) struct BlockQ4K {
    pub(super) d: [u8; 2],
    pub(super) dmin: [u8; 2],
    pub(super) scales: [u8; 12],
    pub(super) qs: [u8; QK_K / 2],
}

/// candle's `k_quants::BlockQ6K`: `w = d · sc · (q - 32)`, one i8 scale per 16 values, 6-bit q.
/// In half h (values 128h..128h+128), sub-block t (32 values) takes its low 4 bits from
/// `ql[64h + 32(t % 2)..][..32]`, low nibbles for t < 2 and high ones after, and its top 2 bits
/// from bits 2t, 2t+1 of `qh[32h..][..32]`; its scales are `scales[8h + 2t]` and the next.
#[repr(C)]
pub(super) struct BlockQ6K {
    pub(super) ql: [u8; QK_K / 2],
    pub(super) qh: [u8; QK_K / 4],
    pub(super) scales: [i8; QK_K / 16],
    pub(super) d: [u8; 2],
}

// Byte for byte candle's blocks: the same sizes (and ours have no padding, alignment 1).
const _: () = {
    use candle_core::quantized::k_quants as candle;
    use std::mem::size_of;
    assert!(size_of::<BlockQ5_0>() == size_of::<candle::BlockQ5_0>());
    assert!(size_of::<BlockQ4K>() == size_of::<candle::BlockQ4K>());
    assert!(size_of::<BlockQ6K>() == size_of::<candle::BlockQ6K>());
};

/// Q4_K's 8 scales and 8 minimums from their 12 packed bytes (llama.cpp's `get_scale_min_k4`,
/// four at a time): bytes 0..4 hold scales 0..4 in their low 6 bits, bytes 4..8 minimums 0..4;
/// scales and minimums 4..8 have their low 4 bits in bytes 8..12 and their top 2 in the top
/// bits of bytes 0..4 and 4..8.
pub(super) fn scales_mins(s: &[u8; 12]) -> ([u8; SUBS], [u8; SUBS]) {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    let join = |lo: u32, hi: u32| {
        let mut out = [0; SUBS];
        out[..4].copy_from_slice(&lo.to_le_bytes());
        out[4..].copy_from_slice(&hi.to_le_bytes());
        out
    };
    (
        join(a & LOW6, (c & LOW4) | (((a >> 6) & LOW2) << 4)),
        join(b & LOW6, ((c >> 4) & LOW4) | (((b >> 6) & LOW2) << 4)),
    )
}

impl Block for BlockQ5_0 {
    type X = BlockQ8;
    fn dot_scalar(w: &[Self], x: &[BlockQ8]) -> f32 {
        dot_q5_0(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: Avx2, w: &[Self], x: &[BlockQ8]) -> f32 {
        cpu.dot_q5_0(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn tile_avx2(cpu: Avx2, w: &[Self], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        cpu.tile_nibbles(w, wb, xs, out)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx512(cpu: Avx512, w: &[Self], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        cpu.dot_nibbles(w, wb, xs, out)
    }
}

impl Block for BlockQ4K {
    const VALUES: usize = QK_K;
    type X = BlockQ8K;
    fn dot_scalar(w: &[Self], x: &[BlockQ8K]) -> f32 {
        dot_q4k(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: Avx2, w: &[Self], x: &[BlockQ8K]) -> f32 {
        cpu.dot_q4k(w, x)
    }
}

impl Block for BlockQ6K {
    const VALUES: usize = QK_K;
    type X = BlockQ8K;
    fn dot_scalar(w: &[Self], x: &[BlockQ8K]) -> f32 {
        dot_q6k(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: Avx2, w: &[Self], x: &[BlockQ8K]) -> f32 {
        cpu.dot_q6k(w, x)
    }
}

fn dot_q5_0(w: &[BlockQ5_0], x: &[BlockQ8]) -> f32 {
    w.iter()
        .zip(x)
        .map(|(w, x)| {
            let qh = u32::from_le_bytes(w.qh);
            let fifth = |j: usize| ((qh >> j) & 1) as u8 * 16;
            let (lo, hi) = x.qs.split_at(BLOCK / 2);
            let sumi: i32 = (0..BLOCK / 2)
                .map(|j| {
                    let q0 = i32::from(w.qs[j] & 0xF | fifth(j)) - 16;
                    let q1 = i32::from(w.qs[j] >> 4 | fifth(j + BLOCK / 2)) - 16;
                    q0 * i32::from(lo[j]) + q1 * i32::from(hi[j])
                })
                .sum();
            f16_bytes(w.d) * x.d * sumi as f32
        })
        .sum()
}

/// `x.d · (d · Σ_j sc_j · Σ q·x - dmin · Σ_j m_j · Σ x)`, sub-block `j`'s sums in integers.
fn dot_q4k(w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
    w.iter()
        .zip(x)
        .map(|(w, x)| {
            let (sc, m) = scales_mins(&w.scales);
            let (mut sums, mut mins) = (0i32, 0i32);
            for (j, a) in x.qs.as_chunks::<BLOCK>().0.iter().enumerate() {
                // Sub-blocks 2c and 2c+1 share bytes 32c..32c+32.
                let (bytes, shift) = (&w.qs[32 * (j / 2)..][..32], 4 * (j % 2));
                let sumi: i32 = bytes
                    .iter()
                    .zip(a)
                    .map(|(&q, &a)| i32::from((q >> shift) & 0xF) * i32::from(a))
                    .sum();
                let xsum = i32::from(x.bsums[2 * j]) + i32::from(x.bsums[2 * j + 1]);
                sums += i32::from(sc[j]) * sumi;
                mins += i32::from(m[j]) * xsum;
            }
            x.d * (f16_bytes(w.d) * sums as f32 - f16_bytes(w.dmin) * mins as f32)
        })
        .sum()
}

fn dot_q6k(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
    w.iter()
        .zip(x)
        .map(|(w, x)| {
            let sumi: i32 = (x.qs.as_chunks::<BLOCK>().0.iter().enumerate())
                .map(|(j, a)| q6k_sub(w, j, a))
                .sum();
            f16_bytes(w.d) * x.d * sumi as f32
        })
        .sum()
}

/// Σ sc · (q - 32) · x over Q6_K sub-block `j` (32 values, two scales).
fn q6k_sub(w: &BlockQ6K, j: usize, x: &[i8; BLOCK]) -> i32 {
    let (h, t) = (j / 4, j % 4);
    let ql = &w.ql[64 * h + 32 * (t % 2)..][..32];
    let qh = &w.qh[32 * h..][..32];
    let (shift, hshift) = (4 * (t / 2), 2 * t);
    let mut sums = [0i32; 2];
    for (l, ((&lo, &hi), &a)) in ql.iter().zip(qh).zip(x).enumerate() {
        let q = (lo >> shift) & 0xF | ((hi >> hshift) & 3) << 4;
        sums[l / 16] += (i32::from(q) - 32) * i32::from(a);
    }
    let scale = &w.scales[8 * h + 2 * t..][..2];
    sums[0] * i32::from(scale[0]) + sums[1] * i32::from(scale[1])
}
