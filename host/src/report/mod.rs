//! Reports of an explanation: a terminal table, a JSON document and a self-contained HTML page.

pub mod html;
pub mod json;
mod media;
pub mod table;

use std::borrow::Cow;

use crate::config::ExplanationConfig;
use crate::explain::normalize::normalized;
use crate::explain::{Explanation, Normalizer};
use crate::outcome::Outcome;

impl Outcome {
    /// This outcome as the table and the HTML page show it: each level's values through the
    /// `normalize` setting. `abs_sum` scales the standard errors with the values; the other
    /// normalizers are not linear, so theirs are not shown. Ranks stay those of the computed
    /// values.
    pub(crate) fn shown(&self) -> Cow<'_, Outcome> {
        if self.settings.normalize == Normalizer::Identity {
            return Cow::Borrowed(self);
        }
        let mut shown = self.clone();
        normalize(&mut shown.explanation, &self.settings);
        for level in &mut shown.refinements {
            normalize(&mut level.explanation, &self.settings);
        }
        Cow::Owned(shown)
    }

    /// The JSON report `lmhost explain --json FILE` writes.
    pub fn to_json(&self) -> String {
        json::render(self)
    }

    /// The self-contained HTML page `lmhost explain --html FILE` writes.
    pub fn to_html(&self) -> String {
        html::render(self)
    }
}

/// A level's values, through the `normalize` setting; `None` with `identity`.
pub(crate) fn normalized_values(e: &Explanation, s: &ExplanationConfig) -> Option<Vec<f64>> {
    (s.normalize != Normalizer::Identity).then(|| {
        let values: Vec<f64> = e.attributions.iter().map(|a| a.value).collect();
        normalized(&values, s.normalize, s.normalize_power)
    })
}

fn normalize(e: &mut Explanation, s: &ExplanationConfig) {
    let Some(shown) = normalized_values(e, s) else {
        return;
    };
    let total: f64 = e.attributions.iter().map(|a| a.value.abs()).sum();
    let scale = (s.normalize == Normalizer::AbsSum && total > 0.0).then_some(total);
    for (a, value) in e.attributions.iter_mut().zip(shown) {
        a.value = value;
        a.std_error = scale.and_then(|total| a.std_error.map(|se| se / total));
    }
}

/// How many of the strongest interactions the table and the HTML page list.
pub(crate) const TOP_INTERACTIONS: usize = 10;

/// The ids of `players` (indices into the level's attributions).
pub(crate) fn player_ids<'a>(e: &'a Explanation, players: &[usize]) -> Vec<&'a str> {
    players
        .iter()
        .map(|&p| e.attributions[p].player.id.as_str())
        .collect()
}

/// An interaction's players by id, "m3 × m7".
pub(crate) fn interaction_ids(e: &Explanation, players: &[usize]) -> String {
    player_ids(e, players).join(" × ")
}

/// What a level's interactions are: "k-sii of pairs", "moebius of every subset".
pub(crate) fn interactions_name(s: &ExplanationConfig) -> String {
    let which = match s.interactions {
        crate::explain::Interactions::All => "every subset",
        _ => "pairs",
    };
    format!("{} of {which}", s.interaction_index)
}

/// Shortens `text` to `width` characters on one line, ending in `…` when cut.
pub(crate) fn one_line(text: &str, width: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_whitespace() { ' ' } else { c })
        .collect();
    let flat = flat.trim();
    if flat.chars().count() <= width {
        return flat.to_string();
    }
    let mut out: String = flat.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A number for people: 4 significant digits, no exponent for ordinary magnitudes.
pub(crate) fn number(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    if !x.is_finite() {
        return x.to_string();
    }
    let magnitude = x.abs().log10().floor() as i32;
    if (-4..6).contains(&magnitude) {
        let decimals = (3 - magnitude).clamp(0, 8) as usize;
        format!("{x:.decimals$}")
    } else {
        format!("{x:.3e}")
    }
}

/// `number(x)` cut to at most `width` characters: fewer digits, then an exponent.
pub(crate) fn fit(x: f64, width: usize) -> String {
    let plain = number(x);
    if plain.chars().count() <= width {
        return plain;
    }
    for digits in (0..3).rev() {
        let e = format!("{x:.digits$e}");
        if e.chars().count() <= width {
            return e;
        }
    }
    format!("{x:.0e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_fit_their_columns() {
        assert_eq!(number(-40.3012), "-40.30");
        assert_eq!(fit(0.000_113_6, 8), "1.14e-4");
        assert_eq!(fit(-0.000_113_6, 9), "-1.14e-4");
        assert_eq!(fit(6.579, 9), "6.579");
        assert!(fit(-1.234e-300, 8).chars().count() <= 8);
    }
}
