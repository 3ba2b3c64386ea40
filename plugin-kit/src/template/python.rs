//! The Python that chat templates lean on: the globals and the `tojson` filter Transformers adds
//! to jinja2 (`_cached_compile_jinja_template` in `utils/chat_template_utils.py`), and the
//! filters and tests where jinja2's answer differs from minijinja's. Python's str/dict/list
//! methods come from minijinja-contrib's pycompat.

use std::borrow::Cow;
use std::fmt::Write;

use minijinja::filters;
use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Output, State, Value};

/// The message of a `raise_exception` call, carried as the source of the render error so that
/// [`super::TemplateError`] can tell a refusal from a broken template.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct Raised(pub String);

/// `raise_exception(message)`: the template refuses the conversation.
pub(super) fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// `strftime_now(format)`: `datetime.now().strftime(format)`, local time. chrono's directives
/// are Python's (glibc's) for all that templates use: `%Y %m %d %B %b %H %M %S %A %a %j %p %y %e`.
pub(super) fn strftime_now(format: &str) -> Result<String, Error> {
    let mut text = String::new();
    write!(text, "{}", chrono::Local::now().format(format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        )
    })?;
    Ok(text)
}

/// Each `for` loop's iterable (see [`super::rewrite`]): Python cannot iterate None.
pub(super) fn checked_iterable(value: Value) -> Result<Value, Error> {
    if value.is_none() {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "'NoneType' object is not iterable (a for loop over none)",
        ));
    }
    Ok(value)
}

/// jinja2's `map`, `select`, `reject`, `selectattr` and `rejectattr` return generators, where
/// minijinja's return lists: a generator has no length, is always true, and `tojson` refuses
/// it ("Object of type generator is not JSON serializable"), until `|list` makes a list of it.
pub(super) fn generator(items: Vec<Value>) -> Value {
    Value::make_iterable(move || items.clone().into_iter())
}

pub(super) fn map(state: &State, value: Value, args: Rest<Value>) -> Result<Value, Error> {
    filters::map(state, value, args).map(generator)
}

pub(super) fn select(
    state: &State,
    value: Value,
    test: Option<Cow<'_, str>>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    filters::select(state, value, test, args).map(generator)
}

pub(super) fn reject(
    state: &State,
    value: Value,
    test: Option<Cow<'_, str>>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    filters::reject(state, value, test, args).map(generator)
}

pub(super) fn selectattr(
    state: &State,
    value: Value,
    attr: Cow<'_, str>,
    test: Option<Cow<'_, str>>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    filters::selectattr(state, value, attr, test, args).map(generator)
}

pub(super) fn rejectattr(
    state: &State,
    value: Value,
    attr: Cow<'_, str>,
    test: Option<Cow<'_, str>>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    filters::rejectattr(state, value, attr, test, args).map(generator)
}

/// The `length` filter as jinja2's: an undefined value has length 0 (jinja2's `Undefined`
/// defines `__len__`), where minijinja's refuses it.
pub(super) fn length(value: &Value) -> Result<usize, Error> {
    match value.is_undefined() {
        true => Ok(0),
        false => minijinja::filters::length(value),
    }
}

/// jinja2's `is iterable`: whatever Python's `iter()` accepts, which leaves out None (minijinja's
/// own test says yes to none) and includes an undefined value.
pub(super) fn is_iterable(value: &Value) -> bool {
    !value.is_none() && (value.is_undefined() || value.try_iter().is_ok())
}

/// jinja2's `is sequence`: anything with a length and indexing, so strings and dicts too
/// (minijinja's own test says yes to lists only), and an undefined value.
pub(super) fn is_sequence(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Undefined | ValueKind::String | ValueKind::Seq | ValueKind::Map
    )
}

/// jinja2's `is number`: Python's numbers, of which booleans are one.
pub(super) fn is_number(value: &Value) -> bool {
    matches!(value.kind(), ValueKind::Number | ValueKind::Bool)
}

