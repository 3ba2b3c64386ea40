//! Hugging Face hub ids, fetched through hf-hub's cache (option `revision`).
//!
//! Files already in the local cache are used without the network; otherwise hf-hub downloads
//! them. Where the hub is out of reach the error names the id, the revision and the cache path
//! looked in, so a user can copy the files there or point `model_id` at a local directory.

use std::path::PathBuf;

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use super::safetensors::{shards_of_index, Files};

/// Fetches (or finds in the cache) the files of `id` at `revision`.
pub fn fetch(id: &str, revision: &str) -> Result<Files, String> {
    let cache = Cache::from_env();
    let cache_path: PathBuf = cache.path().clone();
    let repo = Repo::with_revision(id.to_string(), RepoType::Model, revision.to_string());
    let api = ApiBuilder::from_cache(cache)
        .with_progress(false)
        .build()
        .map_err(|e| format!("cannot start the hub client: {e}"))?;
    let api_repo = api.repo(repo);
    let get = |name: &str| {
        api_repo.get(name).map_err(|e| {
            format!(
                "hub model {id:?} (revision {revision:?}): cannot get {name}: {e}; \
                 not found in the local cache {} either",
                cache_path.display()
            )
        })
    };
    let config = get("config.json")?;
    let tokenizer = get("tokenizer.json")?;
    let tokenizer_config = get("tokenizer_config.json").ok();
    let weights = match get("model.safetensors") {
        Ok(single) => vec![single],
        Err(single_err) => {
            let index = get("model.safetensors.index.json").map_err(|_| single_err)?;
            shards_of_index(&index)?
                .iter()
                .map(|s| get(s))
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
