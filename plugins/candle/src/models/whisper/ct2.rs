//! Loads CTranslate2 `model.bin` Whisper checkpoints (faster-whisper's format) directly, read
//! by [`lmhost_plugin_kit::ct2`].
//!
//! The variables are renamed to Hugging Face's Whisper names so one model file serves both
//! formats: fused projections are split (`self_attention/linear_0` is q, k, v by rows;
//! `attention/linear_1` is k, v), CTranslate2's zero key bias is dropped, and int8 weights are
//! dequantised with their `weight_scale` rows.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use lmhost_plugin_kit::ct2::{parse, Variable};

use super::Config;

/// Renames CTranslate2's variables to Hugging Face's and builds the model config.
struct Renamer {
    vars: HashMap<String, Variable>,
    out: HashMap<String, Tensor>,
}

impl Renamer {
    fn take(&mut self, name: &str) -> Result<Variable, String> {
        let mut var = self
            .vars
            .remove(&format!("{name}/weight"))
            .or_else(|| self.vars.remove(name))
            .ok_or_else(|| format!("variable `{name}` is missing"))?;
        // int8 weights carry one scale per output row: w = q / scale.
        if let Some(scale) = self.vars.remove(&format!("{name}/weight_scale")) {
            let row = var.values.len() / scale.values.len().max(1);
            for (i, v) in var.values.iter_mut().enumerate() {
                *v /= scale.values.get(i / row.max(1)).copied().unwrap_or(1.0);
            }
        }
        Ok(var)
    }

    fn bias(&mut self, name: &str) -> Option<Variable> {
        self.vars.remove(&format!("{name}/bias"))
    }

    fn put(&mut self, name: String, dims: Vec<usize>, values: Vec<f32>) -> Result<(), String> {
        let t = Tensor::from_vec(values, dims, &Device::Cpu).map_err(|e| e.to_string())?;
        self.out.insert(name, t);
        Ok(())
    }

    /// A linear layer; `parts` > 1 splits a fused one by rows into `names` (skipping `None`
    /// biases: the key projection has none).
    fn linear(&mut self, src: &str, names: &[(&str, bool)]) -> Result<(), String> {
        let w = self.take(src)?;
        let b = self.bias(src);
        let (rows, cols) = match w.dims[..] {
            [r, c] if r % names.len() == 0 => (r / names.len(), c),
            _ => {
                return Err(format!(
                    "`{src}/weight` has dimensions {:?}; expected a matrix of {} equal row blocks",
                    w.dims,
                    names.len()
                ))
            }
        };
        for (i, &(name, has_bias)) in names.iter().enumerate() {
            let part = w.values[i * rows * cols..(i + 1) * rows * cols].to_vec();
            self.put(format!("{name}.weight"), vec![rows, cols], part)?;
            if has_bias {
                let Some(b) = &b else {
                    return Err(format!("`{src}/bias` is missing"));
                };
                let part = b.values.get(i * rows..(i + 1) * rows).ok_or_else(|| {
                    format!(
                        "`{src}/bias` has {} values; expected {}",
                        b.values.len(),
                        rows * names.len()
                    )
                })?;
                self.put(format!("{name}.bias"), vec![rows], part.to_vec())?;
            }
        }
        Ok(())
    }

    fn layer_norm(&mut self, src: &str, dst: &str) -> Result<(), String> {
        for (from, to) in [("gamma", "weight"), ("beta", "bias")] {
            let v = self
                .vars
                .remove(&format!("{src}/{from}"))
                .ok_or_else(|| format!("variable `{src}/{from}` is missing"))?;
            self.put(format!("{dst}.{to}"), v.dims, v.values)?;
        }
        Ok(())
    }

    fn copy(&mut self, src: &str, dst: &str) -> Result<Vec<usize>, String> {
        let v = self
            .vars
            .remove(src)
            .ok_or_else(|| format!("variable `{src}` is missing"))?;
        let dims = v.dims.clone();
        self.put(dst.to_string(), v.dims, v.values)?;
        Ok(dims)
    }

    fn scalar(&self, name: &str) -> Result<usize, String> {
        self.vars
            .get(name)
            .and_then(|v| v.values.first())
            .map(|&v| v as usize)
            .ok_or_else(|| format!("variable `{name}` is missing"))
    }

    fn count_layers(&self, prefix: &str) -> usize {
        (0..)
            .take_while(|i| {
                self.vars
                    .contains_key(&format!("{prefix}/layer_{i}/ffn/layer_norm/gamma"))
            })
            .count()
    }

    fn attention(&mut self, src: &str, dst: &str) -> Result<(), String> {
        self.layer_norm(&format!("{src}/layer_norm"), &format!("{dst}_layer_norm"))?;
        let (q, k, v) = (
            format!("{dst}.q_proj"),
            format!("{dst}.k_proj"),
            format!("{dst}.v_proj"),
        );
        self.linear(
            &format!("{src}/linear_0"),
            &[(&q, true), (&k, false), (&v, true)],
        )?;
        self.linear(
            &format!("{src}/linear_1"),
            &[(&format!("{dst}.out_proj"), true)],
        )
    }

