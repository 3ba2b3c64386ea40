//! The ONNX Runtime library, loaded at run time (`ort`'s `load-dynamic`): nothing is downloaded
//! at build time, and users bring the library their platform and accelerator need.
//!
//! ONNX Runtime allows one library and one environment per process, so the first backend that
//! loads it decides which; a later backend naming another library is refused, naming both.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use lmhost_plugin_api::PluginError;
use ort::environment::Environment;

/// The library loaded in this process and its environment.
struct Loaded {
    path: PathBuf,
    env: Environment,
}

static RUNTIME: Mutex<Option<Loaded>> = Mutex::new(None);

/// The library name the system loader searches for when neither the option nor
/// `ORT_DYLIB_PATH` names a file.
fn default_name() -> String {
    format!(
        "{}onnxruntime{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

const INSTALL: &str = "install ONNX Runtime (`pip install onnxruntime` carries it as \
     onnxruntime/capi/libonnxruntime.so.<version>; `scripts/setup-onnx` puts one in \
     models/onnxruntime/) and name it with the `ort_library` option or ORT_DYLIB_PATH";

/// Where to load the library from: the `ort_library` option, else `ORT_DYLIB_PATH`, else the
/// system loader's search for `libonnxruntime.so`; with where that choice came from.
pub fn library_path(option: Option<&str>) -> (PathBuf, &'static str) {
    if let Some(path) = option.filter(|p| !p.is_empty()) {
        return (PathBuf::from(path), "option `ort_library`");
    }
    match std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        Some(path) => (PathBuf::from(path), "ORT_DYLIB_PATH"),
        None => (
            PathBuf::from(default_name()),
            "the system library path (neither `ort_library` nor ORT_DYLIB_PATH is set)",
        ),
    }
}

/// Runs `f` with this process's ONNX Runtime environment, loading the library first if no
/// backend has yet.
pub fn with_environment<T>(
    option: Option<&str>,
    f: impl FnOnce(&Environment) -> Result<T, PluginError>,
) -> Result<T, PluginError> {
    let (path, source) = library_path(option);
    // A relative name with a directory would be resolved against the executable's directory.
    let path = if path.components().count() > 1 {
        std::path::absolute(&path).unwrap_or(path)
    } else {
        path
    };
    let mut runtime = RUNTIME
        .lock()
        .map_err(|_| PluginError::internal("onnx runtime lock poisoned by an earlier panic"))?;
    if let Some(loaded) = runtime.as_ref() {
        if !same_library(&loaded.path, &path) {
            return Err(PluginError::config(format!(
                "ONNX Runtime is already loaded from {} in this process; {source} names {}, \
                 and a process can load only one ONNX Runtime library",
                loaded.path.display(),
                path.display()
            )));
        }
        return f(&loaded.env);
    }
    let env = load(&path, source)?;
    let loaded = runtime.insert(Loaded { path, env });
    f(&loaded.env)
}

fn load(path: &Path, source: &str) -> Result<Environment, PluginError> {
    if path.components().count() > 1 && !path.is_file() {
        return Err(PluginError::unavailable(format!(
            "no ONNX Runtime library at {} (from {source}): {INSTALL}",
            path.display()
        )));
    }
    let builder = ort::init_from(path).map_err(|e| {
        PluginError::unavailable(format!(
            "cannot load ONNX Runtime from {} (from {source}): {e}. Expected the ONNX Runtime \
             shared library, version 1.{} or newer: {INSTALL}",
            path.display(),
            ort::MINOR_VERSION
        ))
    })?;
    builder
        .with_name("lmhost")
        .build()
        .map_err(|e| PluginError::unavailable(format!("ONNX Runtime environment: {e}")))
}

fn same_library(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}
