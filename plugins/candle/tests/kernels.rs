//! Our quantized kernels (`lmhost_candle::kernels`), every path this CPU runs, against candle's
//! dequantize-then-f32-matmul on random blocks, and the paths against each other.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use lmhost_candle::kernels::{self, Layout, Path};
use lmhost_plugin_api::Backend;

/// The types with kernels and the row lengths each is tested at: whole blocks of the type,
/// several 256-value super-blocks for the K-quants, and Gemma 3 270M's 640 for Q5_0.
const TYPES: [(GgmlDType, [usize; 3]); 6] = [
    (GgmlDType::Q4_0, [32, 64, 576]),
    (GgmlDType::Q4_1, [32, 64, 576]),
    (GgmlDType::Q8_0, [32, 64, 576]),
    (GgmlDType::Q5_0, [32, 576, 640]),
    (GgmlDType::Q4K, [256, 512, 768]),
    (GgmlDType::Q6K, [256, 512, 768]),
];

/// Against the dequantized matrix, as a fraction of `Σ |w_i| · amax(block of x_i)` (the dot
/// product if every activation were its block's largest), activation blocks being 32 values,
/// or the K-quants' 256 (llama.cpp's Q8_K). Rounding an activation to 8 bits moves it by at
/// most amax/254, and the f16 scales of the 32-value activation blocks add about 2⁻¹¹
/// relative: at most ~4.4e-3 in the worst case, so 1/127 leaves room. The weights enter
/// exactly (integers times their f32 or f16 scales and minimums), so this holds for every
/// type. Measured: see `kernels_match_dequantized_matmul`'s output (about 1e-3: roundings
/// mostly cancel).
const ACTIVATIONS: f32 = 1.0 / 127.0;
/// AVX2 against scalar, same fraction: the same integer sums, only the f32 summation order
/// differs.
const SAME_INTEGERS: f32 = 1e-5;

/// A deterministic xorshift stream of values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `rows × k` values, each 32-block with its own magnitude and each row its own offset
    /// (so that Q4_1's minimum matters), as real activations and weights have.
    fn matrix(&mut self, rows: usize, k: usize) -> Vec<f32> {
        let mut v = Vec::with_capacity(rows * k);
        for _ in 0..rows {
            let offset = 0.3 * self.next();
            for _ in 0..k / kernels::BLOCK {
                let scale = 0.05 + 2.0 * self.next().abs();
                v.extend((0..kernels::BLOCK).map(|_| offset + scale * self.next()));
            }
        }
        v
    }
}

/// Activations per quantized block for `dtype`'s kernels.
fn activation_block(dtype: GgmlDType) -> usize {
    match dtype {
        GgmlDType::Q4K | GgmlDType::Q6K => 256,
        _ => kernels::BLOCK,
    }
}

/// `Σ_i |w_ji| · amax(x's block of `block` values holding i)` for every (activation row r,
/// weight row j).
fn scales(x: &[f32], w: &[f32], (m, k, n): (usize, usize, usize), block: usize) -> Vec<f32> {
    let amax: Vec<f32> = x
        .chunks(block)
        .map(|b| b.iter().fold(0f32, |a, v| a.max(v.abs())))
        .collect();
    let kb = k / block;
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        for j in 0..n {
            out[r * n + j] = (0..k)
                .map(|i| w[j * k + i].abs() * amax[r * kb + i / block])
                .sum();
        }
    }
    out
}

/// `q`'s bytes in each layout `path` has for its type: as stored, and interleaved where the
/// path has that layout.
fn layouts(path: Path, q: &QTensor) -> Vec<(Vec<u8>, Layout)> {
    let (stored, shape) = (q.data().unwrap().to_vec(), q.shape().dims2().unwrap());
    let interleaved = kernels::interleave(path, q.dtype(), &stored, shape).unwrap();
    std::iter::once((stored, Layout::Stored))
        .chain(interleaved.map(|bytes| (bytes, Layout::Interleaved)))
        .collect()
}

