//! What a graph takes and gives, read from the session (never assumed): the layout Hugging
//! Face Optimum exports decoder-only LMs in. A graph that lacks part of it is refused, naming
//! what is missing.

use ort::session::Session;
use ort::value::{Outlet, TensorElementType, ValueType};
use serde_json::Value;

/// The graph's inputs and outputs, and the KV shape they imply.
#[derive(Debug, Clone)]
pub struct Signature {
    /// Layers with `past_key_values.N.key/value` inputs and `present.N.key/value` outputs.
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Optimum's older exports have no `position_ids`; positions then follow the mask.
    pub position_ids: bool,
    /// A merged decoder's switch between its with-past and without-past branches.
    pub use_cache_branch: bool,
    /// `input_ids`' batch axis is free: several sequences can share a pass.
    pub batch: bool,
}

fn tensor(outlet: &Outlet) -> Option<(TensorElementType, &[i64])> {
    match outlet.dtype() {
        ValueType::Tensor { ty, shape, .. } => Some((*ty, shape)),
        _ => None,
    }
}

/// A fixed dimension (symbolic ones read as -1).
fn fixed(dim: i64) -> Option<usize> {
    usize::try_from(dim).ok().filter(|&d| d > 0)
}

impl Signature {
    /// Reads the session's inputs and outputs; `config` (config.json) fills KV dimensions the
    /// graph leaves symbolic.
    pub fn read(session: &Session, config: &Value) -> Result<Signature, String> {
        let input = |name: &str| session.inputs().iter().find(|o| o.name() == name);
        let output = |name: &str| session.outputs().iter().find(|o| o.name() == name);
        let mut missing = Vec::new();
        let batch = input("input_ids")
            .and_then(tensor)
            .is_some_and(|(_, shape)| shape.first().is_some_and(|&d| d != 1));
        for name in ["input_ids", "attention_mask"] {
            match input(name).and_then(tensor) {
                Some((TensorElementType::Int64, _)) => {}
                Some((ty, _)) => return Err(format!("input `{name}` is {ty:?}, expected int64")),
                None => missing.push(format!("input `{name}`")),
            }
        }
        let logits = output("logits").and_then(tensor);
        match logits {
            Some((TensorElementType::Float32, _)) => {}
            Some((ty, _)) => return Err(format!("output `logits` is {ty:?}, expected float32")),
            None => missing.push("output `logits`".into()),
        }
        let layers = (0..)
            .take_while(|n| input(&format!("past_key_values.{n}.key")).is_some())
            .count();
        if layers == 0 {
            missing.push(
                "KV inputs `past_key_values.0.key` .. (export with the KV cache: Optimum's \
                 `text-generation-with-past` task)"
                    .into(),
            );
        }
        let mut kv_shape = None;
        for n in 0..layers {
            for (kind, out) in [("key", "present"), ("value", "present")] {
                let past = format!("past_key_values.{n}.{kind}");
                let present = format!("{out}.{n}.{kind}");
                match input(&past).and_then(tensor) {
                    Some((TensorElementType::Float32, shape)) if shape.len() == 4 => {
                        kv_shape.get_or_insert((shape[1], shape[3]));
                    }
                    Some((ty, shape)) => {
                        return Err(format!(
                            "input `{past}` is {ty:?} of rank {}, expected float32 \
                             [batch, kv_heads, past_sequence_length, head_dim]",
                            shape.len()
                        ))
                    }
                    None => missing.push(format!("input `{past}`")),
                }
                if output(&present).is_none() {
                    missing.push(format!("output `{present}`"));
                }
            }
        }
        if !missing.is_empty() {
            return Err(format!(
                "the graph lacks {} (expected a decoder-only LM in Optimum's layout)",
                missing.join(", ")
            ));
        }
        let (heads, dim) = kv_shape.unwrap_or((-1, -1));
        let from_config = |key: &str| config.get(key).and_then(Value::as_u64).map(|v| v as usize);
        let kv_heads = fixed(heads)
            .or_else(|| from_config("num_key_value_heads"))
            .or_else(|| from_config("num_attention_heads"))
            .ok_or(
                "the KV inputs' head count is symbolic and config.json has no num_key_value_heads",
            )?;
        let head_dim = fixed(dim)
            .or_else(|| from_config("head_dim"))
            .or_else(|| Some(from_config("hidden_size")? / from_config("num_attention_heads")?))
            .ok_or("the KV inputs' head_dim is symbolic and config.json does not give it")?;
        Ok(Signature {
            layers,
            kv_heads,
            head_dim,
            position_ids: input("position_ids").is_some(),
            use_cache_branch: input("use_cache_branch").is_some(),
            batch,
        })
    }
}
