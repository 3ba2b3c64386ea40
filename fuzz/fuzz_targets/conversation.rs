//! A conversation file's JSON (with its audio, image and region parts): a conversation or an
//! error naming what was wrong.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = lmhost::conversation::parse_with_regions(&text, std::path::Path::new("/nonexistent/c.json"));
});