    fn ffn(&mut self, src: &str, dst: &str) -> Result<(), String> {
        self.layer_norm(
            &format!("{src}/layer_norm"),
            &format!("{dst}.final_layer_norm"),
        )?;
        self.linear(&format!("{src}/linear_0"), &[(&format!("{dst}.fc1"), true)])?;
        self.linear(&format!("{src}/linear_1"), &[(&format!("{dst}.fc2"), true)])
    }
}

/// Loads `path` as Hugging Face-named f32 tensors on the CPU, with the config its shapes imply.
pub fn load(path: &Path) -> Result<(Config, HashMap<String, Tensor>), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let (spec, vars) = parse(&bytes)?;
    if !spec.is_empty() && !spec.contains("Whisper") {
        return Err(format!(
            "spec `{spec}` is not a Whisper model; expected `WhisperSpec`"
        ));
    }
    let mut r = Renamer {
        vars,
        out: HashMap::new(),
    };
    let encoder_layers = r.count_layers("encoder");
    let decoder_layers = r.count_layers("decoder");
    let encoder_heads = r.scalar("encoder/num_heads")?;
    let decoder_heads = r.scalar("decoder/num_heads")?;
    r.copy("encoder/conv1/weight", "model.encoder.conv1.weight")?;
    r.copy("encoder/conv1/bias", "model.encoder.conv1.bias")?;
    r.copy("encoder/conv2/weight", "model.encoder.conv2.weight")?;
    r.copy("encoder/conv2/bias", "model.encoder.conv2.bias")?;
    let source = r.copy(
        "encoder/position_encodings/encodings",
        "model.encoder.embed_positions.weight",
    )?;
    for i in 0..encoder_layers {
        let (src, dst) = (
            format!("encoder/layer_{i}"),
            format!("model.encoder.layers.{i}"),
        );
        r.attention(
            &format!("{src}/self_attention"),
            &format!("{dst}.self_attn"),
        )?;
        r.ffn(&format!("{src}/ffn"), &dst)?;
    }
    r.layer_norm("encoder/layer_norm", "model.encoder.layer_norm")?;
    let embed = r.copy(
        "decoder/embeddings/weight",
        "model.decoder.embed_tokens.weight",
    )?;
    let target = r.copy(
        "decoder/position_encodings/encodings",
        "model.decoder.embed_positions.weight",
    )?;
    for i in 0..decoder_layers {
        let (src, dst) = (
            format!("decoder/layer_{i}"),
            format!("model.decoder.layers.{i}"),
        );
        r.attention(
            &format!("{src}/self_attention"),
            &format!("{dst}.self_attn"),
        )?;
        let (src_x, dst_x) = (format!("{src}/attention"), format!("{dst}.encoder_attn"));
        r.layer_norm(
            &format!("{src_x}/layer_norm"),
            &format!("{dst_x}_layer_norm"),
        )?;
        r.linear(
            &format!("{src_x}/linear_0"),
            &[(&format!("{dst_x}.q_proj"), true)],
        )?;
        let (k, v) = (format!("{dst_x}.k_proj"), format!("{dst_x}.v_proj"));
        r.linear(&format!("{src_x}/linear_1"), &[(&k, false), (&v, true)])?;
        r.linear(
            &format!("{src_x}/linear_2"),
            &[(&format!("{dst_x}.out_proj"), true)],
        )?;
        r.ffn(&format!("{src}/ffn"), &dst)?;
    }
    r.layer_norm("decoder/layer_norm", "model.decoder.layer_norm")?;
    let dim = |dims: &[usize], i: usize, what: &str| {
        dims.get(i)
            .copied()
            .ok_or_else(|| format!("`{what}` has dimensions {dims:?}; expected a matrix"))
    };
    let ffn = r
        .out
        .get("model.encoder.layers.0.fc1.weight")
        .map_or(Ok(0), |t| t.dim(0).map_err(|e| e.to_string()))?;
    let mel_bins = r
        .out
        .get("model.encoder.conv1.weight")
        .map_or(Ok(0), |t| t.dim(1).map_err(|e| e.to_string()))?;
    let config = Config {
        num_mel_bins: mel_bins,
        d_model: dim(&embed, 1, "decoder/embeddings/weight")?,
        vocab_size: dim(&embed, 0, "decoder/embeddings/weight")?,
        encoder_layers,
        decoder_layers,
        encoder_attention_heads: encoder_heads,
        decoder_attention_heads: decoder_heads,
        encoder_ffn_dim: ffn,
        decoder_ffn_dim: ffn,
        max_source_positions: dim(&source, 0, "encoder/position_encodings/encodings")?,
        max_target_positions: dim(&target, 0, "decoder/position_encodings/encodings")?,
        suppress_tokens: Vec::new(),
        begin_suppress_tokens: Vec::new(),
    };
    if encoder_layers == 0 || decoder_layers == 0 {
        return Err("no encoder or decoder layers (`encoder/layer_0/...`) found".into());
    }
    Ok((config, r.out))
}