/// `x · qᵀ` on `path` from `data` in `layout`.
fn ours_in(
    path: Path,
    q: &QTensor,
    (data, layout): &(Vec<u8>, Layout),
    (m, k, n): (usize, usize, usize),
    x: &[f32],
) -> Vec<f32> {
    let matrix = kernels::Matrix {
        dtype: q.dtype(),
        data,
        rows: n,
        layout: *layout,
    };
    let mut dst = vec![0f32; m * n];
    let scratch = &mut kernels::Scratch::default();
    kernels::matmul_group(path, &[matrix], (m, k), x, &mut [&mut dst], scratch).unwrap();
    dst
}

fn worst(a: &[f32], b: &[f32], scale: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .zip(scale)
        .map(|((a, b), s)| (a - b).abs() / s)
        .fold(0f32, f32::max)
}

#[test]
fn kernels_match_dequantized_matmul() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // 2 threads split one activation row over output rows and three rows over activation
    // rows; 4 threads split each of the three rows over output rows. Eleven rows are a whole
    // tile of activation rows and part of another; 37 are quantized in parallel, in blocks of
    // tiles, the last one partial.
    for threads in [2, 4] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (dtype, ks) in TYPES {
            let (mut vs_f32, mut vs_scalar) = (0f32, 0f32);
            for k in ks {
                for m in [1, 3, 11, 37] {
                    for n in [7, 49] {
                        let w = Tensor::from_vec(rng.matrix(n, k), (n, k), &Device::Cpu).unwrap();
                        let x = rng.matrix(m, k);
                        let q = QTensor::quantize(&w, dtype).unwrap();
                        let dequantized = q.dequantize(&Device::Cpu).unwrap();
                        let expected = Tensor::from_slice(&x, (m, k), &Device::Cpu)
                            .unwrap()
                            .matmul(&dequantized.t().unwrap())
                            .unwrap()
                            .flatten_all()
                            .unwrap()
                            .to_vec1::<f32>()
                            .unwrap();
                        let w = dequantized.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                        let scale = scales(&x, &w, (m, k, n), activation_block(dtype));
                        // Scalar first, then every other path in each of its layouts.
                        let results: Vec<(Path, Layout, Vec<f32>)> = pool.install(|| {
                            Path::available()
                                .into_iter()
                                .flat_map(|path| {
                                    layouts(path, &q)
                                        .into_iter()
                                        .map(move |bytes| (path, bytes))
                                })
                                .map(|(path, bytes)| {
                                    (path, bytes.1, ours_in(path, &q, &bytes, (m, k, n), &x))
                                })
                                .collect()
                        });
                        for (path, layout, got) in &results {
                            let err = worst(got, &expected, &scale);
                            assert!(
                                err <= ACTIVATIONS,
                                "{dtype:?} {path:?} {layout:?} (m, k, n) = ({m}, {k}, {n}): {err}"
                            );
                            vs_f32 = vs_f32.max(err);
                            let err = worst(got, &results[0].2, &scale);
                            assert!(
                                err <= SAME_INTEGERS,
                                "{dtype:?} {path:?} {layout:?} vs scalar (m, k, n) = ({m}, {k}, {n}): {err}"
                            );
                            vs_scalar = vs_scalar.max(err);
                        }
                    }
                }
            }
            println!(
                "{dtype:?}, {threads} threads: vs f32 {vs_f32:.2e}, vs scalar {vs_scalar:.2e}"
            );
        }
    }
}

#[test]
fn rows_must_be_whole_blocks() {
    let data = vec![0u8; 7 * 32 * 18];
    for path in Path::available() {
        let err = kernels::matmul(
            path,
            GgmlDType::Q4_0,
            &data,
            (1, 1000, 7),
            &[0.0; 1000],
            &mut [0.0; 7],
        )
        .unwrap_err();
        assert!(err.to_string().contains("not a multiple of 32"), "{err}");
    }
}

