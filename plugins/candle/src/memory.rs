//! The weights' memory budget (option `memory_budget`): what each weight format would allocate,
//! counted from a checkpoint's tensor list before any tensor is read, and `weights = auto`
//! resolved to a format that fits.
//!
//! `auto` dequantizes a quantized checkpoint to f32 on CPU (fast, exact prefill: right for a
//! 135M model) beside the stored blocks for decode only while both fit; a 7B Q4_K_M file (4 GB)
//! would take about 28 GB as f32, so it stays as stored.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};

use crate::accelerator;
use crate::models::BuildOptions;
use crate::weights::WeightFormat;

/// Option `memory_budget`: the most bytes a model's weights may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryBudget {
    /// Derived from the machine when the model loads ([`MemoryBudget::bytes_on`]).
    Auto,
    Bytes(u64),
}

/// `auto`'s budget where the available memory cannot be read (no `/proc/meminfo`).
const FALLBACK_BYTES: u64 = 4 << 30;

impl MemoryBudget {
    pub const EXPECTED: &'static str =
        "\"auto\", a byte count or a size such as \"8GiB\", \"512 MiB\" or \"1.5GB\"";

    /// `auto`, a byte count, or a number with a unit: KB, MB, GB, TB (powers of 1000) or KiB,
    /// MiB, GiB, TiB (powers of 1024), case-insensitive. Zero is refused.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if text == "auto" {
            return Some(MemoryBudget::Auto);
        }
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number: f64 = number.parse().ok()?;
        let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            "tib" => 1 << 40,
            _ => return None,
        };
        let bytes = number * scale as f64;
        (bytes >= 1.0 && bytes < u64::MAX as f64).then_some(MemoryBudget::Bytes(bytes as u64))
    }

    /// The budget in bytes for weights on `device`; None is no limit. `auto` is half of the
    /// memory available now, the other half left for the KV and prefix caches, activations and
    /// other processes: on CPU Linux's `MemAvailable` (4 GiB where that cannot be read), on
    /// CUDA the device memory the driver reports free. On Metal `auto` sets no limit, since
    /// host memory says nothing of the device's.
    pub fn bytes_on(self, device: &Device) -> Option<u64> {
        match self {
            MemoryBudget::Bytes(n) => Some(n),
            MemoryBudget::Auto if device.is_cpu() => {
                Some(available_memory().map_or(FALLBACK_BYTES, |n| n / 2))
            }
            MemoryBudget::Auto => accelerator::free_memory(device).map(|n| n / 2),
        }
    }
}

/// `MemAvailable` (else `MemTotal`, on kernels before 3.14) from `/proc/meminfo`, in bytes.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |key: &str| {
        text.lines().find_map(|line| {
            let kb = line.strip_prefix(key)?.trim().strip_suffix("kB")?;
            kb.trim().parse::<u64>().ok()
        })
    };
    field("MemAvailable:")
        .or_else(|| field("MemTotal:"))
        .map(|kb| kb * 1024)
}

/// `bytes` for people: "3.92 GiB".
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ => format!("{value:.2} {}", UNITS[unit]),
    }
}

/// What a checkpoint's tensors take, counted from their dtypes and shapes.
#[derive(Debug, Default, Clone, Copy)]
pub struct WeightBytes {
    /// Values of every tensor.
    values: u64,
    /// Values of the block-quantized tensors, and the bytes they are stored in.
    quantized_values: u64,
    quantized_bytes: u64,
    /// Bytes of the quantized tensors of the types candle repacks ([`PACKED`]).
    packed_bytes: u64,
    /// Bytes of the quantized tensors our kernels run in place (`auto`'s decode copy is them),
    /// and values of the others (which `auto` decodes from a Q8_0 copy).
    kernel_bytes: u64,
    unkerneled_values: u64,
}

/// The types of which candle 0.11 keeps a repacked copy on x86 or aarch64 CPUs.
pub(crate) const PACKED: &[GgmlDType] = &[
    GgmlDType::Q4_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
    GgmlDType::Q8_0,
];

