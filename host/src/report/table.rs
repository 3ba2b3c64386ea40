//! The terminal report: a header, one row per player with a signed bar, and the run's figures,
//! every line at most 100 columns.

use std::fmt::Write;

use super::{fit, interaction_ids, interactions_name, number, one_line, TOP_INTERACTIONS};
use crate::config::ExplanationConfig;
use crate::explain::{
    AudioPlayers, Explanation, Granularity, ImagePlayers, Normalizer, StopReason, Stopped, Trust,
    ValueKind,
};
use crate::outcome::Outcome;
use lmhost_plugin_api::Role;

/// Total width of a table row.
pub const WIDTH: usize = 100;
const TEXT: usize = 29;
/// Wide enough for a run of sentences, `m12.s16-31`.
const ID: usize = 10;
const HALF_BAR: usize = 17;
/// An interaction row's ids and texts: the row as wide as a player's.
const IDS: usize = 24;
const TEXTS: usize = 56;

pub fn render(outcome: &Outcome) -> String {
    let outcome = outcome.shown();
    let e = &outcome.explanation;
    let s = &outcome.settings;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}",
        one_line(&format!("Answer: {}", outcome.reply), WIDTH)
    );
    let _ = writeln!(
        out,
        "{}",
        one_line(
            &format!(
                "{} {} of {} ({}) over {} {} · absence {}{}{} · {}/{}",
                s.estimator,
                s.estimand,
                s.value,
                match (s.value, s.value_mean) {
                    (ValueKind::AnswerLogprob | ValueKind::GeneratedLogprob, true) => "mean",
                    (ValueKind::AnswerLogprob | ValueKind::GeneratedLogprob, false) => "sum",
                    _ => "cosine",
                },
                e.attributions.len(),
                level_name(s),
                s.absence,
                shown_as(s),
                if e.attributions.iter().any(|a| a.std_error.is_some()) {
                    format!(" · seed {}, budget {}", s.seed, s.budget)
                } else {
                    String::new()
                },
                outcome.plugin,
                outcome.model_id,
            ),
            WIDTH
        )
    );
    rows(&mut out, e);
    let _ = writeln!(
        out,
        "v(all) = {}   v(none) = {}",
        number(e.v_all),
        number(e.v_none)
    );
    if let Some(eff) = &e.efficiency {
        let _ = writeln!(
            out,
            "efficiency: sum of values {} = v(all) − v(none) {} (gap {:.1e})",
            number(eff.sum),
            number(eff.expected),
            eff.gap
        );
    }
    interaction_rows(&mut out, e, s);
    if let Some(trust) = &e.trust {
        let _ = writeln!(out, "{}", one_line(&trust_line(trust), WIDTH));
    }
    if let Some(stopped) = &outcome.stopped {
        let _ = writeln!(out, "{}", one_line(&stopped_line(stopped), WIDTH));
    }
    for level in &outcome.refinements {
        let e = &level.explanation;
        let _ = writeln!(
            out,
            "{}",
            one_line(
                &format!(
                    "refined {} into {} parts, the rest present: v(all) − v(without them) = {}",
                    refined(&level.parents),
                    e.attributions.len(),
                    number(e.v_all - e.v_none)
                ),
                WIDTH
            )
        );
        rows(&mut out, e);
        interaction_rows(&mut out, e, s);
    }
    let st = &outcome.stats;
    let _ = writeln!(
        out,
        "coalitions: {} planned, {} unique prompts, {} evaluated, {} from the run directory",
        e.coalitions, e.unique_prompts, st.evaluated, st.reused_from_run_dir
    );
    let _ = writeln!(
        out,
        "prompt tokens: {} computed, {} reused from the kv cache ({}; {} hits, {} misses); {:.2} s",
        st.prompt_tokens_computed,
        st.prompt_tokens_reused,
        if st.kv_cache_enabled { "on" } else { "off" },
        st.kv_cache_hits,
        st.kv_cache_misses,
        st.wall_time_s
    );
    out
}