/// How `{{ value }}` prints: as Python's `str()` where minijinja's spelling differs (`None`,
/// `True`, `1e+16`, `['a', 1]`, `{'k': False}`); strings and the rest as minijinja prints them.
pub(super) fn format(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Seq | ValueKind::Map => {
            out.write_str(&python_str(value)).map_err(|e| {
                Error::new(ErrorKind::WriteFailure, "cannot write the output").with_source(e)
            })
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// The `string` filter as jinja2's: Python's `str()`.
pub(super) fn string(value: &Value) -> Value {
    match value.kind() {
        ValueKind::String => value.clone(),
        _ => Value::from(python_str(value)),
    }
}

/// Python's `str()` of a value: its `repr()` but for strings, which stand as they are.
fn python_str(value: &Value) -> String {
    match value.as_str() {
        Some(s) => s.to_string(),
        None => python_repr(value),
    }
}

fn python_repr(value: &Value) -> String {
    let items = |value: &Value| value.try_iter().into_iter().flatten();
    match value.kind() {
        ValueKind::None => "None".to_string(),
        ValueKind::Bool => (if value.is_true() { "True" } else { "False" }).to_string(),
        ValueKind::Number => number(value),
        ValueKind::String => string_repr(value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            let items: Vec<String> = items(value).map(|v| python_repr(&v)).collect();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = items(value)
                .map(|k| {
                    let v = value.get_item(&k).unwrap_or_default();
                    format!("{}: {}", python_repr(&k), python_repr(&v))
                })
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        _ => value.to_string(),
    }
}

/// A string literal as Python's `repr()` writes it: in single quotes unless the text holds one
/// and no double quote, with backslash escapes for the quote, backslashes and control characters.
fn string_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::from(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c < ' ' || c == '\u{7f}' => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// The `tojson` filter as Transformers overrides it: `json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`, so no HTML escaping, `", "` and `": "`
/// between items, keys in insertion order. Those four are taken as keyword arguments.
pub(super) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        Some(n) if n.is_number() => Some(" ".repeat(usize::try_from(n)?)),
        Some(s) if s.kind() == ValueKind::String => Some(s.to_string()),
        _ => None,
    };
    let default_separators = match indent {
        Some(_) => (",", ": "),
        None => (", ", ": "),
    };
    let separators = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => Some((item, key)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair",
                ))
            }
        },
        None => None,
    };
    let dumps = Dumps {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        separators: separators.unwrap_or_else(|| {
            let (item, key) = default_separators;
            (item.to_string(), key.to_string())
        }),
        indent,
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    dumps.value(&mut out, value, 0)?;
    Ok(Value::from(out))
}

/// Python's `json.dumps` options.
struct Dumps {
    ensure_ascii: bool,
    sort_keys: bool,
    /// (between items, between a key and its value)
    separators: (String, String),
    indent: Option<String>,
}

impl Dumps {
    fn value(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&number(value)),
            ValueKind::String => self.string(out, value.as_str().unwrap_or_default()),
            // `map`, `select` and their kin make a generator in jinja2, which json.dumps refuses.
            ValueKind::Iterable => return Err(not_serializable(value)),
            ValueKind::Seq => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(out, ('[', ']'), &items, depth, |out, item, depth| {
                    self.value(out, item, depth)
                })?;
            }
            ValueKind::Map => self.map(out, value, depth)?,
            _ => return Err(not_serializable(value)),
        }
        Ok(())
    }

    fn map(&self, out: &mut String, map: &Value, depth: usize) -> Result<(), Error> {
        let mut keys: Vec<Value> = map.try_iter()?.collect();
        if self.sort_keys {
            keys.sort();
        }
        self.container(out, ('{', '}'), &keys, depth, |out, key, depth| {
            self.string(out, &key_text(key)?);
            out.push_str(&self.separators.1);
            self.value(out, &map.get_item(key)?, depth)
        })
    }

    /// `[a, b]`, or with an indent one item a line, the way `json.dumps` lays them out.
    fn container(
        &self,
        out: &mut String,
        (open, close): (char, char),
        items: &[Value],
        depth: usize,
        mut item: impl FnMut(&mut String, &Value, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        for (i, value) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.separators.0);
            }
            self.newline(out, depth + 1);
            item(out, value, depth + 1)?;
        }
        if !items.is_empty() {
            self.newline(out, depth);
        }
        out.push(close);
        Ok(())
    }

    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    }

    /// A JSON string escaped as Python escapes it: `\n`-style escapes, other control characters
    /// as `\u00XX`, and with `ensure_ascii` everything outside ' '..='~' as UTF-16 `\uXXXX`.
    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if c < ' ' || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        // Writing to a String cannot fail.
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A dict key as `json.dumps` writes it: strings as they are, numbers, booleans and None in
/// their JSON spelling.
fn key_text(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.to_string(),
        ValueKind::Number => number(key),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::None => "null".to_string(),
        _ => return Err(not_serializable(key)),
    })
}

/// A number as Python writes it: integers in full, floats in `repr` (`1.0`, `1e-05`, `1e+16`).
fn number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(f) => float_repr(f),
        Err(_) => value.to_string(),
    }
}

fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return (if f > 0.0 { "Infinity" } else { "-Infinity" }).to_string();
    }
    // Rust's `{:e}` gives the shortest digits that round-trip, as Python's repr does; Python
    // writes them positionally when the exponent is in -4..16.
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..16).contains(&exponent) {
        let text = f.to_string();
        return if text.contains('.') {
            text
        } else {
            text + ".0"
        };
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}

/// Python's TypeError for what JSON cannot hold (undefined, a namespace, a macro...).
fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "tojson: object of type {} is not JSON serializable",
            match value.kind() {
                ValueKind::Iterable => "generator".to_string(),
                kind => kind.to_string(),
            }
        ),
    )
}
