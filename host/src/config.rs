//! The TOML config. Every table refuses unknown keys, and an error names the file, line, column
//! and key.

use std::path::{Path, PathBuf};

use lmhost_plugin_api::{GenerationConfig, KvCacheSettings};
use serde::Deserialize;

use crate::error::{Error, Result};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub backend: BackendConfig,
    #[serde(default)]
    pub generation: GenerationConfig,
    #[serde(default)]
    pub kv_cache: KvCacheConfig,
    #[serde(default)]
    pub explanation: ExplanationConfig,
    /// Searched first for plugin libraries; relative paths are relative to the config file.
    #[serde(default)]
    pub plugin_dirs: Vec<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// The plugin's name: `mock` loads `liblmhost_mock.so`.
    pub kind: String,
    #[serde(default)]
    pub model_id: String,
    #[serde(default)]
    pub options: toml::Table,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvCacheConfig {
    pub enabled: bool,
    pub max_entries: u64,
    /// 0 means no byte budget.
    pub max_bytes: u64,
}

impl Default for KvCacheConfig {
    fn default() -> Self {
        KvCacheConfig {
            enabled: true,
            max_entries: 256,
            max_bytes: 2 << 30,
        }
    }
}

impl From<KvCacheConfig> for KvCacheSettings {
    fn from(c: KvCacheConfig) -> Self {
        KvCacheSettings {
            enabled: c.enabled,
            max_entries: c.max_entries,
            max_bytes: c.max_bytes,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExplanationConfig {
    /// Passed to the plugin through `PluginContext::plugin_options`.
    #[serde(default)]
    pub plugin_options: toml::Table,
}

impl Config {
    /// Reads and parses `path`; relative paths inside it resolve against its directory.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Self::parse(&text, path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.resolve_paths(base);
        Ok(config)
    }

    /// Parses config text; `path` only names the source in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let (line, column) = e
                .span()
                .map(|span| line_column(text, span.start))
                .unwrap_or((0, 0));
            Error::Config {
                path: path.to_path_buf(),
                line,
                column,
                message: e.message().to_string(),
            }
        })?;
        config.generation.validate().map_err(|e| Error::Config {
            path: path.to_path_buf(),
            line: 0,
            column: 0,
            message: format!("[generation] {}", e.message),
        })?;
        Ok(config)
    }

    fn resolve_paths(&mut self, base: &Path) {
        for dir in &mut self.plugin_dirs {
            if dir.is_relative() {
                *dir = base.join(&*dir);
            }
        }
        // A model path written relative to the config file; hub ids never exist on disk.
        let local = base.join(&self.backend.model_id);
        if !self.backend.model_id.is_empty()
            && Path::new(&self.backend.model_id).is_relative()
            && local.exists()
        {
            self.backend.model_id = local.to_string_lossy().into_owned();
        }
    }
}

/// 1-based line and column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// A TOML table as a JSON object, the form options cross the plugin boundary in.
pub fn table_to_json(table: &toml::Table) -> serde_json::Map<String, serde_json::Value> {
    serde_json::to_value(table)
        .ok()
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config> {
        Config::parse(text, Path::new("test.toml"))
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let config = parse("[backend]\nkind = \"mock\"\n").unwrap();
        assert_eq!(config.backend.kind, "mock");
        assert!(config.kv_cache.enabled);
        assert_eq!(config.generation, GenerationConfig::default());
    }

    #[test]
    fn unknown_key_names_line_column_and_key() {
        let err =
            parse("[backend]\nkind = \"mock\"\n\n[generation]\nmax_tokens = 3\n").unwrap_err();
        let Error::Config {
            line,
            column,
            message,
            ..
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!((*line, *column), (5, 1), "{err}");
        assert!(message.contains("max_tokens"), "{err}");
        assert!(err.to_string().starts_with("test.toml:5:1:"), "{err}");
    }

    #[test]
    fn wrong_type_is_located() {
        let err = parse("[backend]\nkind = \"mock\"\n[kv_cache]\nenabled = \"yes\"\n").unwrap_err();
        assert!(err.to_string().starts_with("test.toml:4:"), "{err}");
    }

    #[test]
    fn out_of_range_generation_setting_names_field() {
        let err = parse("[backend]\nkind = \"mock\"\n[generation]\ntop_p = 1.5\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("`top_p` must be > 0 and <= 1. Given: 1.5"),
            "{err}"
        );
    }

    #[test]
    fn options_become_json() {
        let config =
            parse("[backend]\nkind = \"mock\"\n[backend.options]\nreply_words = 3\n").unwrap();
        let json = table_to_json(&config.backend.options);
        assert_eq!(json["reply_words"], 3);
    }
}
