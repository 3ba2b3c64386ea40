//! The TOML config. Every table refuses unknown keys, and an error names the file, line, column
//! and key.

use std::path::{Path, PathBuf};

use lmhost_plugin_api::{GenerationConfig, KvCacheSettings, Role};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::explain::{
    Absence, AbsenceKind, AudioPlayers, Estimand, EstimatorKind, EstimatorSettings, Fill,
    Granularity, ImagePlayers, ImageRegions, InteractionIndex, Interactions, MediaSpec, Normalizer,
    PlayerSpec, Stopping, ValueKind,
};

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

/// `[explanation]`: how `lmhost explain` attributes an answer. Every key has a flag of the same
/// name (`max_exact_players` is `--max-exact-players`) that overrides it.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExplanationConfig {
    /// `"messages"`, `"sentences"`, `"words"` or `"auto"` (messages, then the strongest
    /// refined level by level; see [`crate::explain::hierarchy`]).
    pub players: Granularity,
    /// With `players = "auto"`: players refined at each level (1 to 4).
    pub refine_top: usize,
    /// With `players = "auto"`: `"sentences"` or `"words"`, the finest level refined to.
    pub refine_to: Granularity,
    /// Only messages of these roles hold players; empty means all.
    pub roles: Vec<Role>,
    /// Only these turns hold players (0 first, -1 last); empty means all.
    pub turns: Vec<i64>,
    /// `"delete"`, `"pad"`, `"neutral"` or `"hide"`.
    pub absence: AbsenceKind,
    /// What replaces an absent player with `absence = "pad"`; with `"neutral"`, the one
    /// character repeated over its width.
    pub placeholder: String,
    /// `"whole"` (an image goes with its message), `"grid"` (`grid` cells) or `"regions"` (the
    /// boxes the conversation gives each image: `"regions"` on its image parts).
    pub image_players: ImagePlayers,
    /// With `image_players = "grid"`: `[rows, columns]`.
    pub grid: [u32; 2],
    /// `"gray"`, `"mean"` or `"blur"`: what an absent image region is painted with.
    pub fill: Fill,
    /// `"whole"` (a clip goes with its message), `"windows"` (`audio_window` seconds each) or
    /// `"pauses"` (the stretches between pauses); an absent segment is silenced.
    pub audio_players: AudioPlayers,
    /// With `audio_players = "windows"`: each window's length in seconds.
    pub audio_window: f64,
    /// The image regions of the conversation being explained; the CLI and Python read them
    /// from its image parts, a library caller sets them. Not a setting of its own (a value is
    /// keyed by its prompt, whose painted pixels already say which regions were absent).
    #[serde(skip)]
    pub regions: Vec<ImageRegions>,
    /// `"answer_logprob"`, `"generated_logprob"`, `"embedding_cosine"` or `"tfidf_cosine"`.
    pub value: ValueKind,
    /// Logprob values per token instead of summed.
    pub value_mean: bool,
    /// `"exact"`, `"permutation"`, `"antithetic"`, `"msr"`, `"loo"`, `"kernel"` or `"lasso"`.
    pub estimator: EstimatorKind,
    /// `"shapley"` or `"banzhaf"`.
    pub estimand: Estimand,
    /// Coalition evaluations a sampling estimator may plan.
    pub budget: usize,
    /// Seed of the sampling estimators.
    pub seed: u64,
    /// Random coalitions a sampled (not `exact`) run also evaluates, to report how well the
    /// attribution predicts them; 0 turns this off.
    pub holdout: usize,
    /// End a sampled run early once every standard error is at most this (see
    /// [`crate::explain::stopping`]).
    pub target_se: Option<f64>,
    /// End a sampled run early once the top `settle_top` players keep their order between two
    /// rounds; 0 turns this off.
    pub settle_top: usize,
    /// `exact` refuses more players than this.
    pub max_exact_players: usize,
    /// `"none"`, `"pairs"` (every pair of players; `exact`, or `lasso` with a pair per feature)
    /// or `"all"` (every subset, up to 12 players; `exact`): interactions from the same values
    /// as the attributions.
    pub interactions: Interactions,
    /// `"k-sii"`, `"sii"` or `"moebius"`: how an interaction is measured.
    pub interaction_index: InteractionIndex,
    /// Turn the backend's prefix cache on for the run (`false` turns it off).
    pub kv_cache: bool,
    /// Order prompts for prefix sharing (`false` keeps the estimator's order).
    pub sort_prompts: bool,
    /// Prompts sent per `score_batch` call (a backend that batches runs them in one pass);
    /// values are stored in the run directory after each batch.
    pub batch_size: usize,
    /// How the reports show each level's values: `"identity"`, `"abs_sum"`, `"min_max"` or
    /// `"power_shift"` (nlp-shap's normalizers). The values computed, stored and written as
    /// `value` in the JSON stay as they are.
    pub normalize: Normalizer,
    /// `power_shift`'s exponent (> 0).
    pub normalize_power: f64,
    /// Passed to the plugin through `PluginContext::plugin_options`.
    pub plugin_options: toml::Table,
}

