//! Reads CTranslate2 `model.bin` Whisper checkpoints (faster-whisper's format) directly.
//!
//! Layout (little-endian; `shared/MODELS.md`, and CTranslate2's `models/model.cc`): u32 binary
//! version; for version >= 2 a spec name and a u32 revision; a u32 variable count; per variable
//! a name, a u8 rank, rank u32 dimensions, for version >= 4 a u8 dtype (0 f32, 1 i8, 2 i16,
//! 3 i32, 4 f16, 5 bf16) and a u32 byte count, then the data; then (version >= 3) a u32 alias
//! count and alias pairs. Strings are a u16 length and bytes, NUL-padded.
//!
//! The variables are renamed to Hugging Face's Whisper names so one model file serves both
//! formats: fused projections are split (`self_attention/linear_0` is q, k, v by rows;
//! `attention/linear_1` is k, v), CTranslate2's zero key bias is dropped, and int8 weights are
//! dequantised with their `weight_scale` rows.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::Config;

/// One variable as stored: dimensions and values (converted to f32).
struct Variable {
    dims: Vec<usize>,
    values: Vec<f32>,
}

/// A bounds-checked reader; every short read is an error naming the offset.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "truncated: {what} needs {n} bytes at offset {} but the file has {}",
                self.pos,
                self.bytes.len()
            ));
        };
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, String> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let n = self.u16(what)? as usize;
        let raw = self.take(n, what)?;
        let raw = raw.split(|&b| b == 0).next().unwrap_or_default();
        String::from_utf8(raw.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }
}

fn decode(raw: &[u8], dtype: u8, name: &str) -> Result<Vec<f32>, String> {
    let values = match dtype {
        0 => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        1 => raw.iter().map(|&b| f32::from(b as i8)).collect(),
        2 => raw
            .chunks_exact(2)
            .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])))
            .collect(),
        3 => raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
            .collect(),
        4 | 5 => {
            let dt = if dtype == 4 { DType::F16 } else { DType::BF16 };
            Tensor::from_raw_buffer(raw, dt, &[raw.len() / 2], &Device::Cpu)
                .and_then(|t| t.to_dtype(DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|e| format!("variable `{name}`: {e}"))?
        }
        other => {
            return Err(format!(
                "variable `{name}` has unknown dtype {other}; expected 0-5 (f32, i8, i16, i32, f16, bf16)"
            ))
        }
    };
    Ok(values)
}

/// Parses the variables (aliases resolved to copies) of a `model.bin` image.
fn parse(bytes: &[u8]) -> Result<(String, HashMap<String, Variable>), String> {
    let mut c = Cursor { bytes, pos: 0 };
    let version = c.u32("the binary version")?;
    if !(1..=6).contains(&version) {
        return Err(format!(
            "binary version {version} is not a CTranslate2 model (expected 1 to 6)"
        ));
    }
    let spec = if version >= 2 {
        let spec = c.string("the spec name")?;
        c.u32("the spec revision")?;
        spec
    } else {
        String::new()
    };
    let count = c.u32("the variable count")?;
    let mut vars = HashMap::new();
    for i in 0..count {
        let name = c.string(&format!("the name of variable {i}"))?;
        let rank = c.u8(&format!("the rank of `{name}`"))?;
        let dims = (0..rank)
            .map(|_| {
                c.u32(&format!("the dimensions of `{name}`"))
                    .map(|d| d as usize)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (dtype, n_bytes) = if version >= 4 {
            let dtype = c.u8(&format!("the dtype of `{name}`"))?;
            (dtype, c.u32(&format!("the size of `{name}`"))? as usize)
        } else {
            (0, c.u32(&format!("the size of `{name}`"))? as usize * 4)
        };
        let values = decode(
            c.take(n_bytes, &format!("the data of `{name}`"))?,
            dtype,
            &name,
        )?;
        let expected = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if expected != Some(values.len()) {
            return Err(format!(
                "variable `{name}` holds {} values but its dimensions {dims:?} need {}",
                values.len(),
                expected.map_or("more than a usize counts".into(), |n| n.to_string())
            ));
        }
        vars.insert(name, Variable { dims, values });
    }
    if version >= 3 && c.pos < bytes.len() {
        let aliases = c.u32("the alias count")?;
        for _ in 0..aliases {
            let alias = c.string("an alias name")?;
            let target = c.string("an alias target")?;
            if let Some(v) = vars.get(&target) {
                let copy = Variable {
                    dims: v.dims.clone(),
                    values: v.values.clone(),
                };
                vars.insert(alias, copy);
            }
        }
    }
    Ok((spec, vars))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u16 + 1).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }

    /// A version-6 image with one f16 variable, one f32 variable and an alias.
    fn image() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&6u32.to_le_bytes());
        string(&mut b, "WhisperSpec");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes());
        string(&mut b, "a");
        b.push(1);
        b.extend_from_slice(&2u32.to_le_bytes());
        b.push(4);
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&[0x00, 0x3c, 0x00, 0xc0]); // f16 1.0, -2.0
        string(&mut b, "s");
        b.push(0);
        b.push(0);
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&6f32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        string(&mut b, "b");
        string(&mut b, "a");
        b
    }

    #[test]
    fn parses_names_dims_dtypes_and_aliases() {
        let (spec, vars) = parse(&image()).unwrap();
        assert_eq!(spec, "WhisperSpec");
        assert_eq!(vars["a"].dims, vec![2]);
        assert_eq!(vars["a"].values, vec![1.0, -2.0]);
        assert_eq!(vars["b"].values, vec![1.0, -2.0]);
        assert_eq!(vars["s"].values, vec![6.0]);
    }

    #[test]
    fn truncated_or_foreign_files_are_errors_not_panics() {
        let full = image();
        for cut in [0, 3, 10, 30, full.len() - 3] {
            let err = parse(&full[..cut])
                .err()
                .expect("truncated image must fail");
            assert!(
                err.contains("truncated") || err.contains("alias"),
                "{cut}: {err}"
            );
        }
        let err = parse(b"GGUF\x03\x00\x00\x00").err().unwrap();
        assert!(err.contains("not a CTranslate2 model"), "{err}");
    }

    /// Dimensions whose product overflows are refused by name, not multiplied into a panic.
    #[test]
    fn overflowing_dimensions_are_refused() {
        let mut b = Vec::new();
        b.extend_from_slice(&6u32.to_le_bytes());
        string(&mut b, "WhisperSpec");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        string(&mut b, "w");
        b.push(3);
        [u32::MAX; 3]
            .iter()
            .for_each(|d| b.extend_from_slice(&d.to_le_bytes()));
        b.push(0);
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&1f32.to_le_bytes());
        let err = parse(&b).err().unwrap();
        assert!(err.contains("need more than a usize counts"), "{err}");
    }
}
