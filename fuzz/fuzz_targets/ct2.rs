//! A CTranslate2 `model.bin` from arbitrary bytes: an error or its variables, never a crash or
//! an allocation beyond what the bytes hold.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lmhost_plugin_kit::ct2;

fuzz_target!(|data: &[u8]| {
    let _ = ct2::parse(data);
});
