//! One activation row (a decode step) through each of lmhost's SIMD kernel paths (AVX2 and
//! AVX-512 side by side where the CPU has both), candle's `QMatMul` (which may repack the
//! matrix on first use) and candle's kernel on the stored blocks (what `weights = compact` ran
//! for these types before), on Gemma 3 270M's shapes (Q5_0 for its 640-wide inputs, the
//! K-quants for the 2048-wide one, its Q8_0 output layer of 178 MB) and SmolLM2 Q4_1's: its
//! Q8_0 output layer (30 MB, more than the caches hold, as in a decode step), a Q4_1 MLP
//! matrix, and a Q4_1 matrix of the output layer's shape (18 MB) for the same streaming in
//! that type. Then `weights = "bf16"`'s dense products (`kernels::bf16`, where the CPU has
//! AVX-512 BF16) against candle's f32 matmul on SmolLM2's shapes, with the prompt and scoring
//! passes' row counts: GFLOP/s of each and their ratio.
//!
//! Prints figures; asserts nothing. `cargo run --release --example bench_kernels -p
//! lmhost-candle` (the thread count is rayon's and candle's, `RAYON_NUM_THREADS`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::quantized::k_quants::{
    self, BlockQ4K, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8_0, GgmlType,
};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use lmhost_candle::kernels::{self, Path};

type Unpacked = fn(&[u8], (usize, usize, usize), &[f32], &mut [f32]);

fn main() -> anyhow::Result<()> {
    let pool = rayon::ThreadPoolBuilder::new().build()?;
    let cases = [
        (
            GgmlDType::Q5_0,
            (2048, 640),
            unpacked::<BlockQ5_0> as Unpacked,
        ),
        (GgmlDType::Q4K, (640, 2048), unpacked::<BlockQ4K>),
        (GgmlDType::Q8_0, (49152, 576), unpacked::<BlockQ8_0>),
        (GgmlDType::Q8_0, (262144, 640), unpacked::<BlockQ8_0>),
        (GgmlDType::Q4_1, (1536, 576), unpacked::<BlockQ4_1>),
        (GgmlDType::Q4_1, (49152, 576), unpacked::<BlockQ4_1>),
        (GgmlDType::Q6K, (640, 2048), unpacked::<BlockQ6K>),
    ];
    for (dtype, (n, k), candle_unpacked) in cases {
        let w = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu)?;
        let q = Arc::new(QTensor::quantize(&w, dtype)?);
        let xt = Tensor::randn(0f32, 1.0, (1, k), &Device::Cpu)?;
        let x = xt.flatten_all()?.to_vec1::<f32>()?;
        let data = q.data()?;
        let qmatmul = QMatMul::from_arc(q.clone())?;
        // Each call allocates its output, as `QMatMul` does.
        let ours = |path| {
            let mut dst = vec![0f32; n];
            kernels::matmul(path, dtype, &data, (1, k, n), &x, &mut dst).expect("whole blocks");
        };
        // On a pool's thread, as the plugin runs models (from outside, each call would also
        // wait for a worker to wake).
        // Every SIMD path this CPU runs (AVX2 and AVX-512 side by side where both exist).
        let paths: Vec<Path> = Path::available().into_iter().skip(1).collect();
        let paths = if paths.is_empty() {
            vec![Path::Scalar]
        } else {
            paths
        };
        for path in paths {
            let [ours, candle, unpacked] = pool.install(|| {
                race(
                    Batches::MANY,
                    [
                        &mut || ours(path),
                        &mut || drop(qmatmul.forward(&xt).expect("a row")),
                        &mut || candle_unpacked(&data, (1, k, n), &x, &mut vec![0f32; n]),
                    ],
                )
            });
            println!(
                "{dtype:?} ({n}, {k}), {} threads: ours ({path:?}) {ours:.1?}, candle QMatMul \
                 {candle:.1?}, candle unpacked {unpacked:.1?}",
                pool.current_num_threads(),
            );
        }
    }
    if kernels::bf16::available() {
        pool.install(bf16_against_f32)?;
    }
    Ok(())
}

/// `kernels::bf16` against candle's f32 matmul, one call each, on SmolLM2's matrices (q/o,
/// k/v, gate/up, down, the output layer) with 16-400 rows.
fn bf16_against_f32() -> anyhow::Result<()> {
    let shapes = [
        (400, 576, 576),
        (400, 192, 576),
        (400, 1536, 576),
        (400, 576, 1536),
        (64, 1536, 576),
        (16, 49152, 576),
        (400, 49152, 576),
    ];
    for (m, n, k) in shapes {
        let wt = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu)?;
        let xt = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?;
        let x = xt.flatten_all()?.to_vec1::<f32>()?;
        let w = wt.flatten_all()?.to_vec1::<f32>()?;
        let packed = kernels::bf16::Packed::new(&w, (n, k)).expect("AVX-512 BF16");
        let mut out = vec![0f32; m * n];
        let [bf16, f32] = race(
            Batches::FEW,
            [&mut || packed.matmul(&x, &mut out), &mut || {
                drop(xt.matmul(&wt.t().expect("2-d")).expect("shapes"))
            }],
        );
        let gflop = 2.0 * (m * n * k) as f64 / 1e9;
        println!(
            "({m} rows) x ({n}, {k})ᵀ: bf16 {:.0} GFLOP/s, candle f32 {:.0} GFLOP/s, {:.2}x",
            gflop / bf16.as_secs_f64(),
            gflop / f32.as_secs_f64(),
            f32.as_secs_f64() / bf16.as_secs_f64()
        );
    }
    Ok(())
}

/// candle's kernel on a QTensor's stored blocks of type `T`.
fn unpacked<T: GgmlType>(data: &[u8], mkn: (usize, usize, usize), x: &[f32], dst: &mut [f32]) {
    assert_eq!(data.as_ptr().align_offset(std::mem::align_of::<T>()), 0);
    let count = data.len() / std::mem::size_of::<T>();
    // SAFETY: a CPU QTensor's bytes are a Vec of its block type (plain integers and f16, any
    // bit pattern valid), borrowed: aligned (checked) and whole blocks.
    let blocks = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<T>(), count) };
    k_quants::matmul(mkn, x, blocks, dst).expect("whole blocks");
}

/// How many warm-up calls, then batches of how many calls, [`race`] takes.
struct Batches {
    warm_up: usize,
    batches: usize,
    calls: usize,
}

impl Batches {
    /// For calls of microseconds.
    const MANY: Batches = Batches {
        warm_up: 20,
        batches: 200,
        calls: 5,
    };
    /// For calls of milliseconds.
    const FEW: Batches = Batches {
        warm_up: 1,
        batches: 10,
        calls: 3,
    };
}

/// The time of one call of each of `fs`, the least over `batches` taken in turns (after a
/// warm-up): other processes only ever add time, and on a busy machine a short batch is
/// likelier to run undisturbed.
fn race<const N: usize>(
    Batches {
        warm_up,
        batches,
        calls,
    }: Batches,
    mut fs: [&mut (dyn FnMut() + Send); N],
) -> [Duration; N] {
    for f in fs.iter_mut() {
        (0..warm_up).for_each(|_| f());
    }
    let mut best = [Duration::MAX; N];
    for _ in 0..batches {
        for (f, best) in fs.iter_mut().zip(&mut best) {
            let start = Instant::now();
            (0..calls).for_each(|_| f());
            *best = (*best).min(start.elapsed() / calls as u32);
        }
    }
    best
}
