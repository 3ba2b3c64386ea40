//! Players inside images and audio clips, on the mock backend, which sees a colour in an image
//! cell that holds a pixel of it and hears a quarter second as loud where it peaks: so an
//! answer is planted in one region of a picture or one stretch of a recording, and every
//! estimator under every fill must find it there.

use std::path::Path;

use lmhost::config::ExplanationConfig;
use lmhost::explain::{
    AbsenceKind, AudioPlayers, Estimand, EstimatorKind, Fill, Granularity, ImagePlayers,
    ImageRegions, Region,
};
use lmhost::{explain_run, Config, Outcome, RunOptions};
use lmhost_plugin_api::{Audio, ConversationSnapshot, Image, Message, Part, Role, Turn};
use serde_json::json;

mod common;

use common::{explain_json, mock_config, open};

/// A 64 x 64 mid-gray picture with a red 8 x 8 square at x 36..44, y 20..28: in the 4 x 4
/// grid's cell r6 (row 1, column 2) and the 2 x 2 grid's r1.
fn picture() -> Image {
    let mut rgb = vec![128u8; 64 * 64 * 3];
    for y in 20..28 {
        for x in 36..44 {
            rgb[(y * 64 + x) * 3..][..3].copy_from_slice(&[250, 10, 10]);
        }
    }
    Image::new(64, 64, rgb).unwrap()
}

/// Two seconds at 16 kHz, nearly silent but for a loud burst at 1.0-1.2 s (in the 0.5 s
/// windows' a2) and a quieter one at 0.2-0.4 s, a pause apart.
fn recording() -> Audio {
    let rate = 16_000;
    let samples = (0..2 * rate)
        .map(|i| {
            let t = i as f32 / rate as f32;
            let tone = (t * 2000.0).sin();
            match t {
                t if (1.0..1.2).contains(&t) => 0.8 * tone,
                t if (0.2..0.4).contains(&t) => 0.3 * tone,
                _ => 0.002 * tone,
            }
        })
        .collect::<Vec<f32>>();
    Audio {
        samples: samples.into(),
        sample_rate: rate as u32,
    }
}

fn conversation(media: Part, question: &str) -> ConversationSnapshot {
    let message = Message::new(Role::User, vec![media, Part::text(question)]);
    ConversationSnapshot::new(vec![Turn {
        messages: vec![message].into(),
    }])
    .unwrap()
}

/// The explanation of `reply` after `conversation` on mock, `[explanation]` as `adjust` sets it.
fn explain(
    conversation: &ConversationSnapshot,
    reply: &str,
    adjust: impl FnOnce(&mut ExplanationConfig),
) -> Outcome {
    let mut config = Config::parse(&mock_config(0), Path::new("t.toml")).unwrap();
    config.explanation.budget = 256;
    adjust(&mut config.explanation);
    config.explanation.validate().unwrap();
    let backend = open(&mock_config(0));
    let options = RunOptions {
        reply: Some(reply.into()),
        ..RunOptions::default()
    };
    explain_run::run(&config, &backend, conversation, &options).unwrap()
}

/// The id of the player ranked first, and its value.
fn top(outcome: &Outcome) -> (String, f64) {
    let attributions = &outcome.explanation.attributions;
    let first = attributions.iter().find(|a| a.rank == 1).unwrap();
    (first.player.id.clone(), first.value)
}

const SAMPLED: [EstimatorKind; 6] = [
    EstimatorKind::Permutation,
    EstimatorKind::Antithetic,
    EstimatorKind::Msr,
    EstimatorKind::Loo,
    EstimatorKind::Kernel,
    EstimatorKind::Lasso,
];

