//! The run directory: every coalition value of `lmhost explain --run-dir DIR`, persisted in
//! SQLite (`DIR/values.sqlite`) the moment it is computed, so a re-run resumes.
//!
//! Each value is one autocommitted insert in WAL mode with `synchronous = FULL`: once `put`
//! returns it survives a kill or a power cut, and a write cut short is rolled back by SQLite on
//! the next open, never half-read. Values are keyed by a run key (model, backend options,
//! generation settings, value function, answer) and by the sha256 of the prompt, so different
//! settings share a directory without mixing.
//!
//! A row stays small whatever the prompt holds: `prompt_json` writes each audio part as the
//! sha256 of its samples (see [`lmhost_plugin_api::Audio::digest`]), its rate and its
//! length, never the samples; the prompt key is hashed as the JSON streams, never held whole.
//! Directories written before this (`user_version` 0) read as they are: the keys are the same
//! and nothing reads `prompt_json` back. Format 2 adds each value's parts by answer token
//! (`token_values`, a JSON array); an older directory gains the column, and its rows read with
//! no token parts. A directory of a newer format is refused by name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lmhost_plugin_api::{ConversationSnapshot, Part};
use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::explain::{BaseAnswer, Evaluation};

/// The format this build writes, kept in SQLite's `user_version`. 0 (before it was kept) reads
/// the same: the keys did not change, only audio's `prompt_json` did; 2 added `token_values`.
const FORMAT: i64 = 2;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS coalition_values (
    run_key TEXT NOT NULL,
    prompt_key TEXT NOT NULL,
    value REAL NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_prompt_tokens INTEGER NOT NULL,
    prompt_json TEXT NOT NULL,
    token_values TEXT,
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

/// The key of a prompt: the sha256 of its turns' canonical JSON, hashed as it is written so a
/// long audio is never held as JSON text.
pub fn prompt_key(prompt: &ConversationSnapshot) -> String {
    let mut hasher = HashWriter(Sha256::new());
    // Writing into a hasher cannot fail, and the turns always serialize.
    let _ = serde_json::to_writer(&mut hasher, &prompt.turns);
    // The tools and documents the model is given change its answer (and a coalition may
    // leave documents out); a prompt without them keeps its key.
    for (name, texts) in [("tools", &prompt.tools), ("documents", &prompt.documents)] {
        if !texts.is_empty() {
            hasher.0.update(name);
            let _ = serde_json::to_writer(&mut hasher, texts);
        }
    }
    hasher
        .0
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a row shows of its prompt: the turns, with each audio part as its digest, rate and
/// length instead of its samples, and each image as its digest and size.
pub fn stored_prompt_json(prompt: &ConversationSnapshot) -> String {
    let turns: Vec<serde_json::Value> = prompt
        .turns
        .iter()
        .map(|turn| {
            let messages: Vec<serde_json::Value> = turn
                .messages
                .iter()
                .map(|m| {
                    let parts: Vec<serde_json::Value> = m
                        .parts
                        .iter()
                        .map(|part| match part {
                            Part::Text { text } => {
                                serde_json::json!({"type": "text", "text": text.as_str()})
                            }
                            Part::Audio { audio } => serde_json::json!({
                                "type": "audio",
                                "audio": {
                                    "sha256": audio.digest(),
                                    "sample_rate": audio.sample_rate,
                                    "samples": audio.samples.len(),
                                },
                            }),
                            Part::Image { image } => serde_json::json!({
                                "type": "image",
                                "image": {
                                    "sha256": image.digest(),
                                    "width": image.width,
                                    "height": image.height,
                                },
                            }),
                        })
                        .collect();
                    serde_json::json!({"role": m.role, "parts": parts})
                })
                .collect();
            serde_json::json!({ "messages": messages })
        })
        .collect();
    serde_json::Value::Array(turns).to_string()
}

/// Brings a store of an older format to [`FORMAT`]: the table made before `token_values`
/// gains the column (empty for its rows).
fn upgrade(conn: &Connection) -> rusqlite::Result<()> {
    let has_tokens: bool = conn.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info('coalition_values') \
         WHERE name = 'token_values'",
        [],
        |row| row.get(0),
    )?;
    if !has_tokens {
        conn.execute_batch("ALTER TABLE coalition_values ADD COLUMN token_values TEXT")?;
    }
    conn.pragma_update(None, "user_version", FORMAT)
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
        let setup = |conn: &Connection| -> rusqlite::Result<i64> {
            conn.busy_timeout(std::time::Duration::from_secs(10))?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "FULL")?;
            conn.execute_batch(SCHEMA)?;
            conn.query_row("PRAGMA user_version", [], |row| row.get::<_, i64>(0))
        };
        let format = setup(&conn).map_err(|e| {
            fail(format!(
                "{} is not a usable lmhost run store ({e}); pick another --run-dir",
                path.display()
            ))
        })?;
        if format > FORMAT {
            return Err(fail(format!(
                "{} was written by a newer lmhost (run store format {format}; this one reads \
                 up to {FORMAT}); use that lmhost or pick another --run-dir",
                path.display()
            )));
        }
        if format < FORMAT {
            upgrade(&conn).map_err(|e| fail(format!("cannot upgrade {}: {e}", path.display())))?;
        }
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
                "SELECT prompt_key, value, prompt_tokens, cached_prompt_tokens, token_values \
                 FROM coalition_values WHERE run_key = ?1",
            )
            .map_err(|e| self.error(e))?;
        let rows = stmt
            .query_map([run_key], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    Evaluation {
                        value: row.get(1)?,
                        tokens: row
                            .get::<_, Option<String>>(4)?
                            .and_then(|json| serde_json::from_str(&json).ok())
                            .unwrap_or_default(),
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
        let json = stored_prompt_json(prompt);
        let tokens = (!evaluation.tokens.is_empty())
            .then(|| serde_json::to_string(&evaluation.tokens).ok())
            .flatten();
        self.conn
            .execute(
                "INSERT OR REPLACE INTO coalition_values \
                 (run_key, prompt_key, value, prompt_tokens, cached_prompt_tokens, prompt_json, \
                 token_values) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    run_key,
                    prompt_key(prompt),
                    evaluation.value,
                    evaluation.prompt_tokens as i64,
                    evaluation.cached_prompt_tokens as i64,
                    json,
                    tokens
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
            tokens: vec![-1.0, -0.25],
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

    fn with_audio(samples: Vec<f32>) -> ConversationSnapshot {
        use lmhost_plugin_api::abi_stable::std_types::RVec;
        use lmhost_plugin_api::{Audio, Message, Role, Turn};
        let message = Message::new(
            Role::User,
            vec![
                Part::Audio {
                    audio: Audio {
                        samples: RVec::from(samples),
                        sample_rate: 16_000,
                    },
                },
                Part::text("what is said?"),
            ],
        );
        ConversationSnapshot::new(vec![Turn {
            messages: RVec::from(vec![message]),
        }])
        .unwrap()
    }

    #[test]
    fn the_tools_and_documents_are_part_of_a_prompts_key() {
        let turns = ConversationSnapshot::from_prompt("hi").turns.to_vec();
        let with = |tools: Vec<&str>| {
            let tools = tools.into_iter().map(Into::into).collect();
            prompt_key(
                &ConversationSnapshot::grounded(
                    turns.clone(),
                    lmhost_plugin_api::Grounding {
                        tools,
                        ..lmhost_plugin_api::Grounding::default()
                    },
                )
                .unwrap(),
            )
        };
        assert_eq!(
            with(vec![]),
            prompt_key(&ConversationSnapshot::from_prompt("hi"))
        );
        assert_ne!(with(vec![r#"{"name": "a"}"#]), with(vec![]));
        assert_ne!(
            with(vec![r#"{"name": "a"}"#]),
            with(vec![r#"{"name": "b"}"#])
        );
    }

    #[test]
    fn prompt_keys_are_those_of_directories_written_before_audio_was_digested() {
        // Before, the key was the digest of the whole JSON text; rows keyed so must still match.
        for prompt in [
            ConversationSnapshot::from_prompt("hi there"),
            with_audio(vec![0.0, 0.5, -0.25, 1.0e-7]),
        ] {
            let legacy = digest(&serde_json::to_vec(&prompt.turns).unwrap());
            assert_eq!(prompt_key(&prompt), legacy);
        }
        let json = stored_prompt_json(&with_audio(vec![0.5; 1000]));
        assert!(
            json.contains("\"sha256\"") && json.contains("what is said?"),
            "{json}"
        );
        assert!(json.len() < 300, "{json}");
        let image = lmhost_plugin_api::Image::new(64, 64, vec![3; 64 * 64 * 3]).unwrap();
        let mut pictured = with_audio(vec![0.5]);
        pictured.turns[0].messages[0].parts[0] = Part::Image {
            image: image.clone(),
        };
        let json = stored_prompt_json(&pictured);
        assert!(
            json.contains(&image.digest()) && json.contains("\"width\":64"),
            "{json}"
        );
        assert!(json.len() < 300, "{json}");
    }

    #[test]
    fn a_store_of_a_newer_format_is_refused_and_an_older_one_is_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("values.sqlite")).unwrap();
        // Format 1's table, and a value in it.
        conn.execute_batch(
            "CREATE TABLE coalition_values (run_key TEXT NOT NULL, prompt_key TEXT NOT NULL, \
             value REAL NOT NULL, prompt_tokens INTEGER NOT NULL, \
             cached_prompt_tokens INTEGER NOT NULL, prompt_json TEXT NOT NULL, \
             PRIMARY KEY (run_key, prompt_key)); PRAGMA user_version = 1;",
        )
        .unwrap();
        let old = ConversationSnapshot::from_prompt("old");
        conn.execute(
            "INSERT INTO coalition_values VALUES ('r', ?1, -3.0, 2, 0, '[]')",
            [prompt_key(&old)],
        )
        .unwrap();
        drop(conn);
        let prompt = ConversationSnapshot::from_prompt("hi");
        let e = Evaluation {
            value: 0.5,
            tokens: vec![0.25, 0.25],
            prompt_tokens: 1,
            cached_prompt_tokens: 0,
        };
        let store = RunStore::open(dir.path()).unwrap();
        store.put("r", &prompt, &e).unwrap();
        let loaded = store.load("r").unwrap();
        assert_eq!(loaded[&prompt_key(&prompt)], e);
        let old = &loaded[&prompt_key(&old)];
        assert_eq!((old.value, old.tokens.len()), (-3.0, 0));
        drop(store);
        let conn = Connection::open(dir.path().join("values.sqlite")).unwrap();
        let format: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(format, FORMAT);
        conn.pragma_update(None, "user_version", FORMAT + 1)
            .unwrap();
        drop(conn);
        let err = RunStore::open(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains("newer lmhost") && err.contains("--run-dir"),
            "{err}"
        );
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
