//! The portable dot products: exact integer sums per block, scaled in f32.

use super::blocks::{f16_bytes, scales_mins, BLOCK};
use super::blocks::{
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8, BlockQ8K, BlockQ8_0,
};

/// Σ q·x over one block of nibbles (low nibbles are values 0..16, high ones 16..32).
fn nibble_dot(qs: &[u8; BLOCK / 2], x: &[i8; BLOCK]) -> i32 {
    let (lo, hi) = x.split_at(BLOCK / 2);
    qs.iter()
        .zip(lo.iter().zip(hi))
        .map(|(&q, (&a, &b))| i32::from(q & 0xF) * i32::from(a) + i32::from(q >> 4) * i32::from(b))
        .sum()
}

pub(super) fn dot_q4_0(w: &[BlockQ4_0], x: &[BlockQ8]) -> f32 {
    w.iter()
        .zip(x)
        .map(|(w, x)| {
            let d = f16_bytes(w.d) * x.d;
            d * nibble_dot(&w.qs, &x.qs) as f32 - 8.0 * d * x.sum
        })
        .sum()
}

pub(super) fn dot_q4_1(w: &[BlockQ4_1], x: &[BlockQ8]) -> f32 {
    w.iter()
        .zip(x)
        .map(|(w, x)| f16_bytes(w.d) * x.d * nibble_dot(&w.qs, &x.qs) as f32 + f16_bytes(w.m) * x.s)
        .sum()
}

pub(super) fn dot_q8_0(w: &[BlockQ8_0], x: &[BlockQ8]) -> f32 {
    w.iter()
        .zip(x)
        .map(|(w, x)| {
            let sumi: i32 =
                w.qs.iter()
                    .zip(&x.qs)
                    .map(|(&a, &b)| i32::from(a) * i32::from(b))
                    .sum();
            f16_bytes(w.d) * x.d * sumi as f32
        })
        .sum()
}

pub(super) fn dot_q5_0(w: &[BlockQ5_0], x: &[BlockQ8]) -> f32 {
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
pub(super) fn dot_q4k(w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
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

pub(super) fn dot_q6k(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
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