/// `bytes` of quantized matrices plus candle's repacked copy of them: the copy measured 1.33x
/// for Q4_K, and its tile layouts take up to about 1.5x (Q6_K), so 1.6x is counted.
fn with_packed(bytes: u64) -> u64 {
    bytes + bytes * 8 / 5
}

impl WeightBytes {
    /// Counts a tensor of `values` values stored as `dtype` (F32, F16 and BF16 tensors are
    /// computed in the compute dtype, so they count as dense).
    pub fn add(&mut self, dtype: GgmlDType, values: usize) {
        if matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
            return self.add_dense(values);
        }
        let bytes = (values / dtype.block_size() * dtype.type_size()) as u64;
        self.values += values as u64;
        self.quantized_values += values as u64;
        self.quantized_bytes += bytes;
        if PACKED.contains(&dtype) {
            self.packed_bytes += bytes;
        }
        if crate::kernels::supports(dtype) {
            self.kernel_bytes += bytes;
        } else {
            self.unkerneled_values += values as u64;
        }
    }

    /// Whether any matrix is stored quantized.
    pub fn quantized(&self) -> bool {
        self.quantized_values > 0
    }

    /// Counts a dense tensor of `values` values.
    pub fn add_dense(&mut self, values: usize) {
        self.values += values as u64;
    }

    /// Every value dense in `dtype`.
    fn dense(&self, dtype: DType) -> u64 {
        self.values * dtype.size_in_bytes() as u64
    }

    /// Every value requantized to `to` (vectors and rows that do not fit its blocks stay dense,
    /// a small part of a model, left out of this estimate).
    fn requantized(&self, to: GgmlDType) -> u64 {
        self.values * to.type_size() as u64 / to.block_size() as u64
    }

    /// The values our kernels do not run, requantized to `to`.
    fn requantized_values(&self, to: GgmlDType) -> u64 {
        self.unkerneled_values * to.type_size() as u64 / to.block_size() as u64
    }

    /// The bytes `format` builds the weights in on `device`.
    pub fn need(&self, format: WeightFormat, dtype: DType, device: &Device) -> u64 {
        let dense_part = (self.values - self.quantized_values) * dtype.size_in_bytes() as u64;
        let compact = self.quantized_bytes + dense_part;
        // candle repacks only on CPU.
        let packed = |bytes: u64| match device.is_cpu() {
            true => with_packed(bytes),
            false => bytes,
        };
        let requantized = |to| packed(self.requantized(to));
        match format {
            WeightFormat::Auto if WeightFormat::auto_dense(dtype, device) => {
                self.dense(dtype) + self.kernel_bytes + self.requantized_values(GgmlDType::Q8_0)
            }
            WeightFormat::Auto | WeightFormat::AsStored => {
                compact - self.packed_bytes + packed(self.packed_bytes)
            }
            WeightFormat::Compact => compact,
            WeightFormat::Dense => self.dense(dtype),
            WeightFormat::Bf16 => {
                self.dense(DType::BF16)
                    + self.kernel_bytes
                    + self.requantized_values(GgmlDType::Q8_0)
            }
            WeightFormat::Q8_0 => requantized(GgmlDType::Q8_0),
            WeightFormat::Q4_0 => requantized(GgmlDType::Q4_0),
            WeightFormat::Mixed => self.dense(dtype) + requantized(GgmlDType::Q8_0),
        }
    }
}

