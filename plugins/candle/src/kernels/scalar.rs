//! The portable dot products: exact integer sums per block, scaled in f32.

use super::{f16_bytes, BlockQ4_0, BlockQ4_1, BlockQ8, BlockQ8_0, BLOCK};

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
