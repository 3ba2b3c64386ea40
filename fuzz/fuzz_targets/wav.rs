//! A WAV file's bytes: samples, or an error naming the problem.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = lmhost::audio::decode_wav(data, std::path::Path::new("fuzz.wav"));
});
