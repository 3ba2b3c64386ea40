//! The two rewrites a template needs before minijinja compiles it, for what jinja2 parses or
//! runs differently. Both keep every line where it was, so errors point at the author's lines.
//!
//! - Transformers' `{% generation %}...{% endgeneration %}` (its AssistantTracker extension)
//!   marks the assistant's text for training masks and otherwise renders its body unchanged, in a
//!   call block, a scope of its own. minijinja has no such tag, so the pair becomes `{% with %}` /
//!   `{% endwith %}`: the same body, the same scoping, and, being block tags too, the same
//!   `trim_blocks` / `lstrip_blocks` and `-` whitespace control.
//! - jinja2 raises "'NoneType' object is not iterable" on `{% for x in none %}`, where minijinja
//!   loops zero times. Transformers passes `tools=None`, so a template that requires tools fails
//!   there; each loop's iterable is therefore passed through [`CHECKED_ITERABLE`], which refuses
//!   none and hands anything else back unchanged.

use std::borrow::Cow;

/// The function each `for` loop's iterable goes through (see the module doc).
pub(super) const CHECKED_ITERABLE: &str = "__lmhost_checked_iterable";

/// `source` with both rewrites applied; comments, `{{ ... }}` and `{% raw %}` are left alone.
pub(super) fn for_minijinja(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = next_delimiter(rest) {
        let (head, body) = rest.split_at(open + 2);
        out.push_str(head);
        let close = match &head[open..] {
            "{#" => body.find("#}").unwrap_or(body.len()),
            "{{" => outside_strings(body, "}}"),
            _ => {
                let end = outside_strings(body, "%}");
                let inner = &body[..end];
                out.push_str(&rewrite_tag(inner));
                rest = &body[end..];
                if keyword(inner).1 == "raw" {
                    let raw_end = end_of_raw(rest);
                    out.push_str(&rest[..raw_end]);
                    rest = &rest[raw_end..];
                }
                continue;
            }
        };
        out.push_str(&body[..close]);
        rest = &body[close..];
    }
    out.push_str(rest);
    out
}

/// Where the next `{%`, `{{` or `{#` starts.
fn next_delimiter(s: &str) -> Option<usize> {
    s.match_indices('{')
        .map(|(i, _)| i)
        .find(|&i| matches!(s.as_bytes().get(i + 1), Some(b'%' | b'{' | b'#')))
}

/// Where `close` first appears outside a string literal (the end of `s` if nowhere).
fn outside_strings(s: &str, close: &str) -> usize {
    let mut quote = None;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match quote {
            Some(_) if escaped => escaped = false,
            Some(_) if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if s[i..].starts_with(close) => return i,
            None if c == '\'' || c == '"' => quote = Some(c),
            None => {}
        }
    }
    s.len()
}

/// Where the `{% endraw %}` that closes a raw block starts.
fn end_of_raw(s: &str) -> usize {
    s.match_indices("{%")
        .map(|(i, _)| i)
        .find(|&i| keyword(&s[i + 2..]).1 == "endraw")
        .unwrap_or(s.len())
}

fn rewrite_tag(inner: &str) -> Cow<'_, str> {
    let (at, word) = keyword(inner);
    let after = &inner[at + word.len()..];
    let bare = after.trim().trim_matches(['-', '+']).trim().is_empty();
    match word {
        "generation" if bare => Cow::Owned(format!("{}with{after}", &inner[..at])),
        "endgeneration" if bare => Cow::Owned(format!("{}endwith{after}", &inner[..at])),
        "for" => checked_loop(inner),
        _ => Cow::Borrowed(inner),
    }
}

/// The first word of a block tag's inside (after `-` / `+` whitespace control), and its offset.
fn keyword(inner: &str) -> (usize, &str) {
    let trimmed = inner.trim_start_matches(['-', '+']).trim_start();
    let at = inner.len() - trimmed.len();
    let len = trimmed
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(trimmed.len());
    (at, &trimmed[..len])
}

/// `for x in EXPR [if ...] [recursive]` with EXPR passed through [`CHECKED_ITERABLE`]; a loop
/// over a bare tuple (`in a, b`), which a call would split into arguments, is left as it is.
fn checked_loop(inner: &str) -> Cow<'_, str> {
    let words = top_level_words(inner);
    let Some(in_at) = words.iter().position(|&(_, w)| w == "in") else {
        return Cow::Borrowed(inner);
    };
    let start = words[in_at].0 + "in".len();
    let tail = &words[in_at + 1..];
    let end = tail
        .iter()
        .find(|&&(_, w)| w == "if" || w == "recursive")
        .map_or_else(|| end_of_expression(inner), |&(i, _)| i);
    let tuple = tail.iter().any(|&(i, w)| w == "," && i < end);
    let expr = inner[start..end].trim();
    if tuple || expr.is_empty() {
        return Cow::Borrowed(inner);
    }
    Cow::Owned(format!(
        "{} {CHECKED_ITERABLE}({expr}) {}",
        &inner[..start],
        &inner[end..]
    ))
}

/// The end of a tag's last expression: before trailing spaces and a `-` / `+` `%}` modifier.
fn end_of_expression(inner: &str) -> usize {
    let trimmed = inner.trim_end();
    let trimmed = trimmed
        .strip_suffix(['-', '+'])
        .unwrap_or(trimmed)
        .trim_end();
    trimmed.len()
}

/// The words and commas of `s` outside string literals and brackets, with their offsets.
fn top_level_words(s: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    let mut depth = 0usize;
    let (mut quote, mut escaped) = (None, false);
    let mut word = None;
    for (i, c) in s.char_indices() {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                _ if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        if c.is_alphanumeric() || c == '_' {
            word.get_or_insert(i);
            continue;
        }
        if let Some(start) = word.take().filter(|_| depth == 0) {
            found.push((start, &s[start..i]));
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => found.push((i, ",")),
            _ => {}
        }
    }
    if let Some(start) = word.filter(|_| depth == 0) {
        found.push((start, &s[start..]));
    }
    found
}
