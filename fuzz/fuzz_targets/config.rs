//! A TOML config: a config that validates, or an error naming the key.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(config) = lmhost::Config::parse(&text, std::path::Path::new("fuzz.toml")) {
        let _ = config.explanation.validate();
    }
});