/// The header and one row per player, bars scaled to the largest |value|.
fn rows(out: &mut String, e: &Explanation) {
    let max = e
        .attributions
        .iter()
        .map(|a| a.value.abs())
        .fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "{:>4} {:<ID$} {:<TEXT$} {:>9} {:>8} {:^w$}",
        "rank",
        "id",
        "text",
        "value",
        "± se",
        format!("−{} … +{}", number(max), number(max)),
        w = 2 * HALF_BAR + 1
    );
    for a in &e.attributions {
        let se = a.std_error.map_or("-".to_string(), |se| fit(se, 8));
        let _ = writeln!(
            out,
            "{:>4} {:<ID$} {:<TEXT$} {:>9} {:>8} {}",
            a.rank,
            one_line(&a.player.id, ID),
            one_line(&a.player.text, TEXT),
            fit(a.value, 9),
            se,
            bar(a.value, max)
        );
    }
}

/// The strongest interactions, one row each: their players' ids and texts, and the value.
fn interaction_rows(out: &mut String, e: &Explanation, s: &ExplanationConfig) {
    let Some(interactions) = &e.interactions else {
        return;
    };
    let _ = writeln!(
        out,
        "strongest interactions ({}; shown as computed):",
        interactions_name(s)
    );
    let _ = writeln!(
        out,
        "{:>4} {:<IDS$} {:<TEXTS$} {:>9}",
        "rank", "ids", "texts", "value"
    );
    for (rank, i) in interactions
        .strongest()
        .into_iter()
        .take(TOP_INTERACTIONS)
        .enumerate()
    {
        let each = TEXTS / i.players.len() - 3;
        let texts: Vec<String> = i
            .players
            .iter()
            .map(|&p| one_line(&e.attributions[p].player.text, each))
            .collect();
        let _ = writeln!(
            out,
            "{:>4} {:<IDS$} {:<TEXTS$} {:>9}",
            rank + 1,
            one_line(&interaction_ids(e, &i.players), IDS),
            one_line(&texts.join(" × "), TEXTS),
            fit(i.value, 9)
        );
    }
}

/// ` · shown abs_sum` when the values go through a normalizer.
pub fn shown_as(s: &ExplanationConfig) -> String {
    match s.normalize {
        Normalizer::Identity => String::new(),
        Normalizer::PowerShift => format!(" · shown {} {}", s.normalize, s.normalize_power),
        other => format!(" · shown {other}"),
    }
}

/// What the first level's players are: `auto` starts from messages.
pub fn level_name(s: &ExplanationConfig) -> String {
    // Documents are players whole, at any granularity.
    let text = match s.players {
        _ if s.roles == [Role::Document] => "documents",
        Granularity::Auto => "messages (auto: refined below)",
        other => other.as_str(),
    };
    let images = match s.image_players {
        ImagePlayers::Whole => None,
        ImagePlayers::Grid => Some("image cells"),
        ImagePlayers::Regions => Some("image regions"),
    };
    let audio = match s.audio_players {
        AudioPlayers::Whole => None,
        AudioPlayers::Windows => Some("audio windows"),
        AudioPlayers::Pauses => Some("audio segments"),
    };
    let media: Vec<&str> = images.into_iter().chain(audio).collect();
    match media.is_empty() {
        true => text.to_string(),
        false => format!("players ({text}, {})", media.join(", ")),
    }
}

/// The distinct parents of a level's players, in order: "m1, m3.s2".
pub fn refined(parents: &[String]) -> String {
    let mut distinct: Vec<&str> = parents.iter().map(String::as_str).collect();
    distinct.dedup();
    distinct.join(", ")
}

/// "trust on 16 held-out coalitions: Spearman (LDS) 0.912, R² 0.843", or why a figure is
/// missing.
pub fn trust_line(t: &Trust) -> String {
    let figure = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
    let head = format!("trust on {} held-out coalitions:", t.holdout);
    match (t.spearman, t.r_squared, t.note) {
        (None, None, note) => format!("{head} no figures ({})", note.unwrap_or("undefined")),
        (spearman, r_squared, note) => format!(
            "{head} Spearman (LDS) {}, R² {}{}",
            figure(spearman),
            figure(r_squared),
            note.map_or(String::new(), |n| format!(" ({n})"))
        ),
    }
}