/// Every estimator under every fill, and with the regions hidden from attention instead
/// (the mock forgets what it cannot see), ranks the cell that holds the red square first, the
/// answer "red" resting on it alone: exact over a 2 x 2 grid (and the question), the sampled
/// ones over a 4 x 4 grid.
#[test]
fn the_planted_region_ranks_first_with_every_estimator_and_absence() {
    let conversation = conversation(Part::Image { image: picture() }, "What colour is the ball?");
    let absences = [
        (AbsenceKind::Delete, Fill::Gray),
        (AbsenceKind::Delete, Fill::Mean),
        (AbsenceKind::Delete, Fill::Blur),
        (AbsenceKind::Hide, Fill::Gray),
    ];
    for (absence, fill) in absences {
        let outcome = explain(&conversation, "red", |e| {
            e.image_players = ImagePlayers::Grid;
            e.grid = [2, 2];
            (e.absence, e.fill) = (absence, fill);
            e.estimator = EstimatorKind::Exact;
        });
        assert_eq!(outcome.explanation.attributions.len(), 5);
        let (id, value) = top(&outcome);
        assert_eq!(id, "m0.i0.r1", "exact, {absence} {fill}");
        assert!(value > 0.0, "exact, {absence} {fill}: {value}");
        for estimator in SAMPLED {
            let outcome = explain(&conversation, "red", |e| {
                e.image_players = ImagePlayers::Grid;
                (e.absence, e.fill) = (absence, fill);
                e.estimator = estimator;
                if estimator == EstimatorKind::Msr {
                    e.estimand = Estimand::Banzhaf;
                }
            });
            assert_eq!(outcome.explanation.attributions.len(), 17);
            let (id, value) = top(&outcome);
            assert_eq!(id, "m0.i0.r6", "{estimator}, {absence} {fill}");
            assert!(value > 0.0, "{estimator}, {absence} {fill}: {value}");
        }
    }
}

/// With `players = "auto"`, the message is refined into its words and its image (or clip),
/// and that, ranked first, into its regions (or segments): the red square's cell, or the loud
/// burst's window, ranks first there.
#[test]
fn auto_refines_a_message_into_its_media_and_those_into_regions_and_segments() {
    let cases = [
        (
            Part::Image { image: picture() },
            "red",
            "m0.i0",
            16,
            "m0.i0.r6",
        ),
        (
            Part::Audio { audio: recording() },
            "loud",
            "m0.c0",
            4,
            "m0.a2",
        ),
    ];
    for (part, reply, whole, inner, expected) in cases {
        let conversation = conversation(part, "What is it like?");
        let outcome = explain(&conversation, reply, |e| {
            e.players = Granularity::Auto;
            e.image_players = ImagePlayers::Grid;
            (e.audio_players, e.audio_window) = (AudioPlayers::Windows, 0.5);
            e.estimator = EstimatorKind::Kernel;
        });
        let levels = &outcome.refinements;
        assert_eq!(levels.len(), 2, "message, then its parts, then {whole}'s");
        let top = |e: &lmhost::explain::Explanation| {
            let first = e.attributions.iter().find(|a| a.rank == 1).unwrap();
            first.player.id.clone()
        };
        let parts: Vec<&str> = (levels[0].players.players().iter())
            .map(|p| p.id.as_str())
            .collect();
        assert_eq!(parts.last(), Some(&whole), "{parts:?}");
        assert_eq!(top(&levels[0].explanation), whole);
        assert_eq!(levels[1].players.len(), inner);
        assert_eq!(top(&levels[1].explanation), expected);
    }
}

/// Under `hide`, an image or a clip that is not split goes with its message's players, as it
/// does when absent players are deleted: a message of a picture alone (or a recording alone)
/// carries the answer.
#[test]
fn whole_media_is_hidden_with_its_message() {
    let cases = [
        (Part::Image { image: picture() }, "red"),
        (Part::Audio { audio: recording() }, "loud"),
    ];
    for (part, reply) in cases {
        let media = Message::new(Role::User, vec![part]);
        let question = Message::text(Role::User, "What is it like?");
        let conversation = ConversationSnapshot::new(vec![Turn {
            messages: vec![media, question].into(),
        }])
        .unwrap();
        for absence in [AbsenceKind::Delete, AbsenceKind::Hide] {
            let outcome = explain(&conversation, reply, |e| {
                e.absence = absence;
                e.estimator = EstimatorKind::Exact;
            });
            let (id, value) = top(&outcome);
            assert_eq!(id, "m0", "{reply}, {absence}");
            assert!(value > 0.5, "{reply}, {absence}: {value}");
        }
    }
}

