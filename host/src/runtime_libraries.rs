//! The shared libraries a plugin links that the dynamic loader cannot find: a plugin built with
//! CUDA links cuBLAS, cuRAND, NVRTC and the CUDA runtime, which GPU hosts often have only as
//! Python's `nvidia-*` wheels (what PyTorch and JAX install).
//!
//! The search order, first hit wins: `LD_LIBRARY_PATH` and the system's library paths (the
//! loader's own search), then each Python environment's `site-packages/nvidia/*/lib`: the active
//! virtual environment (`VIRTUAL_ENV`), the conda one (`CONDA_PREFIX`), the prefix above the
//! executable, `~/.local`, `/usr/local`, `/usr`. A library found there is loaded first, globally,
//! so that the plugin's own load finds it loaded under its soname.

use std::path::{Path, PathBuf};

/// What the loader said it could not open, if that is what stopped a load: dlerror's
/// "libcublas.so.13: cannot open shared object file: ..." names the soname first.
pub fn missing_library(message: &str) -> Option<&str> {
    let (before, _) = message.split_once(": cannot open shared object file")?;
    let name = before
        .rsplit(|c: char| c.is_whitespace() || matches!(c, ':' | '\'' | '"'))
        .next()?;
    (!name.is_empty()).then_some(name)
}

/// The Python environments' `nvidia/*/lib` folders, in search order.
pub fn wheel_dirs() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    if let Ok(exe) = std::env::current_exe() {
        prefixes.extend(exe.parent().and_then(Path::parent).map(Path::to_path_buf));
    }
    prefixes.extend(std::env::var_os("HOME").map(|home| Path::new(&home).join(".local")));
    prefixes.extend(["/usr/local", "/usr"].map(PathBuf::from));
    let mut dirs = Vec::new();
    for prefix in prefixes {
        for dir in wheel_dirs_under(&prefix) {
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

/// `prefix/lib/python3*/{site,dist}-packages/nvidia/*/lib`, sorted.
fn wheel_dirs_under(prefix: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = children(&prefix.join("lib"))
        .filter(|p| file_name(p).starts_with("python3"))
        .flat_map(|python| {
            ["site-packages", "dist-packages"].map(|s| python.join(s).join("nvidia"))
        })
        .flat_map(|nvidia| children(&nvidia).map(|package| package.join("lib")))
        .filter(|lib| lib.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn children(dir: &Path) -> impl Iterator<Item = PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// Loads `name` from the first of `dirs` that holds it, globally and for the life of the
/// process; the path loaded, or None where no folder holds it.
pub fn preload(name: &str, dirs: &[PathBuf]) -> Option<Result<PathBuf, String>> {
    let path = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file())?;
    Some(open_globally(&path).map(|()| path))
}

#[cfg(unix)]
fn open_globally(path: &Path) -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: a library's initializers run; the ones searched for are vendors' runtime
    // libraries, loaded as the plugin that links them would load them.
    let library =
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| e.to_string())?;
    // Never unloaded: the plugin about to load binds to its symbols.
    std::mem::forget(library);
    Ok(())
}

#[cfg(not(unix))]
fn open_globally(path: &Path) -> Result<(), String> {
    Err(format!(
        "{} found, but loading a plugin's libraries from Python's wheels is done only on Unix",
        path.display()
    ))
}

/// Why `name` was not found, where it was looked for, and what to do.
pub fn not_found(name: &str, dirs: &[PathBuf]) -> String {
    let searched = match dirs {
        [] => "none exists here".to_string(),
        dirs => dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!(
        "neither the dynamic loader (LD_LIBRARY_PATH, the system's library paths) nor a Python \
         environment's nvidia/*/lib ({searched}) has it; {}",
        hint(name)
    )
}

/// What to do about `name`, which no folder of the search holds.
fn hint(name: &str) -> &'static str {
    if name.starts_with("libcuda.so") {
        "it is the NVIDIA driver's own library: this plugin was built with CUDA and runs only \
         where an NVIDIA driver is installed; on this machine use a build without the `cuda` \
         feature"
    } else {
        "install the Python wheel that ships it (CUDA 13's: `pip install nvidia-cuda-runtime \
         nvidia-cublas nvidia-curand nvidia-cuda-nvrtc`) or add its folder to LD_LIBRARY_PATH"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_soname_is_read_from_dlerror() {
        // abi_stable puts the loader's message on a line of its own.
        let message =
            "Could not open library at:\n\t/opt/liblmhost_candle.so\nbecause:\n\tlibcublas.so.13: \
                       cannot open shared object file: No such file or directory";
        assert_eq!(missing_library(message), Some("libcublas.so.13"));
        assert_eq!(missing_library("undefined symbol: cuInit"), None);
    }

    /// The driver's library gets its own advice: no wheel ships it.
    #[test]
    fn a_missing_driver_is_named_as_the_driver() {
        let dirs = [PathBuf::from(
            "/venv/lib/python3.12/site-packages/nvidia/cu13/lib",
        )];
        let driver = not_found("libcuda.so.1", &dirs);
        assert!(
            driver.contains("NVIDIA driver") && driver.contains("cu13/lib"),
            "{driver}"
        );
        let wheel = not_found("libcublas.so.13", &[]);
        assert!(
            wheel.contains("pip install") && wheel.contains("none exists"),
            "{wheel}"
        );
    }

    #[test]
    fn wheel_folders_are_found_under_a_prefix() {
        let root = tempfile::tempdir().unwrap();
        for package in ["cu13", "cublas"] {
            let lib = root
                .path()
                .join(format!("lib/python3.12/site-packages/nvidia/{package}/lib"));
            std::fs::create_dir_all(lib).unwrap();
        }
        // Not a wheel's library folder: no `lib` inside.
        std::fs::create_dir_all(
            root.path()
                .join("lib/python3.12/site-packages/nvidia/empty"),
        )
        .unwrap();
        let found = wheel_dirs_under(root.path());
        let names: Vec<String> = found
            .iter()
            .map(|p| p.strip_prefix(root.path()).unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "lib/python3.12/site-packages/nvidia/cu13/lib",
                "lib/python3.12/site-packages/nvidia/cublas/lib"
            ]
        );
    }
}
