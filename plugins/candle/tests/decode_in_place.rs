//! Decode passes in place (`models/step.rs`) against the same passes op by op, on every family's
//! tiny random-weight GGUF: the logits and the keys and values each pass leaves are the same
//! bit for bit, and a pass allocates nothing per layer, only the logits it hands back.
//!
//! Every matrix of these models decodes through our kernels ([`CASES`]), so each decodes in
//! place; the same pass with its final hidden states asked for
//! (`forward_packed(.., true)`) runs op by op through the same kernels. Both compute each value
//! with the same operations in the same order (candle's norms, RoPE and soft-cap as its CPU
//! ops do them), so nothing may differ: a wrong position, head or window moves the keys by far
//! more than a rounding, and a 8-bit activation rounded the other way moves logits by 1e-3
//! to 1e-2 (a RoPE position off by one had moved them by 6e-3 here). The allocations are
//! counted by this program's allocator, on a pool of one thread (so that one workspace serves
//! every pass); an op-by-op pass of these models allocates some 400 times.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::DType;
use common::{
    backend, family_metadata, family_tensors, gguf_tensors, max_diff, write_gguf_file, LAYERS,
};
use lmhost_candle::kv::KvState;
use lmhost_candle::models::{CausalLm, Logits, Seq};
use lmhost_candle::weights;
use lmhost_plugin_api::serde_json::json;

/// The system allocator, counting allocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on to `System` unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's promises, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A tiny GGUF of `arch` with `matrices` of that type (Mistral with a sliding window of 5,
/// Gemma 3 with its own window, local and global layers and soft-capped logits).
fn write_model(dir: &Path, arch: &str, matrices: GgmlDType) -> PathBuf {
    let mut metadata = family_metadata(arch, LAYERS);
    let extra: &[(&str, Value)] = match arch {
        "mistral" => &[("attention.sliding_window", Value::U32(5))],
        "gemma3" => &[
            ("attention.sliding_window", Value::U32(6)),
            ("final_logit_softcapping", Value::F32(3.0)),
        ],
        _ => &[],
    };
    for (key, value) in extra {
        let key = format!("{arch}.{key}");
        metadata.retain(|(k, _)| *k != key);
        metadata.push((key, value.clone()));
    }
    let tensors = gguf_tensors(arch, &family_tensors(arch, LAYERS), matrices);
    write_gguf_file(
        &dir.join(format!("{arch}-{matrices:?}.gguf")),
        &metadata,
        &tensors,
    )
}

