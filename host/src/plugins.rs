//! Finding and loading plugins: libraries on disk by name, or root modules registered in-process.
//!
//! Libraries are never unloaded: a plugin may leave thread-local destructors or other state
//! behind that points into its code, so `dlclose` would be unsafe. Each is loaded once per
//! process and kept.

use std::collections::BTreeMap;
use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use lmhost_plugin_api::abi_stable::library::{
    lib_header_from_raw_library, LibraryError, RawLibrary,
};
use lmhost_plugin_api::identity::{IdentityFn, IDENTITY_MAGIC, IDENTITY_SYMBOL};
use lmhost_plugin_api::{OptionSpec, PluginModRef, API_VERSION};

use crate::error::{Error, Incompatible, Result};
use crate::runtime_libraries;

/// Where a plugin came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Library(PathBuf),
    InProcess,
}

/// A plugin ready to make backends.
#[derive(Clone, Copy)]
pub struct Plugin {
    module: PluginModRef,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Plugin({} {})", self.name(), self.version())
    }
}

impl Plugin {
    pub fn name(&self) -> String {
        self.module.name().to_string()
    }

    pub fn version(&self) -> String {
        self.module.version().to_string()
    }

    pub fn api_version(&self) -> String {
        self.module.api_version().to_string()
    }

    pub fn options(&self) -> Vec<OptionSpec> {
        (self.module.options())().into_vec()
    }

    pub(crate) fn module(&self) -> PluginModRef {
        self.module
    }
}

/// Plugins registered in-process plus the directories searched for libraries.
#[derive(Default)]
pub struct Registry {
    in_process: Vec<PluginModRef>,
    loaded: Mutex<BTreeMap<PathBuf, PluginModRef>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes a backend type selectable by its name with no library; it takes precedence over a
    /// library of the same name.
    pub fn register(&mut self, module: PluginModRef) {
        self.in_process.push(module);
    }

    /// Finds the plugin `name`: in-process first, then `lib{lmhost_name}.so` in `dirs`, in order.
    pub fn find(&self, name: &str, dirs: &[PathBuf]) -> Result<(Plugin, Origin)> {
        if let Some(module) = self.in_process.iter().find(|m| m.name().as_str() == name) {
            return Ok((Plugin { module: *module }, Origin::InProcess));
        }
        let file = library_file_name(name);
        if let Some(path) = dirs.iter().map(|d| d.join(&file)).find(|p| p.is_file()) {
            let plugin = self.load(&path)?;
            return Ok((plugin, Origin::Library(path)));
        }
        let mut found: Vec<String> = self
            .in_process
            .iter()
            .map(|m| m.name().to_string())
            .collect();
        found.extend(
            dirs.iter()
                .flat_map(|d| library_files(d))
                .map(|p| format!("{} ({})", plugin_name_of(&p), p.display())),
        );
        Err(Error::PluginNotFound {
            name: name.to_string(),
            searched: dirs.to_vec(),
            found,
        })
    }

    /// Every plugin in-process and in `dirs`, first one of each name winning; libraries that fail
    /// to load are reported beside them.
    pub fn discover(&self, dirs: &[PathBuf]) -> (Vec<(Plugin, Origin)>, Vec<Error>) {
        let mut plugins: Vec<(Plugin, Origin)> = self
            .in_process
            .iter()
            .map(|m| (Plugin { module: *m }, Origin::InProcess))
            .collect();
        let mut errors = Vec::new();
        for path in dirs.iter().flat_map(|d| library_files(d)) {
            let file = path.file_name().unwrap_or_default().to_string_lossy();
            if plugins
                .iter()
                .any(|(p, _)| library_file_name(&p.name()) == file)
            {
                continue;
            }
            match self.load(&path) {
                Ok(plugin) => plugins.push((plugin, Origin::Library(path))),
                Err(e) => errors.push(e),
            }
        }
        (plugins, errors)
    }

    /// Loads the library at `path` once, checking its identity, then its ABI layout.
    pub fn load(&self, path: &Path) -> Result<Plugin> {
        let path = path.canonicalize().map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(module) = loaded.get(&path) {
            return Ok(Plugin { module: *module });
        }
        let module = load_library(&path)?;
        loaded.insert(path, module);
        Ok(Plugin { module })
    }
}