impl Default for ExplanationConfig {
    fn default() -> Self {
        let estimator = EstimatorSettings::default();
        let media = MediaSpec::default();
        ExplanationConfig {
            players: Granularity::default(),
            refine_top: 1,
            refine_to: Granularity::Words,
            roles: Vec::new(),
            turns: Vec::new(),
            absence: AbsenceKind::default(),
            placeholder: "_".into(),
            image_players: media.images,
            grid: media.grid,
            fill: media.fill,
            audio_players: media.audio,
            audio_window: media.audio_window,
            regions: Vec::new(),
            value: ValueKind::default(),
            value_mean: false,
            estimator: estimator.kind,
            estimand: estimator.estimand,
            budget: estimator.budget,
            seed: estimator.seed,
            holdout: DEFAULT_HOLDOUT,
            target_se: None,
            settle_top: 0,
            max_exact_players: estimator.max_exact_players,
            interactions: estimator.interactions,
            interaction_index: estimator.interaction_index,
            kv_cache: true,
            sort_prompts: true,
            batch_size: 32,
            normalize: Normalizer::default(),
            normalize_power: 1.0,
            plugin_options: toml::Table::new(),
        }
    }
}

/// The most cells a grid may have: 64 players is already past what `exact` takes, and a
/// sampled estimator needs a budget of several times the players.
const MAX_GRID_CELLS: u32 = 64;
/// The shortest audio window: one Whisper encoder position (20 ms).
const MIN_AUDIO_WINDOW: f64 = 0.02;

/// The most players `players = "auto"` refines at one level.
const MAX_REFINE_TOP: usize = 4;
/// Held-out coalitions of a sampled run unless `holdout` says otherwise.
pub const DEFAULT_HOLDOUT: usize = 16;
/// The most held-out coalitions a run may ask for.
pub const MAX_HOLDOUT: usize = 10_000;
/// Most coalition evaluations a run may plan: a run holds every planned prompt in memory, and
/// 100,000 prompts of a long context already take gigabytes.
const MAX_BUDGET: usize = 100_000;

