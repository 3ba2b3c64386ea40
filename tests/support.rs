//! Helpers for the integration tests: where the built plugin libraries are, and configs that
//! point at them.

use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lmhost::Config;

/// The test fixture plugins, built as `fixture_<name>` libraries so that no search for real
/// plugins finds them.
const FIXTURES: [&str; 2] = ["faulty", "incompatible"];

/// The directory cargo put the plugin libraries in: the test binary's own (`target/<profile>/deps`).
pub fn plugin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    exe.parent()
        .expect("the test binary has a directory")
        .to_path_buf()
}

/// A directory beside the built libraries holding the fixture plugins under the names a plugin
/// search looks for (`liblmhost_faulty.so`): links to where cargo built them, made once and
/// shared by every test process (no copy per process left behind).
pub fn fixture_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = plugin_dir().join("fixture-plugins");
        std::fs::create_dir_all(&dir).expect("a directory for the fixtures");
        for name in FIXTURES {
            let built = plugin_dir().join(format!("{DLL_PREFIX}fixture_{name}{DLL_SUFFIX}"));
            let as_plugin = dir.join(lmhost::plugins::library_file_name(name));
            link(&built, &as_plugin).unwrap_or_else(|e| panic!("{}: {e}", built.display()));
        }
        dir
    })
    .clone()
}

/// `link` names `target` from now on; another test process making the same link at the same
/// time is no error.
fn link(target: &Path, link: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    let made = match std::os::unix::fs::symlink(target, link) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        made => made,
    };
    #[cfg(not(unix))]
    let made = std::fs::copy(target, link).map(drop);
    made
}

/// A config for plugin `kind` with `extra` TOML appended, searching only [`plugin_dir`] and
/// [`fixture_dir`].
pub fn config(kind: &str, extra: &str) -> Config {
    let text = format!(
        "plugin_dirs = [{:?}, {:?}]\n[backend]\nkind = {kind:?}\nmodel_id = \"test-model\"\n{extra}",
        plugin_dir(),
        fixture_dir()
    );
    Config::parse(&text, "test.toml".as_ref()).expect("test config parses")
}
