//! The HTML report: one self-contained page (inline CSS, no external assets) with the
//! conversation shaded by attribution, the answer, and the table. With per-token attributions
//! it carries their matrix as JSON and one small inline script: hovering or clicking an answer
//! token shades the conversation by that token's column (the same colours as the totals'),
//! and `#token=N` in the address opens with token N pinned.

use std::collections::HashMap;
use std::fmt::Write;

use super::{interaction_ids, interactions_name, number, one_line, TOP_INTERACTIONS};
use crate::config::ExplanationConfig;
use crate::explain::Explanation;
use crate::outcome::Outcome;
use lmhost_plugin_api::{Message, Role};

use crate::explain::players::Players;

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Red for positive attributions, blue for negative, opacity by |value| / max. [`SCRIPT`]'s
/// `shade` computes the same for a token's column.
pub fn shade(value: f64, max: f64) -> String {
    let alpha = if max > 0.0 {
        0.85 * value.abs() / max
    } else {
        0.0
    };
    let (r, g, b) = if value >= 0.0 {
        (255, 0, 81)
    } else {
        (0, 139, 251)
    };
    format!("rgba({r},{g},{b},{alpha:.3})")
}

const STYLE: &str = "
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#1d1d1f;background:#fff}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem}
.msg{border:1px solid #ddd;border-radius:.5rem;padding:.6rem .8rem;margin:.6rem 0}
.role{font-size:.75rem;text-transform:uppercase;letter-spacing:.05em;color:#666;margin-bottom:.3rem}
.text{white-space:pre-wrap;line-height:1.7}
.call{font-family:ui-monospace,monospace;font-size:.85rem;margin-top:.3rem;white-space:pre-wrap}
.p{border-radius:.25rem;padding:.05rem .1rem}
.answer{background:#f5f5f7}
.meta{color:#555;font-size:.9rem}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th{white-space:nowrap}th,td{padding:.25rem .5rem;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.bar{position:relative;width:14rem;height:.9rem}
.axis{position:absolute;left:50%;top:0;bottom:0;border-left:1px solid #999}
.fill{position:absolute;top:.1rem;bottom:.1rem}
.legend span{display:inline-block;color:#fff;padding:0 .4rem;border-radius:.25rem;margin-right:.5rem}
.tok{cursor:pointer;border-radius:.2rem;outline:1px solid #ccc;margin:0 .05rem;white-space:pre}
.tok.on{background:#1d1d1f;color:#fff}
.media{margin-top:.4rem}.media svg{display:block;max-width:100%;height:auto;border-radius:.25rem}
.scroll{overflow-x:auto;margin-bottom:1rem}.pairs{width:auto}td.ids{white-space:nowrap}.pairs td{min-width:2.4rem;text-align:center;font-size:.75rem;cursor:default}.pairs td.self{background:#f5f5f7}
tr[data-i]{cursor:default}.linked{outline:2px solid #1d1d1f;outline-offset:1px}
.media rect{stroke:#fff;stroke-width:.5;vector-effect:non-scaling-stroke}.media rect.r{fill-opacity:.6}
";

/// The token map: shades each player span (`data-p`) by the hovered or pinned answer token's
/// column of the matrix in `#per-token`, or by the totals.
const SCRIPT: &str = r#"
(() => {
  const data = JSON.parse(document.getElementById("per-token").textContent);
  const shade = (v, max) => {
    const a = max > 0 ? (0.85 * Math.abs(v)) / max : 0;
    return (v >= 0 ? "rgba(255,0,81," : "rgba(0,139,251,") + a.toFixed(3) + ")";
  };
  let pinned = null;
  const show = (t) => {
    const values = t === null ? data.totals : data.values.map((row) => row[t]);
    const max = Math.max(0, ...values.map(Math.abs));
    document.querySelectorAll("span.p[data-p]").forEach((span) => {
      span.style.background = shade(values[Number(span.dataset.p)], max);
    });
    document.querySelectorAll("span.tok").forEach((span) => {
      span.classList.toggle("on", Number(span.dataset.t) === t);
    });
    document.getElementById("token-shown").textContent =
      t === null ? "all answer tokens (the totals)" : "answer token " + (t + 1) + ": " + JSON.stringify(data.tokens[t]);
  };
  document.querySelectorAll("span.tok").forEach((span) => {
    const t = Number(span.dataset.t);
    span.addEventListener("mouseenter", () => show(t));
    span.addEventListener("mouseleave", () => show(pinned));
    span.addEventListener("click", () => { pinned = pinned === t ? null : t; show(pinned); });
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") { pinned = null; show(null); } });
  const asked = /^#token=(\d+)$/.exec(location.hash);
  if (asked && Number(asked[1]) < data.tokens.length) pinned = Number(asked[1]);
  show(pinned);
})();
"#;

/// The interaction links: hovering a pair's cell or a subset's row outlines its players' parts
/// in the conversation (`data-p`); `#interaction=3,7` in the address opens with them outlined.
const LINKS: &str = r#"
(() => {
  const link = (players, on) => players.forEach((p) =>
    document.querySelectorAll(`[data-p="${p}"]`).forEach((el) => el.classList.toggle("linked", on)));
  const asked = /^#interaction=([\d,]+)$/.exec(location.hash);
  const pinned = asked ? asked[1].split(",").map(Number) : [];
  document.querySelectorAll("[data-i]").forEach((el) => {
    const players = el.dataset.i.split(",").map(Number);
    el.addEventListener("mouseenter", () => { link(pinned, false); link(players, true); });
    el.addEventListener("mouseleave", () => { link(players, false); link(pinned, true); });
  });
  link(pinned, true);
})();
"#;

pub fn render(outcome: &Outcome) -> String {
    let outcome = outcome.shown();
    let e = &outcome.explanation;
    let s = &outcome.settings;
    let max = e
        .attributions
        .iter()
        .map(|a| a.value.abs())
        .fold(0.0, f64::max);
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>lmhost explain</title><style>{STYLE}</style></head><body>\n"
    );
    let _ = writeln!(
        h,
        "<h1>What made the model answer</h1><p class=\"meta\">{} {} of <b>{}</b> over {} {} \
         · backend {} · model {} · absence {}{}</p>\
         <p class=\"legend meta\"><span style=\"background:{}\">raises the value</span>\
         <span style=\"background:{}\">lowers it</span></p>",
        escape(s.estimator.as_str()),
        escape(s.estimand.as_str()),
        escape(s.value.as_str()),
        e.attributions.len(),
        escape(&super::table::level_name(s)),
        escape(&outcome.plugin),
        escape(&outcome.model_id),
        escape(s.absence.as_str()),
        escape(&super::table::shown_as(s)),
        shade(1.0, 1.0),
        shade(-1.0, 1.0),
    );
    let players = &outcome.players;
    documents(&mut h, players, e, max);
    h.push_str("<h2>Conversation</h2>\n");
    let mut global = 0;
    for (t, turn) in players.conversation().turns.iter().enumerate() {
        for (m, message) in turn.messages.iter().enumerate() {
            global += 1;
            let text = message.text_content();
            let answers = message.tool_call_id.as_ref().into_option();
            let _ = write!(
                h,
                "<div class=\"msg\"><div class=\"role\">{}{}</div><div class=\"text\">",
                message.role.as_str(),
                answers.map_or(String::new(), |id| format!(" · answers {}", escape(id)))
            );
            match players.layout(t, m) {
                None => h.push_str(&escape(&text)),
                Some(layout) => {
                    let mut at = 0;
                    for (player, span) in &layout.players {
                        h.push_str(&escape(&text[at..span.start]));
                        player_span(&mut h, e, *player, &text[span.clone()], max);
                        at = span.end;
                    }
                    h.push_str(&escape(&text[at..]));
                }
            }
            h.push_str("</div>");
            super::media::draw(&mut h, players, e, global - 1, message);
            calls(&mut h, e, global - 1, message, max);
            h.push_str("</div>\n");
        }
    }
    let _ = writeln!(
        h,
        "<h2>Answer</h2><div class=\"msg answer\"><div class=\"role\">assistant</div>\
         <div class=\"text\">{}</div></div>",
        escape(&outcome.reply)
    );
    if let Some(matrix) = &e.per_token {
        token_map(&mut h, &outcome, matrix);
    }
    h.push_str("<h2>Attributions</h2>");
    table(&mut h, e);
    interactions(&mut h, e, s);
    for level in &outcome.refinements {
        let r = &level.explanation;
        let _ = writeln!(
            h,
            "<h2>Refined: {}</h2><p class=\"meta\">{} parts, the rest of the conversation \
             present: v(all) − v(without them) = {}</p>",
            escape(&super::table::refined(&level.parents)),
            r.attributions.len(),
            number(r.v_all - r.v_none)
        );
        table(&mut h, r);
    }
    if let Some(trust) = &e.trust {
        let _ = writeln!(
            h,
            "<p class=\"meta\" id=\"trust\">{}</p>",
            escape(&super::table::trust_line(trust))
        );
    }
    if let Some(stopped) = &outcome.stopped {
        let _ = writeln!(
            h,
            "<p class=\"meta\" id=\"stopped\">{}</p>",
            escape(&super::table::stopped_line(stopped))
        );
    }
    let st = &outcome.stats;
    let _ = writeln!(
        h,
        "<p class=\"meta\">v(all) = {} · v(none) = {}{} · {} coalitions, {} unique prompts, \
         {} evaluated, {} from the run directory · prompt tokens {} computed, {} reused · {:.2} s</p>",
        number(e.v_all),
        number(e.v_none),
        e.efficiency.map_or(String::new(), |eff| format!(
            " · efficiency gap {:.1e}",
            eff.gap
        )),
        e.coalitions,
        e.unique_prompts,
        st.evaluated,
        st.reused_from_run_dir,
        st.prompt_tokens_computed,
        st.prompt_tokens_reused,
        st.wall_time_s
    );
    h.push_str("</body></html>\n");
    h
}

/// Player `player`'s `text`, shaded by its value, with its id, value and rank on hover.
fn player_span(h: &mut String, e: &Explanation, player: usize, text: &str, max: f64) {
    let a = &e.attributions[player];
    let _ = write!(
        h,
        "<span class=\"p\" data-p=\"{player}\" style=\"background:{}\" \
         title=\"{} · {} · rank {}\">{}</span>",
        shade(a.value, max),
        escape(&a.player.id),
        number(a.value),
        a.rank,
        escape(text)
    );
}

/// The conversation's documents, each shaded where it is a player.
fn documents(h: &mut String, players: &Players, e: &Explanation, max: f64) {
    let documents = &players.conversation().documents;
    if documents.is_empty() {
        return;
    }
    h.push_str("<h2>Documents</h2>\n");
    for (k, document) in documents.iter().enumerate() {
        let text = lmhost_plugin_api::document_text(document).unwrap_or_default();
        let _ = write!(
            h,
            "<div class=\"msg\"><div class=\"role\">document d{k}</div><div class=\"text\">"
        );
        let player = (e.attributions.iter())
            .position(|a| a.player.role == Role::Document && a.player.message == k);
        match player {
            Some(player) => player_span(h, e, player, &text, max),
            None => h.push_str(&escape(&text)),
        }
        h.push_str("</div></div>\n");
    }
}

/// The tool calls of message `global`, one a line with its id, each shaded where it is a
/// player.
fn calls(h: &mut String, e: &Explanation, global: usize, message: &Message, max: f64) {
    for (k, call) in message.tool_calls.iter().enumerate() {
        let text = crate::explain::players::call_text(call);
        let _ = write!(h, "<div class=\"call\">{} → ", escape(&call.id));
        let player = (e.attributions.iter())
            .position(|a| a.player.message == global && a.player.call == Some(k));
        match player {
            Some(player) => player_span(h, e, player, &text, max),
            None => h.push_str(&escape(&text)),
        }
        h.push_str("</div>");
    }
}

/// One row per player, each with a bar scaled to the largest |value|.
fn table(h: &mut String, e: &Explanation) {
    let max = e
        .attributions
        .iter()
        .map(|a| a.value.abs())
        .fold(0.0, f64::max);
    h.push_str(
        "<table><tr><th>rank</th><th>id</th><th>text</th>\
         <th>value</th><th>± se</th><th></th></tr>\n",
    );
    for a in &e.attributions {
        let width = if max > 0.0 {
            50.0 * a.value.abs() / max
        } else {
            0.0
        };
        let side = if a.value >= 0.0 {
            "left:50%"
        } else {
            "right:50%"
        };
        let _ = writeln!(
            h,
            "<tr><td class=\"num\">{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td><div class=\"bar\"><div class=\"axis\"></div>\
             <div class=\"fill\" style=\"{side};width:{width:.2}%;background:{}\"></div></div></td></tr>",
            a.rank,
            escape(&a.player.id),
            escape(&one_line(&a.player.text, 80)),
            number(a.value),
            a.std_error.map_or("–".into(), number),
            shade(a.value.signum(), 1.0),
        );
    }
    h.push_str("</table>\n");
}

/// The interactions: the pairs as a matrix shaded like the players, then the strongest subsets
/// listed, each linked to its parts by [`LINKS`].
fn interactions(h: &mut String, e: &Explanation, s: &ExplanationConfig) {
    let Some(values) = &e.interactions else {
        return;
    };
    let pairs: HashMap<(usize, usize), f64> = values
        .values
        .iter()
        .filter_map(|i| match i.players[..] {
            [a, b] => Some(((a, b), i.value)),
            _ => None,
        })
        .collect();
    let max = pairs.values().map(|v| v.abs()).fold(0.0, f64::max);
    let _ = writeln!(
        h,
        "<h2>Interactions</h2><p class=\"meta\">{}, shown as computed: what parts do together \
         beyond what each does alone (red: together they raise the value more than their own \
         effects add up to). Hover a cell or a row to outline its parts above.</p>",
        escape(&interactions_name(s))
    );
    let ids: Vec<String> = e
        .attributions
        .iter()
        .map(|a| escape(&a.player.id))
        .collect();
    h.push_str("<div class=\"scroll\"><table class=\"pairs\" id=\"pair-matrix\"><tr><th></th>");
    for id in &ids {
        let _ = write!(h, "<th>{id}</th>");
    }
    h.push_str("</tr>\n");
    for (a, id) in ids.iter().enumerate() {
        let _ = write!(h, "<tr><th>{id}</th>");
        for (b, other) in ids.iter().enumerate() {
            match pairs.get(&(a.min(b), a.max(b))) {
                Some(&v) if a != b => {
                    let _ = write!(
                        h,
                        "<td data-i=\"{},{}\" style=\"background:{}\" title=\"{id} × {other} · {}\">\
                         {}</td>",
                        a.min(b),
                        a.max(b),
                        shade(v, max),
                        number(v),
                        cell(v),
                    );
                }
                _ => h.push_str("<td class=\"self\"></td>"),
            }
        }
        h.push_str("</tr>\n");
    }
    h.push_str(
        "</table></div>\n<table id=\"strongest\"><tr><th>rank</th><th>ids</th><th>texts</th>\
         <th>value</th><th>± se</th></tr>\n",
    );
    for (rank, i) in values
        .strongest()
        .into_iter()
        .take(TOP_INTERACTIONS)
        .enumerate()
    {
        let players: Vec<String> = i.players.iter().map(usize::to_string).collect();
        let texts: Vec<String> = i
            .players
            .iter()
            .map(|&p| escape(&one_line(&e.attributions[p].player.text, 60)))
            .collect();
        let _ = writeln!(
            h,
            "<tr data-i=\"{}\"><td class=\"num\">{}</td><td class=\"ids\">{}</td><td>{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            players.join(","),
            rank + 1,
            escape(&interaction_ids(e, &i.players)),
            texts.join(" <b>×</b> "),
            number(i.value),
            i.std_error.map_or("–".into(), number),
        );
    }
    let _ = writeln!(h, "</table>\n<script>{LINKS}</script>");
}

/// A matrix cell's value to two places, "0" where that rounds to zero: the LASSO zeroes most
/// pairs, and "-0.00" would read as a sign.
fn cell(v: f64) -> String {
    if v.abs() < 0.005 {
        return "0".into();
    }
    format!("{v:.2}")
}

/// The answer's tokens to hover or pin, the matrix as JSON and the script that reads it.
fn token_map(h: &mut String, outcome: &Outcome, matrix: &[Vec<f64>]) {
    h.push_str("<p class=\"meta\">Shading shows <b id=\"token-shown\">all answer tokens</b>. ");
    h.push_str("Hover a token to see what moved it, click to pin (Escape: the totals):</p>\n");
    h.push_str("<div class=\"text\">");
    for (t, token) in outcome.answer_tokens.iter().enumerate() {
        let _ = write!(
            h,
            "<span class=\"tok\" data-t=\"{t}\" title=\"token {}\">{}</span>",
            t + 1,
            escape(token)
        );
    }
    h.push_str("</div>\n");
    let totals: Vec<f64> = outcome
        .explanation
        .attributions
        .iter()
        .map(|a| a.value)
        .collect();
    let data = serde_json::json!({
        "tokens": outcome.answer_tokens,
        "values": matrix,
        "totals": totals,
    });
    // `</` inside a script element would end it early.
    let json = data.to_string().replace("</", "<\\/");
    let _ = writeln!(
        h,
        "<script type=\"application/json\" id=\"per-token\">{json}</script>\n<script>{SCRIPT}</script>"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_cells_round_to_two_places_without_a_signed_zero() {
        assert_eq!(cell(-0.001), "0");
        assert_eq!(cell(0.0), "0");
        assert_eq!(cell(-0.6174), "-0.62");
        assert_eq!(cell(1.4), "1.40");
    }

    #[test]
    fn escaping_covers_markup_and_quotes() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
