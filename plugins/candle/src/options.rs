//! The plugin's options: their specs (the host validates configs against them) and their
//! parsed form, with the checks the host cannot do (a registered attention kernel, a device this
//! build supports).

use candle_core::{DType, Device};
use lmhost_plugin_api::serde_json::{json, Map, Value};
use lmhost_plugin_api::{OptionKind, OptionSpec, PluginError};

use crate::memory::MemoryBudget;
use crate::weights::WeightFormat;
use crate::{accelerator, attention};

/// Parsed `[backend.options]`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub dtype: String,
    pub device: String,
    pub revision: String,
    pub weights: WeightFormat,
    pub memory_budget: MemoryBudget,
    pub attn_implementation: String,
    pub model_class: Option<String>,
    /// 0 = all cores.
    pub threads: usize,
    /// 0 = the model's own context length.
    pub max_context: usize,
    /// A template file, `"plain"`, or none for the model's own.
    pub chat_template: Option<String>,
    pub kv_cache_dtype: String,
}

/// The values of option `kv_cache_dtype`.
const KV_DTYPES: &[&str] = &["auto", "float32", "float16"];

/// Default for `max_audio_seconds`: ten minutes, twenty windows.
pub const DEFAULT_MAX_AUDIO_SECONDS: u64 = 600;

/// Every option the candle backend takes, the speech models' among them.
pub fn specs() -> Vec<OptionSpec> {
    let mut classes = vec!["auto"];
    classes.extend(crate::models::text_architectures());
    classes.push("whisper");
    vec![
        OptionSpec::choice(
            "dtype",
            &["auto", "float32", "float16", "bfloat16"],
            "auto",
            "Compute dtype; auto: f32 on CPU, bf16 on CUDA (f16 before compute capability 8.0), \
             f16 on Metal.",
        ),
        OptionSpec::choice(
            "kv_cache_dtype",
            KV_DTYPES,
            "auto",
            "How keys and values are kept; auto: the compute dtype. float16 halves their \
             memory and a decode step's reads of them (long contexts, many concurrent \
             generations) and rounds each to f16, so results move slightly (f32 is what \
             explain's values were checked against).",
        ),
        OptionSpec::choice(
            "device",
            &["auto", "cpu", "cuda", "metal"],
            "auto",
            "auto: CUDA, then Metal, then CPU (cuda/metal need the cargo features).",
        ),
        OptionSpec::new(
            "revision",
            OptionKind::String,
            json!("main"),
            "Hub revision (branch, tag or commit) for hub model ids.",
        ),
        OptionSpec::choice(
            "weights",
            WeightFormat::CHOICES,
            "auto",
            "Linear-layer format: auto (quantized GGUF on CPU: the first that fits \
             `memory_budget` of f32 scoring with generation from the stored blocks (its \
             prompts too where the kernels have AVX2 or AVX-512), as_stored, compact; as stored \
             elsewhere), as_stored \
             (candle's kernels; on CPU they add a repacked copy of Q4_0/Q4_K/Q5_K/Q6_K/Q8_0 \
             matrices for fast prefill; Q4_1 and Q5_0 run lmhost's kernels, as compact), compact (as stored, no repacked copy: decode as fast, \
             prefill slower), f32, bf16 (as auto, scoring in bf16 dot products with f32 sums; \
             CPUs with AVX-512 BF16), q8_0, q4_0, mixed (f32 scoring + Q8_0 generation, as \
             auto).",
        ),
        OptionSpec::new(
            "memory_budget",
            OptionKind::String,
            json!("auto"),
            "Most memory the weights may take: bytes, or a size such as \"8GiB\" or \"1.5GB\"; \
             auto: half of MemAvailable on CPU (4 GiB where /proc/meminfo is absent), half of \
             the free GPU memory on CUDA, no limit on Metal. A model whose weights do not fit \
             in the chosen format is refused, naming what it needs.",
        ),
        OptionSpec::new(
            "attn_implementation",
            OptionKind::String,
            json!("sdpa"),
            "A registered attention implementation: sdpa (fused on CPU in f32; under weights = \
             bf16 it is sdpa_bf16), sdpa_bf16 (sdpa, with a cached prefix that a pass's \
             sequences share attended in bf16 products, where the CPU has AVX-512 BF16), eager, \
             chunked, or one an app registered.",
        ),
        OptionSpec::choice(
            "model_class",
            &classes,
            "auto",
            "Architecture; auto reads config.json's model_type or the GGUF architecture. \
             Plans (llama): tensor-parallel q/k/v/gate/up colwise, o/down rowwise; \
             pipeline embed_tokens -> layers -> norm.",
        ),
        OptionSpec::new(
            "threads",
            OptionKind::Integer,
            json!(0),
            "CPU threads for this backend (0 = all cores).",
        ),
        OptionSpec::new(
            "max_context",
            OptionKind::Integer,
            json!(0),
            "Longest prompt + reply in tokens (0 = the model's context length).",
        ),
        OptionSpec::new(
            "chat_template",
            OptionKind::String,
            json!(""),
            "A Jinja chat template file or tokenizer_config.json to use instead of the model's \
             own; \"plain\" for `role: content` lines (a model without a template refuses chat \
             messages otherwise).",
        ),
        OptionSpec::new(
            "max_audio_seconds",
            OptionKind::Integer,
            json!(DEFAULT_MAX_AUDIO_SECONDS),
            "longest audio (all parts of a conversation together) a speech model accepts",
        ),
    ]
}

