//! The block layouts every kernel reads: the quantized weight types, byte for byte candle's
//! and GGUF's, and the 8-bit activation blocks they meet with the portable code that makes
//! them. The K-quants meet [`BlockQ8K`], llama.cpp's Q8_K: one activation scale per 256-value
//! super-block, so each super-block's products sum as integers and are scaled once.

use half::f16;

/// Values per activation block, and per weight block in the 32-value types.
pub const BLOCK: usize = 32;
/// Values per K-quant super-block.
pub(super) const QK_K: usize = 256;
/// 32-value sub-blocks per super-block.
pub(super) const SUBS: usize = QK_K / BLOCK;

/// candle's `k_quants::BlockQ4_0`: `w = d · (q - 8)`, q the low nibbles of `qs` for values
/// 0..16, the high ones for 16..32. The f16 scale is kept as bytes so that the struct has
/// alignment 1 and any whole-block byte slice can be read as blocks.
#[repr(C)]
pub(super) struct BlockQ4_0 {
    pub(super) d: [u8; 2],
    pub(super) qs: [u8; BLOCK / 2],
}

/// candle's `k_quants::BlockQ4_1`: `w = d · q + m`, nibbles as in [`BlockQ4_0`].
#[repr(C)]
pub(super) struct BlockQ4_1 {
    pub(super) d: [u8; 2],
    pub(super) m: [u8; 2],
    pub(super) qs: [u8; BLOCK / 2],
}

/// candle's `k_quants::BlockQ8_0`: `w = d · q`.
#[repr(C)]
pub(super) struct BlockQ8_0 {
    pub(super) d: [u8; 2],
    pub(super) qs: [i8; BLOCK],
}

/// 32 activations, `x ≈ d · qs`, with `sum = Σ qs` (Q4_0's offset of 8) and `s = d · sum`
/// (Q4_1's minimum). `d` and `s` are rounded to f16 as llama.cpp's Q8_0/Q8_1 blocks store them,
/// so results match its kernels up to summation order.
pub(super) struct BlockQ8 {
    pub(super) d: f32,
    pub(super) s: f32,
    pub(super) sum: f32,
    pub(super) qs: [i8; BLOCK],
}

impl BlockQ8 {
    /// The block of values `d · qs` whose `qs` sum to `sum`.
    #[inline(always)]
    pub(super) fn new(d: f32, sum: i32, qs: [i8; BLOCK]) -> BlockQ8 {
        BlockQ8 {
            d: f16::from_f32(d).to_f32(),
            s: f16::from_f32(d * sum as f32).to_f32(),
            sum: sum as f32,
            qs,
        }
    }
}

impl BlockQ8 {
    /// llama.cpp's `quantize_row_q8_1`. A loop rather than `map(..).collect()`, whose closure
    /// would compile on its own, without the caller's target features.
    #[inline(always)]
    pub(super) fn quantize(lhs: &[f32], blocks: &mut [BlockQ8]) {
        for (x, block) in lhs.chunks_exact(BLOCK).zip(blocks) {
            let mut amax = 0f32;
            for v in x {
                amax = amax.max(v.abs());
            }
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut qs = [0i8; BLOCK];
            let mut sum = 0i32;
            for (q, v) in qs.iter_mut().zip(x) {
                *q = (v * id).round() as i8;
                sum += i32::from(*q);
            }
            *block = BlockQ8::new(d, sum, qs);
        }
    }
}

/// 256 activations for the K-quants (llama.cpp's `block_q8_K`): `x ≈ d · qs`, and `bsums`,
/// the sums of each 16 values' `qs`, for Q4_K's minimums.
pub(super) struct BlockQ8K {
    pub(super) d: f32,
    pub(super) qs: [i8; QK_K],
    pub(super) bsums: [i16; QK_K / 16],
}

impl BlockQ8K {
    /// llama.cpp's `quantize_row_q8_K_ref`: the value of largest magnitude becomes -127, the
    /// others round to the nearest step, ties to even, as its `nearest_int` does.
    #[inline(always)]
    pub(super) fn quantize(lhs: &[f32], blocks: &mut [BlockQ8K]) {
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

/// The 32-value types with 4-bit nibbles, which the tile kernels (here and in `avx512.rs`)
/// handle alike.
pub(super) trait Nibbles {
    const KIND: NibbleKind;
    /// The nibbles, the scale and minimum as f16 bytes, and the fifth bits.
    fn parts(&self) -> (&[u8; 16], [u8; 4], u32);
}

#[derive(PartialEq, Eq)]
pub(super) enum NibbleKind {
    /// `w = d · (q - 8)`.
    Q4_0,
    /// `w = d · q + m`.
    Q4_1,
    /// `w = d · (q + 16·h - 16)`, `h` bit `i` of `qh` for value `i`.
    Q5_0,
}

impl NibbleKind {
    /// The offset of Q4_0's and Q5_0's q, a quarter of it: the tile kernels spread each
    /// block's offset term over a lane's four f32.
    pub(super) fn quarter_offset(&self) -> f32 {
        match self {
            NibbleKind::Q4_0 => -8.0 / 4.0,
            _ => -16.0 / 4.0,
        }
    }
}

impl Nibbles for BlockQ4_0 {
    const KIND: NibbleKind = NibbleKind::Q4_0;
    fn parts(&self) -> (&[u8; 16], [u8; 4], u32) {
        (&self.qs, [self.d[0], self.d[1], 0, 0], 0)
    }
}

impl Nibbles for BlockQ4_1 {
    const KIND: NibbleKind = NibbleKind::Q4_1;
    fn parts(&self) -> (&[u8; 16], [u8; 4], u32) {
        (&self.qs, [self.d[0], self.d[1], self.m[0], self.m[1]], 0)
    }
}

impl Nibbles for BlockQ5_0 {
    const KIND: NibbleKind = NibbleKind::Q5_0;
    fn parts(&self) -> (&[u8; 16], [u8; 4], u32) {
        (
            &self.qs,
            [self.d[0], self.d[1], 0, 0],
            u32::from_le_bytes(self.qh),
        )
    }
}

pub(super) fn f16_bytes(d: [u8; 2]) -> f32 {
    f16::from_le_bytes(d).to_f32()
}

/// `data` read as blocks of `W`.
///
/// # Safety
/// `W` must be a `repr(C)` struct of byte arrays (alignment 1, no padding, any bit pattern
/// valid), and `data` whole blocks of it.
pub(super) unsafe fn as_blocks<W>(data: &[u8]) -> &[W] {
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<W>(), data.len() / size_of::<W>()) }
}