#[test]
fn wrong_sizes_are_refused() {
    let q = QTensor::quantize(
        &Tensor::zeros((7, 64), candle_core::DType::F32, &Device::Cpu).unwrap(),
        GgmlDType::Q4_1,
    )
    .unwrap();
    let data = q.data().unwrap();
    for path in Path::available() {
        let mut dst = [0.0; 7];
        // The bytes of 7 rows of 64, read as 8 rows.
        let err = kernels::matmul(
            path,
            GgmlDType::Q4_1,
            &data,
            (1, 64, 8),
            &[0.0; 64],
            &mut [0.0; 8],
        );
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("bytes are not a (8, 64)"));
        let err = kernels::matmul(
            path,
            GgmlDType::Q4_1,
            &data,
            (1, 64, 7),
            &[0.0; 32],
            &mut dst,
        );
        assert!(err.unwrap_err().to_string().contains("32 inputs"));
        let err = kernels::matmul(
            path,
            GgmlDType::Q5K,
            &data,
            (1, 64, 7),
            &[0.0; 64],
            &mut dst,
        );
        assert!(err.unwrap_err().to_string().contains("no kernel for Q5K"));
    }
    // Interleaved blocks come in whole groups of 16 rows, of the types that have the layout,
    // and only the AVX-512 path reads them.
    let refused = |dtype, data: &[u8], path| {
        let matrix = kernels::Matrix {
            dtype,
            data,
            rows: 7,
            layout: Layout::Interleaved,
        };
        let mut dst = [0.0; 7];
        let scratch = &mut kernels::Scratch::default();
        kernels::matmul_group(
            path,
            &[matrix],
            (1, 64),
            &[0.0; 64],
            &mut [&mut dst],
            scratch,
        )
        .unwrap_err()
        .to_string()
    };
    let err = refused(GgmlDType::Q4_1, &data, Path::Scalar);
    assert!(
        err.contains("bytes are not a (7, 64) Q4_1 matrix (Interleaved)"),
        "{err}"
    );
    let group = vec![0u8; 16 * 2 * 20];
    let err = refused(GgmlDType::Q4_1, &group, Path::Scalar);
    assert!(
        err.contains("interleaved blocks run on the AVX-512 path, not Scalar"),
        "{err}"
    );
    let q6k = kernels::Matrix {
        dtype: GgmlDType::Q6K,
        data: &vec![0u8; 16 * 210],
        rows: 7,
        layout: Layout::Interleaved,
    };
    let err = kernels::matmul_group(
        Path::Scalar,
        &[q6k],
        (1, 256),
        &[0.0; 256],
        &mut [&mut [0.0; 7]],
        &mut kernels::Scratch::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("no interleaved layout for Q6K"), "{err}");
}

#[test]
fn k_quant_rows_must_be_whole_super_blocks() {
    // 288 values are whole 32-value activation blocks but not whole 256-value super-blocks
    // (refused before the bytes are looked at).
    for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
        for path in Path::available() {
            let err = kernels::matmul(path, dtype, &[], (1, 288, 7), &[0.0; 288], &mut [0.0; 7])
                .unwrap_err()
                .to_string();
            let expected = format!("rows of 288 values are not whole {dtype:?} blocks of 256");
            assert!(err.contains(&expected), "{err}");
        }
    }
}