/// Regions given with the conversation are the players, with their labels: the ball's box
/// ranks first, the sky's gets nothing.
#[test]
fn given_regions_are_players_with_their_labels() {
    let conversation = conversation(Part::Image { image: picture() }, "What is it?");
    let region = |label: &str, bounds| Region {
        label: Some(label.into()),
        bounds,
    };
    let outcome = explain(&conversation, "red", |e| {
        e.image_players = ImagePlayers::Regions;
        e.regions = vec![ImageRegions {
            message: 0,
            image: 0,
            regions: vec![
                region("sky", [0, 0, 64, 16]),
                region("ball", [34, 18, 46, 30]),
            ],
        }];
    });
    let (id, _) = top(&outcome);
    assert_eq!(id, "m0.i0.r1");
    let players = &outcome.explanation.attributions;
    assert_eq!(
        players[2].player.text,
        "[image region ball [34,18)-[46,30)]"
    );
    assert_eq!(players[1].value, 0.0, "the sky holds no red");
}

/// A recording's segments are players: the window, or the stretch between pauses, that holds
/// the loud burst ranks first for the answer "loud".
#[test]
fn the_loud_segment_ranks_first_in_windows_and_between_pauses() {
    let conversation = conversation(Part::Audio { audio: recording() }, "How does it sound?");
    for absence in [AbsenceKind::Delete, AbsenceKind::Hide] {
        let outcome = explain(&conversation, "loud", |e| {
            e.audio_players = AudioPlayers::Windows;
            e.audio_window = 0.5;
            (e.estimator, e.absence) = (EstimatorKind::Exact, absence);
        });
        assert_eq!(outcome.explanation.attributions.len(), 5);
        assert_eq!(top(&outcome).0, "m0.a2", "{absence}");
        let outcome = explain(&conversation, "loud", |e| {
            e.audio_players = AudioPlayers::Pauses;
            (e.estimator, e.absence) = (EstimatorKind::Exact, absence);
        });
        let segments: Vec<&str> = (outcome.explanation.attributions.iter())
            .map(|a| a.player.text.as_str())
            .collect();
        assert_eq!(segments.len(), 3, "{segments:?}");
        assert_eq!(top(&outcome).0, "m0.a1", "{absence}: {segments:?}");
    }
}

/// Through the CLI: regions from the conversation file, their ids, labels and boxes in the
/// JSON report and the table, and bad settings refused by name.
#[test]
fn the_cli_reads_regions_and_names_bad_settings() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("ball.png");
    let picture = picture();
    image::RgbImage::from_raw(64, 64, picture.rgb.to_vec())
        .unwrap()
        .save(&image)
        .unwrap();
    let conversation = dir.path().join("c.json");
    let content = json!([
        {"type": "image", "path": "ball.png", "regions": [
            {"label": "sky", "box": [0, 0, 64, 16]},
            {"label": "ball", "box": [34, 18, 46, 30]},
        ]},
        {"type": "text", "text": "What is it?"},
    ]);
    let file = json!({"messages": [{"role": "user", "content": content}]});
    std::fs::write(&conversation, file.to_string()).unwrap();
    let config = dir.path().join("mock.toml");
    std::fs::write(&config, mock_config(0)).unwrap();
    let args = |extra: &[&str]| {
        let mut args = vec![
            "--config",
            config.to_str().unwrap(),
            "--conversation",
            conversation.to_str().unwrap(),
            "--reply",
            "red",
            "--image-players",
            "regions",
        ];
        args.extend(extra);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let report = explain_json(&dir.path().join("e.json"), &args(&[]));
    let ball = &report["players"][2];
    assert_eq!(
        (
            ball["id"].clone(),
            ball["label"].clone(),
            ball["box"].clone()
        ),
        (json!("m0.i0.r1"), json!("ball"), json!([34, 18, 46, 30])),
        "{report}"
    );
    assert_eq!(ball["rank"], 1, "{report}");
    for (extra, expected) in [
        (&["--grid", "0x4"][..], "`grid` must be"),
        (
            &["--audio-window", "0.001"][..],
            "`audio_window` must be >= 0.02",
        ),
    ] {
        let stderr = failure(&args(extra));
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
    }
    let file = json!({"messages": [{"role": "user", "content": [
        {"type": "image", "path": "ball.png", "regions": [{"label": "ball", "box": [30, 0, 70, 10]}]},
    ]}]});
    std::fs::write(&conversation, file.to_string()).unwrap();
    for extra in [&[][..], &["--players", "auto"][..]] {
        let stderr = failure(&args(extra));
        assert!(
            stderr.contains("image 0 of message 0 (64x64): region 0 [30, 0, 70, 10]"),
            "{extra:?}: {stderr}"
        );
    }
}

