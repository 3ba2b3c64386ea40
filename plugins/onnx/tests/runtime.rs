//! Finding and loading the ONNX Runtime library. A test binary of its own: the library is loaded
//! once per process, and these tests need a process that has not loaded it yet.

use std::path::PathBuf;

use lmhost_onnx::Onnx;
use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::{Backend, ErrorKind, PluginContext, PluginError};

fn open(library: &str) -> Result<Onnx, PluginError> {
    let context = PluginContext::new("onnx", "models/smollm2-onnx")
        .with_options(json!({ "ort_library": library }));
    Onnx::new(context)
}

#[test]
fn a_missing_or_wrong_library_is_named_with_how_to_install_one() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("libonnxruntime.so.1.32.0");
    let err = open(&missing.to_string_lossy()).err().unwrap();
    assert_eq!(err.kind, ErrorKind::BackendUnavailable);
    for part in [
        &*missing.to_string_lossy(),
        "option `ort_library`",
        "pip install onnxruntime",
    ] {
        assert!(err.message.contains(part), "{part:?} in {}", err.message);
    }

    let not_a_library = dir.path().join("libonnxruntime.so");
    std::fs::write(&not_a_library, "not an ELF file").unwrap();
    let err = open(&not_a_library.to_string_lossy()).err().unwrap();
    assert!(
        err.message.contains("cannot load ONNX Runtime from")
            && err.message.contains(&*not_a_library.to_string_lossy()),
        "{}",
        err.message
    );

    // Then the real one loads, and another library is refused: one per process.
    let real = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/onnxruntime/libonnxruntime.so.1.32.0");
    assert!(
        real.is_file(),
        "{} is missing: run scripts/setup-onnx",
        real.display()
    );
    open(&real.to_string_lossy()).unwrap();
    let err = open(&not_a_library.to_string_lossy()).err().unwrap();
    assert!(
        err.message.contains("already loaded from"),
        "{}",
        err.message
    );
}
