//! A GGUF header and its metadata from arbitrary bytes: an error or a value, never a crash or
//! an allocation beyond what the bytes hold.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lmhost_plugin_kit::gguf::Metadata;

fuzz_target!(|data: &[u8]| {
    let _ = Metadata::from_reader(&mut &data[..]);
});