impl ExplanationConfig {
    /// Refuses values out of range, naming the key.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.holdout != 0
            && !(crate::explain::trust::MIN_HOLDOUT..=MAX_HOLDOUT).contains(&self.holdout)
        {
            return Err(format!(
                "[explanation] `holdout` must be 0 (off) or >= {} and <= {MAX_HOLDOUT}. Given: {}",
                crate::explain::trust::MIN_HOLDOUT,
                self.holdout
            ));
        }
        if !(4..=MAX_BUDGET).contains(&self.budget) {
            return Err(format!(
                "[explanation] `budget` must be >= 4 and <= {MAX_BUDGET}. Given: {}",
                self.budget
            ));
        }
        self.stopping().check_settings(self.estimator)?;
        if !(1..=MAX_REFINE_TOP).contains(&self.refine_top) {
            return Err(format!(
                "[explanation] `refine_top` must be >= 1 and <= {MAX_REFINE_TOP} (each refined \
                 player adds up to {} to the next level, and `exact` takes 2^players). Given: {}",
                crate::explain::hierarchy::FANOUT,
                self.refine_top
            ));
        }
        if !matches!(self.refine_to, Granularity::Sentences | Granularity::Words) {
            return Err(format!(
                "[explanation] `refine_to` must be \"sentences\" or \"words\". Given: \"{}\"",
                self.refine_to
            ));
        }
        if !(self.normalize_power.is_finite() && self.normalize_power > 0.0) {
            return Err(format!(
                "[explanation] `normalize_power` must be a number > 0. Given: {}",
                self.normalize_power
            ));
        }
        if self.batch_size == 0 {
            return Err("[explanation] `batch_size` must be >= 1. Given: 0".into());
        }
        self.validate_media()?;
        if self.absence == AbsenceKind::Hide && self.value != ValueKind::AnswerLogprob {
            return Err(format!(
                "[explanation] `absence = \"hide\"` scores the answer with players hidden, so \
                 it needs `value = \"answer_logprob\"`; `{}` generates after each coalition's \
                 prompt (use `absence = \"delete\"` or \"pad\" with it)",
                self.value
            ));
        }
        if self.absence == AbsenceKind::Pad && self.placeholder.is_empty() {
            return Err(
                "[explanation] `placeholder` is empty; with `absence = \"pad\"` it \
                        must have at least one character (or use `absence = \"delete\"`)"
                    .into(),
            );
        }
        if self.absence == AbsenceKind::Neutral && self.placeholder.chars().count() != 1 {
            return Err(format!(
                "[explanation] with `absence = \"neutral\"`, `placeholder` is the one character \
                 repeated over an absent player's width. Given: {:?}",
                self.placeholder
            ));
        }
        Ok(())
    }

    /// Refuses image and audio player settings that cannot work, naming the key.
    fn validate_media(&self) -> std::result::Result<(), String> {
        let [rows, cols] = self.grid;
        if rows == 0 || cols == 0 || rows * cols > MAX_GRID_CELLS {
            return Err(format!(
                "[explanation] `grid` must be [rows, columns], each >= 1, at most \
                 {MAX_GRID_CELLS} cells. Given: [{rows}, {cols}]"
            ));
        }
        if !(MIN_AUDIO_WINDOW..=3600.0).contains(&self.audio_window) {
            return Err(format!(
                "[explanation] `audio_window` must be >= {MIN_AUDIO_WINDOW} s (one Whisper \
                 encoder frame) and <= 3600 s. Given: {}",
                self.audio_window
            ));
        }
        Ok(())
    }

    pub fn player_spec(&self) -> PlayerSpec {
        PlayerSpec {
            granularity: self.players,
            roles: self.roles.clone(),
            turns: self.turns.clone(),
            media: MediaSpec {
                images: self.image_players,
                grid: self.grid,
                audio: self.audio_players,
                audio_window: self.audio_window,
                fill: self.fill,
                regions: self.regions.clone(),
            },
        }
    }

    pub fn estimator_settings(&self) -> EstimatorSettings {
        EstimatorSettings {
            kind: self.estimator,
            estimand: self.estimand,
            budget: self.budget,
            seed: self.seed,
            max_exact_players: self.max_exact_players,
            interactions: self.interactions,
            interaction_index: self.interaction_index,
        }
    }

    pub fn stopping(&self) -> Stopping {
        Stopping {
            target_se: self.target_se,
            settle_top: self.settle_top,
        }
    }

    pub fn absence(&self) -> Absence {
        Absence::new(self.absence, &self.placeholder)
    }
}