/// One decode pass: row `i` is token `tokens[i]` after `states[i]`; `op_by_op` asks for the
/// hidden states too, which the in-place step does not give. Returns each row's logits and
/// the allocations the pass made (this function's list of rows included).
fn pass(
    model: &dyn CausalLm,
    states: &mut [KvState],
    tokens: &[[u32; 1]],
    op_by_op: bool,
) -> (Vec<Vec<f32>>, u64) {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let mut seqs: Vec<Seq<'_>> = states
        .iter_mut()
        .zip(tokens)
        .map(|(kv, ids)| Seq {
            ids,
            kv,
            share: None,
            logits_from: 0,
            hidden: None,
            sampled: true,
        })
        .collect();
    let (logits, _) = weights::generating(|| model.forward_packed(&mut seqs, op_by_op)).unwrap();
    let allocated = ALLOCATIONS.load(Ordering::Relaxed) - before;
    let logits = logits
        .into_iter()
        .map(|l| l.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .collect();
    (logits, allocated)
}

/// Each layer's keys and values, flattened.
fn contents(state: &KvState) -> Vec<f32> {
    (0..LAYERS)
        .filter_map(|l| state.layer(l))
        .flat_map(|(k, v)| {
            let values = |t: candle_core::Tensor| {
                let t = t.to_dtype(DType::F32).unwrap();
                t.flatten_all().unwrap().to_vec1::<f32>()
            };
            [values(k).unwrap(), values(v).unwrap()]
        })
        .flatten()
        .collect()
}

/// Each family under `weights = mixed` (f32 matrices, Q8_0 decode copies), and quantized
/// files that `auto` and `compact` decode from their own blocks (a tied table looked up in the
/// layer's dense copy, in interleaved blocks or in stored ones).
/// Sequences a pass decodes.
const ROWS: usize = 17;

/// `(architecture, matrices, weights, kv_cache_dtype)`: keys and values kept in f16 are
/// read where they lie by the step in place, and converted for the op-by-op pass's attention.
const CASES: &[(&str, GgmlDType, &str, &str)] = &[
    ("llama", GgmlDType::F32, "mixed", "auto"),
    ("qwen2", GgmlDType::F32, "mixed", "auto"),
    ("qwen3", GgmlDType::F32, "mixed", "auto"),
    ("phi3", GgmlDType::F32, "mixed", "auto"),
    ("mistral", GgmlDType::F32, "mixed", "auto"),
    ("gemma3", GgmlDType::F32, "mixed", "auto"),
    ("llama", GgmlDType::Q8_0, "auto", "auto"),
    ("llama", GgmlDType::Q4_1, "compact", "auto"),
    ("gemma3", GgmlDType::Q4_0, "auto", "auto"),
    ("gemma3", GgmlDType::Q8_0, "compact", "auto"),
    ("mistral", GgmlDType::Q4_1, "auto", "float16"),
    ("gemma3", GgmlDType::Q8_0, "auto", "float16"),
];

#[test]
fn decode_passes_in_place_match_op_by_op_and_allocate_only_their_logits() {
    let dir = tempfile::tempdir().unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for &(arch, matrices, format, kv) in CASES {
        let case = format!("{arch} {matrices:?} {format} kv {kv}");
        let path = write_model(dir.path(), arch, matrices);
        let b = backend(&path, json!({ "weights": format, "kv_cache_dtype": kv }));
        let engine = b.engine().unwrap();
        let model = engine.model.as_ref();
        // ROWS sequences after prompts of their own lengths, 7 to 27 tokens (Mistral's window
        // of 5 and Gemma's of 6 cut into all), more than a kernel tile of 8 rows and enough
        // for the activations to be quantized in parallel.
        let prompts: Vec<Vec<u32>> = (0..ROWS as u32)
            .map(|i| (3 * i..3 * i + 7 + (7 * i) % 21).collect())
            .collect();
        let mut in_place: Vec<KvState> = prompts
            .iter()
            .map(|ids| {
                let mut kv = model.new_state();
                model.forward(ids, &mut kv, Logits::Last, false).unwrap();
                kv
            })
            .collect();
        let mut op_by_op = in_place.clone();
        let mut counted = Vec::new();
        for step in 0..6u32 {
            let tokens: Vec<[u32; 1]> = (0..ROWS as u32)
                .map(|i| [(70 + 5 * i + step) % 100])
                .collect();
            let (ours, allocated) = pool.install(|| pass(model, &mut in_place, &tokens, false));
            counted.push(allocated);
            let (theirs, _) = pool.install(|| pass(model, &mut op_by_op, &tokens, true));
            let diff = max_diff(&ours, &theirs);
            assert!(diff == 0.0, "{case}, step {step}: logits off by {diff}");
        }
        let stored = in_place[0].layer(0).map(|(k, _)| k.dtype());
        let expected = if kv == "float16" {
            DType::F16
        } else {
            DType::F32
        };
        assert_eq!(stored, Some(expected), "{case}");
        for (ours, theirs) in in_place.iter().zip(&op_by_op) {
            assert_eq!(ours.len(), theirs.len());
            let diff = max_diff(&[contents(ours)], &[contents(theirs)]);
            assert!(diff == 0.0, "{case}: keys and values off by {diff}");
        }
        // The first pass grows the workspace and copies each prompt's keys into a buffer with
        // room for as many again (so no later pass here fills one); after it a pass allocates
        // its logits (a tensor a row: storage, shape, strides and two shared headers), the
        // list of them, the flag of the pool's pollers and this test's list of rows: nothing
        // per layer.
        let most = counted[1..].iter().max().copied().unwrap_or_default();
        assert!(
            most <= 5 * ROWS as u64 + 3,
            "{case}: a decode pass in place allocated {most} times ({counted:?})"
        );
    }
    past_the_context_is_refused_and_the_state_kept(dir.path());
}

/// A decode pass in place at the last position of the context runs; one past it is refused
/// by name, and the state keeps what it held.
fn past_the_context_is_refused_and_the_state_kept(dir: &Path) {
    let path = write_model(dir, "llama", GgmlDType::Q8_0);
    let b = backend(&path, json!({ "weights": "auto", "max_context": 16 }));
    let engine = b.engine().unwrap();
    let model = engine.model.as_ref();
    let mut states = [model.new_state()];
    let prompt: Vec<u32> = (3..18).collect();
    model
        .forward(&prompt, &mut states[0], Logits::Last, false)
        .unwrap();
    pass(model, &mut states, &[[5]], false);
    assert_eq!(states[0].len(), 16);
    let mut seqs = [Seq {
        ids: &[6],
        kv: &mut states[0],
        share: None,
        logits_from: 0,
        hidden: None,
        sampled: true,
    }];
    let err = weights::generating(|| model.forward_packed(&mut seqs, false)).unwrap_err();
    assert!(
        err.to_string()
            .contains("position 16 is past the model's context of 16"),
        "{err}"
    );
    assert_eq!(states[0].len(), 16);
}
