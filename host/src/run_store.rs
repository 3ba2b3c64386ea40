//! The run directory: every coalition value of `lmhost explain --run-dir DIR`, persisted in
//! SQLite (`DIR/values.sqlite`) the moment it is computed, so a re-run resumes.
//!
//! Each value is one autocommitted insert in WAL mode with `synchronous = FULL`: once `put`
//! returns it survives a kill or a power cut, and a write cut short is rolled back by SQLite on
//! the next open, never half-read. Values are keyed by a run key (model, backend options,
//! generation settings, value function, answer) and by the sha256 of the prompt, so different
//! settings share a directory without mixing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lmhost_plugin_api::ConversationSnapshot;
use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::explain::{BaseAnswer, Evaluation};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS coalition_values (
    run_key TEXT NOT NULL,
    prompt_key TEXT NOT NULL,
    value REAL NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_prompt_tokens INTEGER NOT NULL,
    prompt_json TEXT NOT NULL,
    PRIMARY KEY (run_key, prompt_key)
);
CREATE TABLE IF NOT EXISTS base_answers (
    answer_key TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    contextual_embedding TEXT
);
";

pub struct RunStore {
    path: PathBuf,
    conn: Connection,
}

/// Hex sha256 of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The key of a prompt: the sha256 of its turns' canonical JSON.
pub fn prompt_key(prompt: &ConversationSnapshot) -> String {
    digest(&serde_json::to_vec(&prompt.turns).unwrap_or_default())
}

impl RunStore {
    /// Opens (creating) `dir/values.sqlite`.
    pub fn open(dir: &Path) -> Result<RunStore> {
        let path = dir.join("values.sqlite");
        let fail = |message: String| Error::RunStore {
            path: dir.to_path_buf(),
            message,
        };
        std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create it: {e}")))?;
        let conn = Connection::open(&path)
            .map_err(|e| fail(format!("cannot open {}: {e}", path.display())))?;
        let setup = |conn: &Connection| -> rusqlite::Result<()> {
            conn.busy_timeout(std::time::Duration::from_secs(10))?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "FULL")?;
            conn.execute_batch(SCHEMA)
        };
        setup(&conn).map_err(|e| {
            fail(format!(
                "{} is not a usable lmhost run store ({e}); pick another --run-dir",
                path.display()
            ))
        })?;
        Ok(RunStore { path, conn })
    }

    fn error(&self, e: rusqlite::Error) -> Error {
        Error::RunStore {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    /// Every value stored under `run_key`, by prompt key.
    pub fn load(&self, run_key: &str) -> Result<HashMap<String, Evaluation>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT prompt_key, value, prompt_tokens, cached_prompt_tokens \
                 FROM coalition_values WHERE run_key = ?1",
            )
            .map_err(|e| self.error(e))?;
        let rows = stmt
            .query_map([run_key], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    Evaluation {
                        value: row.get(1)?,
                        prompt_tokens: row.get::<_, i64>(2)? as u64,
                        cached_prompt_tokens: row.get::<_, i64>(3)? as u64,
                    },
                ))
            })
            .map_err(|e| self.error(e))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(|e| self.error(e))
    }

    /// Stores one value durably before returning.
    pub fn put(
        &self,
        run_key: &str,
        prompt: &ConversationSnapshot,
        evaluation: &Evaluation,
    ) -> Result<()> {
        let json = serde_json::to_string(&prompt.turns).unwrap_or_default();
        self.conn
            .execute(
                "INSERT OR REPLACE INTO coalition_values \
                 (run_key, prompt_key, value, prompt_tokens, cached_prompt_tokens, prompt_json) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    run_key,
                    prompt_key(prompt),
                    evaluation.value,
                    evaluation.prompt_tokens as i64,
                    evaluation.cached_prompt_tokens as i64,
                    json
                ],
            )
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    pub fn base_answer(&self, answer_key: &str) -> Result<Option<BaseAnswer>> {
        let row = self
            .conn
            .query_row(
                "SELECT text, contextual_embedding FROM base_answers WHERE answer_key = ?1",
                [answer_key],
                |row| Ok((row.get::<_, String>(0)?, row.get::<_, Option<String>>(1)?)),
            )
            .optional()
            .map_err(|e| self.error(e))?;
        Ok(row.map(|(text, embedding)| BaseAnswer {
            text,
            contextual_embedding: embedding.and_then(|e| serde_json::from_str(&e).ok()),
        }))
    }

    pub fn put_base_answer(&self, answer_key: &str, answer: &BaseAnswer) -> Result<()> {
        let embedding = answer
            .contextual_embedding
            .as_ref()
            .and_then(|e| serde_json::to_string(e).ok());
        self.conn
            .execute(
                "INSERT OR REPLACE INTO base_answers (answer_key, text, contextual_embedding) \
                 VALUES (?1, ?2, ?3)",
                params![answer_key, answer.text, embedding],
            )
            .map_err(|e| self.error(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_survive_reopening_and_runs_do_not_mix() {
        let dir = tempfile::tempdir().unwrap();
        let prompt = ConversationSnapshot::from_prompt("hi");
        let e = Evaluation {
            value: -1.25,
            prompt_tokens: 3,
            cached_prompt_tokens: 1,
        };
        RunStore::open(dir.path())
            .unwrap()
            .put("run-a", &prompt, &e)
            .unwrap();
        let store = RunStore::open(dir.path()).unwrap();
        assert_eq!(store.load("run-a").unwrap()[&prompt_key(&prompt)], e);
        assert!(store.load("run-b").unwrap().is_empty());
        let base = BaseAnswer {
            text: "ok".into(),
            contextual_embedding: Some(vec![0.5, 1.0]),
        };
        store.put_base_answer("k", &base).unwrap();
        assert_eq!(store.base_answer("k").unwrap(), Some(base));
    }

    #[test]
    fn a_file_that_is_not_a_store_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("values.sqlite"),
            "not sqlite at all, garbage bytes here",
        )
        .unwrap();
        let err = RunStore::open(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains("values.sqlite") && err.contains("--run-dir"),
            "{err}"
        );
    }
}
