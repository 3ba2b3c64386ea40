//! Plugin options: the description a plugin publishes, and the validation the host runs with it
//! before a backend is made.

use abi_stable::std_types::{RString, RVec};
use abi_stable::StableAbi;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::PluginError;

/// The type an option's value must have.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptionKind {
    Bool,
    /// A whole number >= 0.
    Integer,
    Float,
    String,
    /// A list of strings.
    Strings,
}

impl OptionKind {
    fn describe(self) -> &'static str {
        match self {
            OptionKind::Bool => "a boolean",
            OptionKind::Integer => "a whole number >= 0",
            OptionKind::Float => "a number",
            OptionKind::String => "a string",
            OptionKind::Strings => "a list of strings",
        }
    }

    fn accepts(self, value: &Value) -> bool {
        match self {
            OptionKind::Bool => value.is_boolean(),
            OptionKind::Integer => value.is_u64(),
            OptionKind::Float => value.is_number(),
            OptionKind::String => value.is_string(),
            OptionKind::Strings => value
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
        }
    }
}

/// One option a plugin accepts in `[backend.options]`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptionSpec {
    pub key: RString,
    pub kind: OptionKind,
    /// The default as JSON text (`null` when the option has no default).
    pub default: RString,
    /// For strings: the only values allowed (empty means any).
    pub choices: RVec<RString>,
    pub help: RString,
}

impl OptionSpec {
    pub fn new(key: &str, kind: OptionKind, default: Value, help: &str) -> Self {
        OptionSpec {
            key: key.into(),
            kind,
            default: default.to_string().into(),
            choices: RVec::new(),
            help: help.into(),
        }
    }

    /// A string option restricted to `choices`.
    pub fn choice(key: &str, choices: &[&str], default: &str, help: &str) -> Self {
        OptionSpec {
            choices: choices.iter().map(|&c| RString::from(c)).collect(),
            ..Self::new(key, OptionKind::String, Value::from(default), help)
        }
    }

    /// What the value must be, in words, for error messages and `lmhost plugins`.
    pub fn expected(&self) -> String {
        if self.choices.is_empty() {
            self.kind.describe().to_string()
        } else {
            let list: Vec<String> = self.choices.iter().map(|c| format!("{c:?}")).collect();
            format!("one of {}", list.join(", "))
        }
    }
}

/// Checks `options` against `specs`: every key known, every value of its type and, for choices,
/// one of the allowed values. The error names the key, what was expected and the allowed keys.
pub fn validate_options(
    plugin: &str,
    specs: &[OptionSpec],
    options: &Map<String, Value>,
) -> Result<(), PluginError> {
    for (key, value) in options {
        let Some(spec) = specs.iter().find(|s| s.key.as_str() == key) else {
            let allowed: Vec<&str> = specs.iter().map(|s| s.key.as_str()).collect();
            let allowed = if allowed.is_empty() {
                "none".to_string()
            } else {
                allowed.join(", ")
            };
            return Err(PluginError::config(format!(
                "unknown option `{key}` for backend `{plugin}`; allowed keys: {allowed}"
            )));
        };
        let in_choices = |s: &str| spec.choices.is_empty() || spec.choices.iter().any(|c| c == s);
        let valid = spec.kind.accepts(value) && value.as_str().is_none_or(in_choices);
        if !valid {
            return Err(PluginError::config(format!(
                "option `{key}` of backend `{plugin}` must be {}. Given: {value}",
                spec.expected()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn specs() -> Vec<OptionSpec> {
        vec![
            OptionSpec::new("threads", OptionKind::Integer, json!(0), "CPU threads"),
            OptionSpec::choice("dtype", &["auto", "float32"], "auto", "weight dtype"),
        ]
    }

    fn check(options: Value) -> Result<(), PluginError> {
        validate_options("demo", &specs(), options.as_object().unwrap())
    }

    #[test]
    fn accepts_known_keys_of_the_right_type() {
        check(json!({"threads": 2, "dtype": "float32"})).unwrap();
    }

    #[test]
    fn unknown_key_lists_allowed_keys() {
        let err = check(json!({"thread": 2})).unwrap_err();
        assert_eq!(err.kind, crate::ErrorKind::Config);
        assert!(err.message.contains("`thread`"), "{err}");
        assert!(err.message.contains("threads, dtype"), "{err}");
    }

    #[test]
    fn wrong_type_names_key_and_expectation() {
        let err = check(json!({"threads": "two"})).unwrap_err();
        assert!(err.message.contains("`threads`"), "{err}");
        assert!(err.message.contains("whole number"), "{err}");
        let err = check(json!({"threads": -1})).unwrap_err();
        assert!(err.message.contains("Given: -1"), "{err}");
    }

    #[test]
    fn value_outside_choices_lists_choices() {
        let err = check(json!({"dtype": "int4"})).unwrap_err();
        assert!(err.message.contains(r#"one of "auto", "float32""#), "{err}");
    }
}
