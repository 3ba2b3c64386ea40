//! An image file's bytes (PNG, JPEG, WebP, GIF): RGB pixels, or an error naming the problem.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = lmhost::images::decode(data, std::path::Path::new("fuzz.png"), "image");
});