impl Config {
    /// The config of plugin `kind` on `model_id`, every other setting at its default: the
    /// struct an application fills in instead of writing TOML.
    pub fn new(kind: &str, model_id: &str) -> Config {
        Config {
            backend: BackendConfig {
                kind: kind.to_string(),
                model_id: model_id.to_string(),
                options: toml::Table::new(),
            },
            generation: GenerationConfig::default(),
            kv_cache: KvCacheConfig::default(),
            explanation: ExplanationConfig::default(),
            plugin_dirs: Vec::new(),
        }
    }

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
        config.checked(path)
    }

    /// A config from the same tables as JSON (an application's or Python's dict); `source` names
    /// it in errors. Relative paths in it stay relative to the working directory.
    pub fn from_json(value: serde_json::Value, source: &Path) -> Result<Config> {
        let config: Config =
            serde_path_to_error::deserialize(value).map_err(|e| Error::Config {
                path: source.to_path_buf(),
                line: 0,
                column: 0,
                message: format!("at `{}`: {}", e.path(), e.inner()),
            })?;
        config.checked(source)
    }

    /// Refuses settings that parse but cannot run.
    fn checked(self, path: &Path) -> Result<Config> {
        let refused = |message| Error::Config {
            path: path.to_path_buf(),
            line: 0,
            column: 0,
            message,
        };
        self.generation
            .validate()
            .map_err(|e| refused(format!("[generation] {}", e.message)))?;
        self.explanation.validate().map_err(refused)?;
        Ok(self)
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
    fn explanation_keys_parse_and_bad_ones_are_named() {
        let config = parse(
            "[backend]\nkind = \"mock\"\n[explanation]\nplayers = \"words\"\nroles = [\"user\"]\n\
             turns = [-1]\nestimator = \"antithetic\"\nbudget = 50\n",
        )
        .unwrap();
        let e = &config.explanation;
        assert_eq!(e.players, Granularity::Words);
        assert_eq!(e.roles, [Role::User]);
        assert_eq!(e.estimator_settings().budget, 50);
        let err =
            parse("[backend]\nkind = \"mock\"\n[explanation]\nestimator = \"lime\"\n").unwrap_err();
        assert!(err.to_string().starts_with("test.toml:4:"), "{err}");
        assert!(err.to_string().contains("exact, permutation"), "{err}");
        let err = parse("[backend]\nkind = \"mock\"\n[explanation]\nbudget = 1\n").unwrap_err();
        assert!(err.to_string().contains("`budget` must be >= 4"), "{err}");
        let err =
            parse("[backend]\nkind = \"mock\"\n[explanation]\nbudget = 100001\n").unwrap_err();
        assert!(
            err.to_string().contains("<= 100000. Given: 100001"),
            "{err}"
        );
        let config = parse("[backend]\nkind = \"mock\"\n[explanation]\nholdout = 0\n").unwrap();
        assert_eq!(config.explanation.holdout, 0);
        assert_eq!(ExplanationConfig::default().holdout, DEFAULT_HOLDOUT);
        let err = parse("[backend]\nkind = \"mock\"\n[explanation]\nholdout = 2\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("`holdout` must be 0 (off) or >= 3 and <= 10000. Given: 2"),
            "{err}"
        );
        let err = parse("[backend]\nkind = \"mock\"\n[explanation]\nbatch_size = 0\n").unwrap_err();
        assert!(
            err.to_string().contains("`batch_size` must be >= 1"),
            "{err}"
        );
        let err = parse("[backend]\nkind = \"mock\"\n[explanation]\nrefine_top = 5\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("`refine_top` must be >= 1 and <= 4 (each refined player adds up to 4"),
            "{err}"
        );
        let err = parse("[backend]\nkind = \"mock\"\n[explanation]\nrefine_to = \"messages\"\n")
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("`refine_to` must be \"sentences\" or \"words\". Given: \"messages\""),
            "{err}"
        );
        let err = parse(
            "[backend]\nkind = \"mock\"\n[explanation]\nabsence = \"hide\"\n\
             value = \"generated_logprob\"\n",
        )
        .unwrap_err();
        assert!(
            err.to_string().contains(
                "`absence = \"hide\"` scores the answer with players hidden, so it needs \
                 `value = \"answer_logprob\"`; `generated_logprob` generates"
            ),
            "{err}"
        );
        let config = parse(
            "[backend]\nkind = \"mock\"\n[explanation]\nestimator = \"kernel\"\n\
             target_se = 0.05\nsettle_top = 3\n",
        )
        .unwrap();
        let stopping = config.explanation.stopping();
        assert_eq!((stopping.target_se, stopping.settle_top), (Some(0.05), 3));
        let err = parse("[backend]\nkind = \"mock\"\n[explanation]\nsettle_top = 3\n").unwrap_err();
        assert!(
            err.to_string().contains("`exact` evaluates a fixed set"),
            "{err}"
        );
        let neutral = "[backend]\nkind = \"mock\"\n[explanation]\nabsence = \"neutral\"\n";
        let config = parse(neutral).unwrap();
        assert_eq!(config.explanation.absence(), Absence::Neutral { fill: '_' });
        let err = parse(&format!("{neutral}placeholder = \"[x]\"\n")).unwrap_err();
        assert!(
            err.to_string()
                .contains("`placeholder` is the one character repeated over an absent player's width. Given: \"[x]\""),
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