/// The format to build `bytes` of weights in under `build`'s budget. `auto` takes the first
/// that fits of: dense f32 beside the stored blocks (on CPU), as stored with candle's repacked
/// copy, compact. A format
/// whose weights do not fit is refused, the error naming what they need.
pub fn fit(build: &BuildOptions, bytes: &WeightBytes) -> Result<WeightFormat, String> {
    let Some(budget) = build.memory_budget else {
        return Ok(build.format);
    };
    let need = |format| bytes.need(format, build.dtype, &build.device);
    let format = match build.format {
        WeightFormat::Auto => [WeightFormat::Auto, WeightFormat::AsStored]
            .into_iter()
            .find(|&f| need(f) <= budget)
            .unwrap_or(WeightFormat::Compact),
        format => format,
    };
    if need(format) <= budget {
        return Ok(format);
    }
    let compact = need(WeightFormat::Compact);
    let what = match format {
        WeightFormat::Compact => "even as stored".to_string(),
        format => format!("with `weights = \"{}\"`", format.name()),
    };
    let hint = if compact <= budget {
        format!("; `weights = \"compact\"` needs {}", human(compact))
    } else {
        String::new()
    };
    Err(format!(
        "the weights need {} {what}, more than option `memory_budget` allows ({}); raise \
         `memory_budget` (its default, \"auto\", is half of the available memory){hint}",
        human(need(format)),
        human(budget),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        let bytes = |t: &str| match MemoryBudget::parse(t) {
            Some(MemoryBudget::Bytes(n)) => Some(n),
            _ => None,
        };
        assert_eq!(MemoryBudget::parse("auto"), Some(MemoryBudget::Auto));
        assert_eq!(bytes("123"), Some(123));
        assert_eq!(bytes("8GiB"), Some(8 << 30));
        assert_eq!(bytes("512 MiB"), Some(512 << 20));
        assert_eq!(bytes("1.5gb"), Some(1_500_000_000));
        for bad in ["", "0", "GiB", "8 GiBs", "-1", "1e9", "auto8"] {
            assert_eq!(MemoryBudget::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn auto_on_cpu_is_half_the_available_memory() {
        let cpu = MemoryBudget::Auto.bytes_on(&Device::Cpu).unwrap();
        match available_memory() {
            // Tests running beside this one move the available memory between the two reads
            // (by a megabyte in one CI run); a budget of a quarter or the whole would be off
            // by half of it.
            Some(n) => assert!(cpu.abs_diff(n / 2) <= n / 100, "{cpu} against {}", n / 2),
            None => assert_eq!(cpu, FALLBACK_BYTES),
        }
        assert_eq!(MemoryBudget::Bytes(7).bytes_on(&Device::Cpu), Some(7));
    }

    fn build(format: WeightFormat, budget: u64) -> BuildOptions {
        BuildOptions {
            dtype: DType::F32,
            device: Device::Cpu,
            format,
            attention: crate::attention::resolve("eager").unwrap(),
            max_context: 16,
            memory_budget: Some(budget),
            kv_dtype: DType::F32,
        }
    }

    #[test]
    fn auto_dequantizes_only_within_the_budget() {
        let mut bytes = WeightBytes::default();
        bytes.add(GgmlDType::Q4_0, 1024); // 32 blocks of 18 bytes: 576 B; 4 KiB as f32
        bytes.add(GgmlDType::F32, 16); // 64 B either way
        let fit = |format, budget| fit(&build(format, budget), &bytes);
        // f32 for prefill (4160) and the stored blocks for decode (576).
        assert_eq!(fit(WeightFormat::Auto, 4736), Ok(WeightFormat::Auto));
        // As stored with candle's repacked copy: 576 * 2.6 + 64 = 1561.
        assert_eq!(fit(WeightFormat::Auto, 4735), Ok(WeightFormat::AsStored));
        assert_eq!(fit(WeightFormat::Auto, 1561), Ok(WeightFormat::AsStored));
        assert_eq!(fit(WeightFormat::Auto, 1560), Ok(WeightFormat::Compact));
        assert_eq!(fit(WeightFormat::Auto, 640), Ok(WeightFormat::Compact));
        let err = fit(WeightFormat::Auto, 639).unwrap_err();
        assert!(
            err.contains("640 B even as stored") && err.contains("639 B"),
            "{err}"
        );
        // bf16 for prefill (2080) and the stored blocks for decode (576).
        assert_eq!(fit(WeightFormat::Bf16, 2656), Ok(WeightFormat::Bf16));
        let err = fit(WeightFormat::Bf16, 2655).unwrap_err();
        assert!(err.contains("2.59 KiB with `weights = \"bf16\"`"), "{err}");
        let err = fit(WeightFormat::Dense, 1000).unwrap_err();
        assert!(
            err.contains("f32") && err.contains("`weights = \"compact\"` needs 640 B"),
            "{err}"
        );
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(1000), "1000 B");
        assert_eq!(human(3 << 29), "1.50 GiB");
    }
}