fn string(options: &Map<String, Value>, key: &str, default: &str) -> String {
    options
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or(default)
        .to_string()
}

fn integer(options: &Map<String, Value>, key: &str) -> usize {
    options.get(key).and_then(Value::as_u64).unwrap_or(0) as usize
}

impl Settings {
    /// Parses options the host already validated, then checks what it could not.
    pub fn parse(options: &Map<String, Value>) -> Result<Self, PluginError> {
        let weights = string(options, "weights", "auto");
        let weights = WeightFormat::parse(&weights).ok_or_else(|| {
            PluginError::config(format!(
                "option `weights` must be one of {}. Given: {weights:?}",
                WeightFormat::CHOICES.join(", ")
            ))
        })?;
        let budget = string(options, "memory_budget", "auto");
        let memory_budget = MemoryBudget::parse(&budget).ok_or_else(|| {
            PluginError::config(format!(
                "option `memory_budget` must be {}. Given: {budget:?}",
                MemoryBudget::EXPECTED
            ))
        })?;
        let attn = string(options, "attn_implementation", "sdpa");
        attention::resolve(&attn).map_err(PluginError::config)?;
        let model_class = Some(string(options, "model_class", "auto")).filter(|c| c != "auto");
        let kv_cache_dtype = string(options, "kv_cache_dtype", "auto");
        if !KV_DTYPES.contains(&kv_cache_dtype.as_str()) {
            return Err(PluginError::config(format!(
                "option `kv_cache_dtype` must be one of {}. Given: {kv_cache_dtype:?}",
                KV_DTYPES.join(", ")
            )));
        }
        let settings = Settings {
            dtype: string(options, "dtype", "auto"),
            device: string(options, "device", "auto"),
            revision: string(options, "revision", "main"),
            weights,
            memory_budget,
            attn_implementation: attn,
            model_class,
            threads: integer(options, "threads"),
            max_context: integer(options, "max_context"),
            chat_template: Some(string(options, "chat_template", "")).filter(|t| !t.is_empty()),
            kv_cache_dtype,
        };
        settings.device()?;
        settings.dtype_on(&Device::Cpu)?;
        Ok(settings)
    }

    /// The device: an explicit choice must be available; auto falls back to CPU.
    pub fn device(&self) -> Result<Device, PluginError> {
        let unavailable = |name: &str, built: bool, e: candle_core::Error| {
            let hint = match built {
                true => {
                    format!("this build has `{name}`: the machine lacks the device or its driver")
                }
                false => format!(
                    "build the plugin with `--features {name}` on a machine with that device"
                ),
            };
            PluginError::config(format!(
                "option `device` = {name:?} is not available: {e} ({hint}, or use \"cpu\")"
            ))
        };
        match self.device.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => {
                Device::new_cuda(0).map_err(|e| unavailable("cuda", cfg!(feature = "cuda"), e))
            }
            "metal" => {
                Device::new_metal(0).map_err(|e| unavailable("metal", cfg!(feature = "metal"), e))
            }
            _ => Ok(auto_device()),
        }
    }

    /// The compute dtype on `device`: `auto` is bf16 on CUDA (f16 before Ampere, which has no
    /// bf16 kernels), f16 on Metal, f32 on CPU.
    pub fn dtype_on(&self, device: &Device) -> Result<DType, PluginError> {
        let bf16 = accelerator::supports_bf16(device);
        Ok(match self.dtype.as_str() {
            "float32" => DType::F32,
            "float16" => DType::F16,
            "bfloat16" if bf16 => DType::BF16,
            "bfloat16" => {
                let (major, minor) = accelerator::compute_capability(device).unwrap_or_default();
                let (need_major, need_minor) = accelerator::BF16_SINCE;
                return Err(PluginError::config(format!(
                    "option `dtype` = \"bfloat16\" needs a GPU of compute capability \
                     {need_major}.{need_minor} or later, and this one is {major}.{minor}; use \
                     \"float16\" or \"float32\""
                )));
            }
            _ if device.is_cuda() && bf16 => DType::BF16,
            _ if device.is_cuda() || device.is_metal() => DType::F16,
            _ => DType::F32,
        })
    }

    /// How states keep keys and values, where the model computes in `compute`.
    pub fn kv_dtype(&self, compute: DType) -> DType {
        match self.kv_cache_dtype.as_str() {
            "float32" => DType::F32,
            "float16" => DType::F16,
            _ => compute,
        }
    }
}