/// "stopped after round 2 of 4 (budget 250): top 3 unchanged since the previous round", or
/// that the whole budget was spent.
pub fn stopped_line(s: &Stopped) -> String {
    let head = format!(
        "round {} of {} (budget {})",
        s.rounds, s.of_rounds, s.budget
    );
    match s.reason {
        Some(StopReason::Settled { top }) => {
            format!("stopped after {head}: top {top} unchanged since the previous round")
        }
        Some(StopReason::TargetSe { max_se, target }) => format!(
            "stopped after {head}: every standard error ≤ {} (largest {})",
            number(target),
            number(max_se)
        ),
        None => format!("spent the whole budget in {head}: no stopping rule held"),
    }
}

/// A bar of `2 * HALF_BAR + 1` columns: negative values grow left of the axis, positive right.
pub fn bar(value: f64, max: f64) -> String {
    let cells = if max > 0.0 {
        ((value.abs() / max) * HALF_BAR as f64).round() as usize
    } else {
        0
    }
    .min(HALF_BAR);
    let (left, right) = if value < 0.0 { (cells, 0) } else { (0, cells) };
    format!(
        "{}{}│{}{}",
        " ".repeat(HALF_BAR - left),
        "█".repeat(left),
        "█".repeat(right),
        " ".repeat(HALF_BAR - right)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_are_signed_and_fixed_width() {
        assert_eq!(bar(1.0, 1.0).chars().count(), 2 * HALF_BAR + 1);
        assert_eq!(
            bar(-0.5, 1.0).trim_end(),
            format!("{}{}│", " ".repeat(8), "█".repeat(9))
        );
        assert!(bar(0.5, 1.0).starts_with(&format!("{}│█", " ".repeat(HALF_BAR))));
        assert_eq!(bar(0.0, 0.0).trim(), "│");
    }

    #[test]
    fn trust_lines_give_the_figures_or_say_why_not() {
        let t = Trust::of(&[1.0, 2.0, 3.0, 4.0], &[1.0, 2.0, 3.0, 5.0]);
        assert_eq!(
            trust_line(&t),
            "trust on 4 held-out coalitions: Spearman (LDS) 1.000, R² 0.886"
        );
        let t = Trust::of(&[1.0, 2.0], &[1.0, 2.0]);
        assert_eq!(
            trust_line(&t),
            "trust on 2 held-out coalitions: no figures (fewer than 3 held-out coalitions)"
        );
        let t = Trust::of(&[0.0; 3], &[1.0, 2.0, 3.0]);
        assert!(
            trust_line(&t).ends_with("Spearman (LDS) -, R² -6.000 (the predictions are all equal)")
        );
        assert!(trust_line(&t).chars().count() <= WIDTH);
    }

    #[test]
    fn stopped_lines_say_which_rule_held() {
        let mut s = Stopped {
            budget: 250,
            rounds: 2,
            of_rounds: 4,
            reason: Some(StopReason::Settled { top: 3 }),
        };
        assert_eq!(
            stopped_line(&s),
            "stopped after round 2 of 4 (budget 250): top 3 unchanged since the previous round"
        );
        s.reason = Some(StopReason::TargetSe {
            max_se: 0.04,
            target: 0.05,
        });
        assert!(stopped_line(&s).contains("every standard error ≤ 0.05000 (largest 0.04000)"));
        s.reason = None;
        assert!(stopped_line(&s).starts_with("spent the whole budget"));
    }

    #[test]
    fn a_row_fits_the_width() {
        let row = format!(
            "{:>4} {:<ID$} {:<TEXT$} {:>9} {:>8} {}",
            12,
            "m12.s16-31",
            "x".repeat(TEXT),
            "-1234.567",
            "0.0001",
            bar(-1.0, 1.0)
        );
        assert!(row.chars().count() <= WIDTH, "{}", row.chars().count());
    }
}