/// The stderr of `lmhost explain <args>`, which must fail.
fn failure(args: &[String]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .arg("explain")
        .args(args)
        .output()
        .unwrap();
    assert!(!output.status.success());
    String::from_utf8(output.stderr).unwrap()
}

/// The HTML page draws the picture with its regions and the recording as a waveform with its
/// segments, each shaded by its value with a hover title, as headless Chromium renders it:
/// the DOM holds one shaded shape per player, and the screenshot shows the top region's shade
/// laid over the picture's gray.
#[test]
fn the_html_page_shades_regions_and_segments() {
    use lmhost::report::html::shade;
    let message = Message::new(
        Role::User,
        vec![
            Part::Image { image: picture() },
            Part::Audio { audio: recording() },
            Part::text("Describe both."),
        ],
    );
    let conversation = ConversationSnapshot::new(vec![Turn {
        messages: vec![message].into(),
    }])
    .unwrap();
    let outcome = explain(&conversation, "red loud", |e| {
        e.image_players = ImagePlayers::Grid;
        e.grid = [2, 2];
        e.audio_players = AudioPlayers::Windows;
        e.audio_window = 0.5;
        e.estimator = EstimatorKind::Exact;
    });
    let attributions = &outcome.explanation.attributions;
    assert_eq!(attributions.len(), 9);
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("e.html");
    std::fs::write(&page, outcome.to_html()).unwrap();
    let url = format!("file://{}", page.display());
    let chromium = |args: &[&str]| common::chromium(&url, args);
    let dom = chromium(&["--dump-dom"]);
    let max = attributions
        .iter()
        .map(|a| a.value.abs())
        .fold(0.0, f64::max);
    for (i, a) in attributions.iter().enumerate().skip(1) {
        let shape = format!("data-p=\"{i}\"");
        let at = dom
            .find(&shape)
            .unwrap_or_else(|| panic!("{} is not drawn", a.player.id));
        let drawn = &dom[at..at + dom[at..].find("</rect>").unwrap()];
        assert!(
            drawn.contains(&format!("fill=\"{}\"", shade(a.value, max))),
            "{drawn}"
        );
        assert!(
            drawn.contains(&format!("<title>{}", a.player.id)),
            "{drawn}"
        );
    }
    let shot = dir.path().join("shot.png");
    chromium(&[
        &format!("--screenshot={}", shot.display()),
        "--window-size=1000,1600",
    ]);
    let shot = image::open(&shot).unwrap().to_rgb8();
    // The top region (r1, over gray) shaded at full strength: shade's colour, at the page's
    // 0.6 opacity for regions, over 128.
    let top = attributions.iter().find(|a| a.rank == 1).unwrap();
    assert_eq!(top.player.id, "m0.i0.r1");
    let alpha = 0.85 * 0.6;
    let blend = |c: f64| (alpha * c + (1.0 - alpha) * 128.0).round() as i32;
    let expected = [blend(255.0), blend(0.0), blend(81.0)];
    let shaded = shot
        .pixels()
        .filter(|p| (0..3).all(|c| (i32::from(p.0[c]) - expected[c]).abs() <= 4))
        .count();
    // r1 is 32 x 32 pixels drawn 3.75 times as large (the picture at 240 CSS pixels): 14,400,
    // less the red square and the outline.
    assert!(shaded > 10_000, "{shaded} pixels of the top region's shade");
}