/// A group computes each matrix as it is computed alone, bit for bit, whatever its types and
/// row counts (K-quants and 32-value types together, so both kinds of activations), on every
/// path, for one activation row and several, through one scratch kept from call to call (a
/// larger call's leftovers in it first).
#[test]
fn a_group_equals_its_matrices_alone() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let k = 512;
    let shapes = [
        (GgmlDType::Q4_1, 64),
        (GgmlDType::Q4K, 21),
        (GgmlDType::Q8_0, 7),
        (GgmlDType::Q6K, 100),
        (GgmlDType::Q5_0, 36),
        (GgmlDType::Q4_0, 7),
    ];
    let qs: Vec<QTensor> = shapes
        .iter()
        .map(|&(dtype, n)| {
            let w = Tensor::from_vec(rng.matrix(n, k), (n, k), &Device::Cpu).unwrap();
            QTensor::quantize(&w, dtype).unwrap()
        })
        .collect();
    for path in Path::available() {
        // Each matrix in the last layout the path has for it: interleaved where there is one.
        let bytes: Vec<(Vec<u8>, Layout)> =
            qs.iter().map(|q| layouts(path, q).pop().unwrap()).collect();
        let matrices: Vec<kernels::Matrix> = shapes
            .iter()
            .zip(&bytes)
            .map(|(&(dtype, rows), (data, layout))| kernels::Matrix {
                dtype,
                data,
                rows,
                layout: *layout,
            })
            .collect();
        let mut scratch = kernels::Scratch::default();
        for m in [37, 0, 3, 11, 1] {
            let x = rng.matrix(m, k);
            let mut dsts: Vec<Vec<f32>> = shapes.iter().map(|&(_, n)| vec![0f32; m * n]).collect();
            let mut outs: Vec<&mut [f32]> = dsts.iter_mut().map(Vec::as_mut_slice).collect();
            kernels::matmul_group(path, &matrices, (m, k), &x, &mut outs, &mut scratch).unwrap();
            for ((q, (&(dtype, n), bytes)), got) in
                qs.iter().zip(shapes.iter().zip(&bytes)).zip(&dsts)
            {
                let alone = ours_in(path, q, bytes, (m, k, n), &x);
                assert_eq!(got, &alone, "{dtype:?} {path:?} {:?} m = {m}", bytes.1);
            }
        }
    }
    let data: Vec<_> = qs.iter().map(|q| q.data().unwrap()).collect();
    let matrices: Vec<kernels::Matrix> = shapes
        .iter()
        .zip(&data)
        .map(|(&(dtype, rows), data)| kernels::Matrix::stored(dtype, data, rows))
        .collect();
    let scratch = &mut kernels::Scratch::default();
    let err = kernels::matmul_group(
        Path::Scalar,
        &matrices,
        (1, k),
        &[0.0; 512],
        &mut [],
        scratch,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("6 matrices and 0 outputs"), "{err}");
}

/// An interleaved matrix's rows are the values its stored blocks dequantize to, bit for bit,
/// the padded last group's rows included; a row past the end is refused.
#[test]
fn interleaved_rows_are_the_stored_values() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (n, k) = (37, 64);
    for dtype in [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q8_0,
    ] {
        let w = Tensor::from_vec(rng.matrix(n, k), (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, dtype).unwrap();
        let stored = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let Some(data) =
            kernels::interleave(Path::Avx512, dtype, &q.data().unwrap(), (n, k)).unwrap()
        else {
            continue;
        };
        let ids = [0, 36, 5, 16, 15, 0];
        let rows = kernels::interleaved_rows(dtype, &data, (n, k), &ids).unwrap();
        for (row, &id) in rows.chunks(k).zip(&ids) {
            assert_eq!(row, stored[id].as_slice(), "{dtype:?} row {id}");
        }
        let err = kernels::interleaved_rows(dtype, &data, (n, k), &[37]).unwrap_err();
        assert!(
            err.to_string().contains("row 37 of a matrix of 37 rows"),
            "{err}"
        );
    }
}

/// `LMHOST_SIMD` caps the paths a process runs, and an unknown level is refused when a backend
/// is made: this test's binary, run again under each cap, reports what it found.
#[test]
fn the_simd_cap_leaves_wider_paths_out() {
    if std::env::var_os("LMHOST_SIMD_REPORT").is_some() {
        let made = lmhost_candle::Candle::new(lmhost_plugin_api::PluginContext::new("candle", "m"));
        println!("paths {:?} best {:?}", Path::available(), Path::best());
        println!("backend {:?}", made.err().map(|e| e.message.to_string()));
        return;
    }
    let report = |cap: &str| {
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "the_simd_cap_leaves_wider_paths_out",
                "--nocapture",
            ])
            .env("LMHOST_SIMD", cap)
            .env("LMHOST_SIMD_REPORT", "1")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let scalar = report("scalar");
    assert!(scalar.contains("paths [Scalar] best Scalar"), "{scalar}");
    let avx2 = report("avx2");
    assert!(!avx2.contains("Avx512"), "{avx2}");
    assert!(avx2.contains("backend None"), "{avx2}");
    let unknown = report("sse4");
    assert!(
        unknown.contains("LMHOST_SIMD=\\\"sse4\\\" is not a SIMD level"),
        "{unknown}"
    );
}