fn auto_device() -> Device {
    if candle_core::utils::cuda_is_available() {
        if let Ok(d) = Device::new_cuda(0) {
            return d;
        }
    }
    if candle_core::utils::metal_is_available() {
        if let Ok(d) = Device::new_metal(0) {
            return d;
        }
    }
    Device::Cpu
}

/// The model's tensor-parallel plan, validated, for `lmhost plugins` and tooling.
pub fn tensor_parallel_plan() -> Result<Vec<(String, crate::models::TpStyle)>, String> {
    crate::models::validate_tp_plan(crate::models::decoder::TP_PLAN)
}

/// The model's pipeline plan: its top-level blocks in order, each with its inputs and outputs.
pub fn pipeline_plan() -> &'static [crate::models::PipelineStage] {
    crate::models::decoder::PP_PLAN
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<Settings, PluginError> {
        Settings::parse(v.as_object().unwrap())
    }

    #[test]
    fn defaults_are_cpu_f32_eager() {
        let s = parse(json!({})).unwrap();
        assert!(s.device().unwrap().is_cpu());
        assert_eq!(s.dtype_on(&Device::Cpu).unwrap(), DType::F32);
        assert_eq!(s.weights, WeightFormat::Auto);
        assert_eq!(s.attn_implementation, "sdpa");
    }

    #[test]
    fn memory_budget_is_a_size_or_auto() {
        assert_eq!(parse(json!({})).unwrap().memory_budget, MemoryBudget::Auto);
        let s = parse(json!({"memory_budget": "2GiB"})).unwrap();
        assert_eq!(s.memory_budget, MemoryBudget::Bytes(2 << 30));
        let err = parse(json!({"memory_budget": "lots"})).unwrap_err();
        assert_eq!(err.kind, lmhost_plugin_api::ErrorKind::Config);
        assert!(
            err.message.contains("memory_budget") && err.message.contains("8GiB"),
            "{err}"
        );
    }

    #[test]
    fn keys_and_values_follow_the_compute_dtype_unless_asked() {
        let kv = |v: Value| parse(v).unwrap().kv_dtype(DType::BF16);
        assert_eq!(kv(json!({})), DType::BF16);
        assert_eq!(kv(json!({"kv_cache_dtype": "float16"})), DType::F16);
        assert_eq!(kv(json!({"kv_cache_dtype": "float32"})), DType::F32);
        let err = parse(json!({"kv_cache_dtype": "float8"})).unwrap_err();
        assert_eq!(err.kind, lmhost_plugin_api::ErrorKind::Config);
        assert!(
            err.message.contains("kv_cache_dtype") && err.message.contains("float16"),
            "{err}"
        );
    }

    #[test]
    fn unregistered_attention_is_a_config_error_naming_the_key() {
        let err = parse(json!({"attn_implementation": "flash9"})).unwrap_err();
        assert_eq!(err.kind, lmhost_plugin_api::ErrorKind::Config);
        assert!(err.message.contains("attn_implementation"), "{err}");
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_a_config_error() {
        let err = parse(json!({"device": "cuda"})).unwrap_err();
        assert!(
            err.message.contains("`device`") && err.message.contains("cuda"),
            "{err}"
        );
    }

    #[test]
    fn declared_plans_validate() {
        let plan = tensor_parallel_plan().unwrap();
        assert_eq!(plan.len(), 7);
        assert!(crate::models::validate_tp_plan(&[("layers.*.x", "diagonal")]).is_err());
        // The stages run from the token ids to the last hidden states, and the first is the
        // module whose tensor the loader reads as the token table.
        let stages = pipeline_plan();
        assert_eq!(stages.first().map(|s| s.1), Some(&["input_ids"][..]));
        assert_eq!(stages.last().map(|s| s.2), Some(&["hidden_states"][..]));
        let embed = format!("model.{}.", stages[0].0);
        assert!(crate::models::decoder::EMBED.starts_with(&embed));
    }
}
