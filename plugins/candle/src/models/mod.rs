//! Model architectures, one per file (a folder for multi-part models).

pub mod whisper;
