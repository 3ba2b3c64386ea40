//! A safetensors file from arbitrary bytes, through the `safetensors` crate that candle reads
//! every checkpoint with (the version lmhost locks): an error or its tensors' views, never a
//! crash or an allocation beyond what the bytes hold.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(tensors) = safetensors::SafeTensors::deserialize(data) {
        for (_, view) in tensors.tensors() {
            let _ = view.data().len();
        }
    }
});
