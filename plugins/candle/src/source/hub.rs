//! Hugging Face hub ids, fetched through hf-hub's cache (option `revision`).
//!
//! Files already in the local cache are used without the network; otherwise hf-hub downloads
//! them. Where the hub is out of reach the error names the id, the revision and the cache path
//! looked in, so a user can copy the files there or point `model_id` at a local directory.

use std::path::PathBuf;

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use lmhost_plugin_kit::text::ModelText;

use super::safetensors::{shards_of_index, text_of, Files};

/// A hub repository at a revision, read through hf-hub's cache.
struct Remote {
    repo: hf_hub::api::sync::ApiRepo,
    id: String,
    revision: String,
    cache_path: PathBuf,
}

impl Remote {
    fn open(id: &str, revision: &str) -> Result<Remote, String> {
        let cache = Cache::from_env();
        let cache_path: PathBuf = cache.path().clone();
        let repo = Repo::with_revision(id.to_string(), RepoType::Model, revision.to_string());
        let api = ApiBuilder::from_cache(cache)
            .with_progress(false)
            .build()
            .map_err(|e| format!("cannot start the hub client: {e}"))?;
        Ok(Remote {
            repo: api.repo(repo),
            id: id.to_string(),
            revision: revision.to_string(),
            cache_path,
        })
    }

    /// One file of the repository, from the cache or downloaded.
    fn get(&self, name: &str) -> Result<PathBuf, String> {
        self.repo.get(name).map_err(|e| {
            format!(
                "hub model {:?} (revision {:?}): cannot get {name}: {e}; not found in the \
                 local cache {} either",
                self.id,
                self.revision,
                self.cache_path.display()
            )
        })
    }
}

/// Fetches (or finds in the cache) the files of `id` at `revision`.
pub fn fetch(id: &str, revision: &str) -> Result<Files, String> {
    let remote = Remote::open(id, revision)?;
    let config = remote.get("config.json")?;
    let tokenizer = remote.get("tokenizer.json")?;
    let tokenizer_config = remote.get("tokenizer_config.json").ok();
    // Read from beside config.json when the repository has them: the chat template, and a
    // vision-language model's processor settings.
    for name in [
        "chat_template.jinja",
        "preprocessor_config.json",
        "processor_config.json",
    ] {
        let _ = remote.get(name);
    }
    let weights = match remote.get("model.safetensors") {
        Ok(single) => vec![single],
        Err(single_err) => {
            let index = remote
                .get("model.safetensors.index.json")
                .map_err(|_| single_err)?;
            shards_of_index(&index)?
                .iter()
                .map(|s| remote.get(s))
                .collect::<Result<Vec<_>, _>>()?
        }
    };
    Ok(Files {
        config,
        tokenizer,
        tokenizer_config,
        weights,
    })
}

/// Fetches only the text files of `id` (no weights) and reads what prompting it needs.
pub fn fetch_text(id: &str, revision: &str) -> Result<ModelText, String> {
    let remote = Remote::open(id, revision)?;
    let tokenizer = remote.get("tokenizer.json")?;
    let (tokenizer_config, config) = (
        remote.get("tokenizer_config.json").ok(),
        remote.get("config.json").ok(),
    );
    let _ = remote.get("chat_template.jinja");
    text_of(&tokenizer, tokenizer_config.as_deref(), config.as_deref())
        .map_err(|e| format!("hub model {id:?}: {e}"))
}
