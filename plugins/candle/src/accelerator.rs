//! What the driver says of a CUDA device: its compute capability, which decides whether candle
//! has bf16 kernels for it, and its free memory, of which `memory_budget = "auto"` takes half.
//! Off CUDA (or in a build without the `cuda` feature) neither is known.

use candle_core::Device;

/// The first compute capability candle builds bf16 kernels for (Ampere).
pub const BF16_SINCE: (i32, i32) = (8, 0);

/// The device's compute capability, (major, minor).
#[cfg(feature = "cuda")]
pub fn compute_capability(device: &Device) -> Option<(i32, i32)> {
    match device {
        Device::Cuda(d) => d.cuda_stream().context().compute_capability().ok(),
        _ => None,
    }
}

#[cfg(not(feature = "cuda"))]
pub fn compute_capability(_: &Device) -> Option<(i32, i32)> {
    None
}

/// The device memory free now, in bytes.
#[cfg(feature = "cuda")]
pub fn free_memory(device: &Device) -> Option<u64> {
    match device {
        Device::Cuda(d) => d
            .cuda_stream()
            .context()
            .mem_get_info()
            .ok()
            .map(|(free, _total)| free as u64),
        _ => None,
    }
}

#[cfg(not(feature = "cuda"))]
pub fn free_memory(_: &Device) -> Option<u64> {
    None
}

/// Whether candle computes in bf16 on `device`: everywhere but a CUDA GPU older than Ampere.
pub fn supports_bf16(device: &Device) -> bool {
    compute_capability(device).is_none_or(|cap| cap >= BF16_SINCE)
}
