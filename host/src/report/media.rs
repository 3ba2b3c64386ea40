//! The HTML page's pictures of media players: each image with its regions shaded by value,
//! each audio clip as a waveform with its segments shaded; every region and segment carries its
//! player (`data-p`) and a hover title with its id, label, value and rank.

use std::fmt::Write as _;

use base64::Engine as _;
use lmhost_explain::{Explanation, Piece, Players};
use lmhost_plugin_api::{Audio, Image, Message, Part};

use super::html::{escape, shade};
use super::number;

/// The widest an image or waveform is drawn, in CSS pixels; an image is embedded at most
/// this wide too (a photo's full pixels would make the page tens of megabytes).
const WIDTH: u32 = 480;
/// The narrowest an image is drawn: a small one is scaled up, its pixels kept square.
const MIN_WIDTH: u32 = 240;

/// Draws the media parts of `message` (number `global` across turns) that hold players.
pub fn draw(h: &mut String, players: &Players, e: &Explanation, global: usize, message: &Message) {
    let max = e
        .attributions
        .iter()
        .map(|a| a.value.abs())
        .fold(0.0, f64::max);
    let pieces = players.pieces(global);
    for (k, part) in message.parts.iter().enumerate() {
        let mine: Vec<(usize, &Piece)> = pieces
            .iter()
            .filter(|(_, piece)| piece.part() == k)
            .copied()
            .collect();
        if mine.is_empty() {
            continue;
        }
        let title = |i: usize| {
            let a = &e.attributions[i];
            let label = match &a.player.piece {
                Some(Piece::Region {
                    label: Some(label), ..
                }) => format!(" {label}"),
                _ => String::new(),
            };
            format!(
                "{}{label} · {} · rank {}",
                a.player.id,
                number(a.value),
                a.rank
            )
        };
        let shaded = |i: usize| shade(e.attributions[i].value, max);
        match part {
            Part::Image { image } => draw_image(h, image, &mine, &title, &shaded),
            Part::Audio { audio } => draw_waveform(h, audio, &mine, &title, &shaded),
            Part::Text { .. } => {}
        }
    }
}

fn draw_image(
    h: &mut String,
    image: &Image,
    pieces: &[(usize, &Piece)],
    title: &dyn Fn(usize) -> String,
    shaded: &dyn Fn(usize) -> String,
) {
    let (w, ht) = (image.width, image.height);
    let shown = w.clamp(MIN_WIDTH, WIDTH);
    let pixelated = match shown > w {
        true => " style=\"image-rendering:pixelated\"",
        false => "",
    };
    let _ = write!(
        h,
        "<div class=\"media\"><svg class=\"image\" viewBox=\"0 0 {w} {ht}\" width=\"{shown}\" \
         height=\"{}\"><image href=\"data:image/png;base64,{}\" width=\"{w}\" height=\"{ht}\" \
         preserveAspectRatio=\"none\"{pixelated}/>",
        u64::from(shown) * u64::from(ht) / u64::from(w.max(1)),
        png_base64(image)
    );
    for &(i, piece) in pieces {
        if let Piece::Region { bounds, .. } = piece {
            let [x0, y0, x1, y1] = *bounds;
            let _ = write!(
                h,
                "<rect class=\"r\" data-p=\"{i}\" x=\"{x0}\" y=\"{y0}\" width=\"{}\" \
                 height=\"{}\" fill=\"{}\"><title>{}</title></rect>",
                x1 - x0,
                y1 - y0,
                shaded(i),
                escape(&title(i))
            );
        }
    }
    h.push_str("</svg></div>");
}

/// The image as a PNG, scaled down to [`WIDTH`] where it is wider, as base64.
fn png_base64(image: &Image) -> String {
    let Some(buffer) = image::RgbImage::from_raw(image.width, image.height, image.rgb.to_vec())
    else {
        return String::new();
    };
    let buffer = match image.width > WIDTH {
        true => {
            let height =
                (u64::from(image.height) * u64::from(WIDTH) / u64::from(image.width)).max(1) as u32;
            image::imageops::thumbnail(&buffer, WIDTH, height)
        }
        false => buffer,
    };
    let mut png = std::io::Cursor::new(Vec::new());
    match buffer.write_to(&mut png, image::ImageFormat::Png) {
        Ok(()) => base64::engine::general_purpose::STANDARD.encode(png.get_ref()),
        Err(_) => String::new(),
    }
}

fn draw_waveform(
    h: &mut String,
    audio: &Audio,
    pieces: &[(usize, &Piece)],
    title: &dyn Fn(usize) -> String,
    shaded: &dyn Fn(usize) -> String,
) {
    const HEIGHT: u32 = 80;
    let n = audio.samples.len().max(1);
    let _ = write!(
        h,
        "<div class=\"media\"><svg class=\"wave\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         width=\"{WIDTH}\" height=\"{HEIGHT}\" preserveAspectRatio=\"none\">"
    );
    let x = |sample: usize| sample as f64 * f64::from(WIDTH) / n as f64;
    for &(i, piece) in pieces {
        if let Piece::Segment { samples, .. } = piece {
            let _ = write!(
                h,
                "<rect class=\"s\" data-p=\"{i}\" x=\"{:.2}\" y=\"0\" width=\"{:.2}\" \
                 height=\"{HEIGHT}\" fill=\"{}\"><title>{}</title></rect>",
                x(samples.start),
                x(samples.end) - x(samples.start),
                shaded(i),
                escape(&title(i))
            );
        }
    }
    // Each column's lowest and highest sample, as one vertical stroke.
    let mid = f64::from(HEIGHT) / 2.0;
    let mut path = String::new();
    let columns = WIDTH as usize;
    for c in 0..columns {
        let chunk =
            &audio.samples[c * n / columns..((c + 1) * n / columns).min(audio.samples.len())];
        let (lo, hi) = chunk
            .iter()
            .fold((0f32, 0f32), |(lo, hi), &s| (lo.min(s), hi.max(s)));
        let _ = write!(
            path,
            "M{c}.5 {:.1}V{:.1}",
            mid - f64::from(hi.clamp(-1.0, 1.0)) * mid,
            mid - f64::from(lo.clamp(-1.0, 1.0)) * mid
        );
    }
    let _ = write!(
        h,
        "<path d=\"{path}\" stroke=\"#1d1d1f\" stroke-width=\"1\" fill=\"none\"/></svg></div>"
    );
}