fn load_library(path: &Path) -> Result<PluginModRef> {
    let not_a_plugin = |detail: String| Error::NotAPlugin {
        path: path.to_path_buf(),
        detail,
    };
    let library = open(path)?;
    // SAFETY: the symbol's type is frozen (see `identity`) and checked by its magic number.
    let identity = unsafe { library.get::<IdentityFn>(IDENTITY_SYMBOL) }
        .map(|f| f())
        .map_err(|_| not_a_plugin("it exports no `lmhost_plugin_identity`".into()))?;
    if identity.magic != IDENTITY_MAGIC {
        return Err(not_a_plugin(
            "its identity symbol has the wrong magic number".into(),
        ));
    }
    // SAFETY: the library stays loaded for the life of the process (it is leaked below).
    let (name, api_version) = unsafe {
        (
            identity.name.to_string_lossy(),
            identity.api_version.to_string_lossy(),
        )
    };
    let incompatible = |reason: &str, report: String| {
        Error::IncompatiblePlugin(Box::new(Incompatible {
            path: path.to_path_buf(),
            name: name.clone(),
            api_version: api_version.clone(),
            host_api_version: API_VERSION.to_string(),
            reason: reason.to_string(),
            report,
        }))
    };
    if !api_compatible(&api_version, API_VERSION) {
        return Err(incompatible("the API versions differ", String::new()));
    }
    // SAFETY: as above; abi_stable checks the root module's layout before handing it out.
    let header = unsafe { lib_header_from_raw_library(&library) }
        .map_err(|e| not_a_plugin(e.to_string()))?;
    let module = header
        .init_root_module::<PluginModRef>()
        .map_err(|e| match e {
            LibraryError::AbiInstability(report) => {
                incompatible("its ABI layout differs from the host's", report.to_string())
            }
            LibraryError::IncompatibleVersionNumber { .. } => {
                incompatible("the API versions differ", e.to_string())
            }
            other => not_a_plugin(other.to_string()),
        })?;
    std::mem::forget(library);
    Ok(module)
}

/// Opens the library at `path`, first loading from Python's wheels each library it links that
/// the dynamic loader does not find ([`runtime_libraries`]).
fn open(path: &Path) -> Result<RawLibrary> {
    let mut wheel_dirs = None;
    let mut preloaded: Vec<String> = Vec::new();
    loop {
        let message = match RawLibrary::load_at(path) {
            Ok(library) => return Ok(library),
            Err(e) => e.to_string(),
        };
        let missing = runtime_libraries::missing_library(&message)
            .filter(|name| !preloaded.iter().any(|p| p == name));
        let Some(name) = missing else {
            return Err(Error::NotAPlugin {
                path: path.to_path_buf(),
                detail: message,
            });
        };
        let dirs = wheel_dirs.get_or_insert_with(runtime_libraries::wheel_dirs);
        let missing_library = |detail| Error::MissingLibrary {
            path: path.to_path_buf(),
            library: name.to_string(),
            detail,
        };
        match runtime_libraries::preload(name, dirs) {
            Some(Ok(found)) => tracing::debug!("loaded {} for {}", found.display(), path.display()),
            Some(Err(e)) => return Err(missing_library(e)),
            None => return Err(missing_library(runtime_libraries::not_found(name, dirs))),
        }
        preloaded.push(name.to_string());
    }
}

/// Semver compatibility: same major, and for 0.x the same minor.
fn api_compatible(plugin: &str, host: &str) -> bool {
    let key = |v: &str| {
        let mut parts = v.split('.').map(|p| p.parse::<u64>().ok());
        match (parts.next().flatten(), parts.next().flatten()) {
            (Some(0), Some(minor)) => Some((0, minor)),
            (Some(major), Some(_)) => Some((major, 0)),
            _ => None,
        }
    };
    key(plugin).is_some() && key(plugin) == key(host)
}

/// `mock` → `liblmhost_mock.so` (with the platform's prefix and suffix).
pub fn library_file_name(name: &str) -> String {
    format!("{DLL_PREFIX}lmhost_{}{DLL_SUFFIX}", name.replace('-', "_"))
}

fn plugin_name_of(path: &Path) -> String {
    let file = path.file_name().unwrap_or_default().to_string_lossy();
    file.trim_start_matches(DLL_PREFIX)
        .trim_start_matches("lmhost_")
        .trim_end_matches(DLL_SUFFIX)
        .to_string()
}

/// Library files in `dir` named like lmhost plugins, sorted.
fn library_files(dir: &Path) -> Vec<PathBuf> {
    let prefix = format!("{DLL_PREFIX}lmhost_");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with(&prefix) && name.ends_with(DLL_SUFFIX)
        })
        .collect();
    files.sort();
    files
}

/// The search path: the config's `plugin_dirs`, `LMHOST_PLUGIN_PATH`, the executable's
/// directory, then its `../lib/lmhost`.
pub fn search_dirs(config_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = config_dirs.to_vec();
    if let Some(paths) = std::env::var_os("LMHOST_PLUGIN_PATH") {
        dirs.extend(std::env::split_paths(&paths).filter(|p| !p.as_os_str().is_empty()));
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        dirs.push(exe_dir.join("..").join("lib").join("lmhost"));
        dirs.insert(dirs.len() - 1, exe_dir);
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_versions_compare_by_semver() {
        assert!(api_compatible("0.1.0", "0.1.3"));
        assert!(!api_compatible("0.2.0", "0.1.0"));
        assert!(api_compatible("1.2.0", "1.0.0"));
        assert!(!api_compatible("2.0.0", "1.0.0"));
        assert!(!api_compatible("garbage", "0.1.0"));
    }

    #[test]
    fn library_names_follow_the_platform() {
        let file = library_file_name("my-backend");
        assert_eq!(file, format!("{DLL_PREFIX}lmhost_my_backend{DLL_SUFFIX}"));
        assert_eq!(plugin_name_of(Path::new(&file)), "my_backend");
    }
}
