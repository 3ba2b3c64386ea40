//! Players inside images and audio clips: an image's regions (a grid of cells, or boxes that
//! come with the conversation, as a detector or segmenter outputs them) and an audio clip's
//! segments (fixed windows, or the stretches between pauses); and what an absent one becomes
//! in a coalition's prompt: its pixels painted with a fill, its samples silenced.

use std::ops::Range;

use lmhost_plugin_api::{Audio, Capabilities, ConversationSnapshot, Image, Message, Part};
use serde::Serialize;

use super::error::ExplainError;
pub use super::settings::{AudioPlayers, Fill, ImagePlayers};

/// A labelled box in an image's pixels, `[x0, y0, x1, y1]` (x1 and y1 excluded).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Region {
    pub label: Option<String>,
    #[serde(rename = "box")]
    pub bounds: [u32; 4],
}

/// The regions of image `image` (counted within its message) of message `message` (counted
/// across turns), as the conversation gives them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ImageRegions {
    pub message: usize,
    pub image: usize,
    pub regions: Vec<Region>,
}

/// Which media players to make, and how an absent one is filled.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaSpec {
    pub images: ImagePlayers,
    /// With [`ImagePlayers::Grid`]: `[rows, columns]`.
    pub grid: [u32; 2],
    pub audio: AudioPlayers,
    /// With [`AudioPlayers::Windows`]: each window's length in seconds.
    pub audio_window: f64,
    pub fill: Fill,
    /// With [`ImagePlayers::Regions`]: the regions of each image that has some; an image
    /// without any is one region, itself.
    pub regions: Vec<ImageRegions>,
}

impl Default for MediaSpec {
    fn default() -> Self {
        MediaSpec {
            images: ImagePlayers::Whole,
            grid: [4, 4],
            audio: AudioPlayers::Whole,
            audio_window: 1.0,
            fill: Fill::Gray,
            regions: Vec::new(),
        }
    }
}

/// Where a media player lies in its message: part `part`, and the box or samples it covers.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Piece {
    Region {
        #[serde(skip)]
        part: usize,
        #[serde(rename = "box")]
        bounds: [u32; 4],
        #[serde(skip_serializing_if = "Option::is_none")]
        label: Option<String>,
    },
    Segment {
        #[serde(skip)]
        part: usize,
        #[serde(skip)]
        samples: Range<usize>,
        /// Seconds from the clip's start.
        start: f64,
        end: f64,
    },
}

impl Piece {
    /// The index of the message part it lies in.
    pub fn part(&self) -> usize {
        match self {
            Piece::Region { part, .. } | Piece::Segment { part, .. } => *part,
        }
    }

    /// What a report shows for it.
    pub fn text(&self) -> String {
        match self {
            Piece::Region { bounds, label, .. } => {
                let [x0, y0, x1, y1] = bounds;
                let at = format!("[{x0},{y0})-[{x1},{y1})");
                match label {
                    Some(label) => format!("[image region {label} {at}]"),
                    None => format!("[image region {at}]"),
                }
            }
            Piece::Segment { start, end, .. } => format!("[audio {start:.2}-{end:.2} s]"),
        }
    }
}

/// Refuses, before any work, media players of a conversation's images or audio on a backend
/// that does not take them, and `hide` on one that cannot hide; each error names the setting
/// and the backends that can.
pub fn check_backend(
    spec: &MediaSpec,
    hide: bool,
    conversation: &ConversationSnapshot,
    caps: &Capabilities,
) -> Result<(), ExplainError> {
    let refuse = |setting: String, needs: &str| {
        Err(ExplainError::Setting {
            setting,
            needs: needs.into(),
        })
    };
    if spec.images != ImagePlayers::Whole && conversation.has_images() && !caps.image_input {
        let setting = format!("image_players = \"{}\"", spec.images);
        return refuse(
            setting,
            "sees images (candle with Gemma 3 or SmolVLM, or mock)",
        );
    }
    if spec.audio != AudioPlayers::Whole && conversation.has_audio() && !caps.audio_input {
        let setting = format!("audio_players = \"{}\"", spec.audio);
        return refuse(setting, "hears audio (candle with Whisper, or mock)");
    }
    if hide && !caps.hides {
        return refuse(
            "absence = \"hide\"".into(),
            "can hide parts of a prompt from attention (candle or mock); use \
             absence = \"delete\" or \"pad\"",
        );
    }
    Ok(())
}

/// The media players of `message` (number `global` across turns): their ids and pieces, in
/// part order. An error names a region that lies outside its image or has no area, a label
/// given twice, or a grid with more cells than the image has pixels.
pub fn pieces(
    message: &Message,
    global: usize,
    spec: &MediaSpec,
) -> Result<Vec<(String, Piece)>, ExplainError> {
    let mut out = Vec::new();
    let (mut images, mut segments) = (0, 0);
    for (part, content) in message.parts.iter().enumerate() {
        match content {
            Part::Image { image } if spec.images != ImagePlayers::Whole => {
                out.extend(region_pieces(image, (global, part, images), spec)?);
                images += 1;
            }
            Part::Image { .. } => images += 1,
            Part::Audio { audio } if spec.audio != AudioPlayers::Whole => {
                let rate = f64::from(audio.sample_rate.max(1));
                for samples in audio_segments(audio, spec) {
                    let (start, end) = (samples.start as f64 / rate, samples.end as f64 / rate);
                    let piece = Piece::Segment {
                        part,
                        samples,
                        start,
                        end,
                    };
                    out.push((format!("m{global}.a{segments}"), piece));
                    segments += 1;
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The region players of `image`, part `part` and image `index` of message `global`.
pub fn region_pieces(
    image: &Image,
    (global, part, index): (usize, usize, usize),
    spec: &MediaSpec,
) -> Result<Vec<(String, Piece)>, ExplainError> {
    let regions = image_regions(image, global, index, spec)?;
    Ok((regions.into_iter().enumerate())
        .map(|(r, region)| {
            let piece = Piece::Region {
                part,
                bounds: region.bounds,
                label: region.label,
            };
            (format!("m{global}.i{index}.r{r}"), piece)
        })
        .collect())
}

/// The media of `message` (number `global`) that `spec` splits, each whole, in part order: an
/// image as `m2.i0` (a region that is all of it), an audio clip as `m2.c0` (a segment that is
/// all of it). `players = "auto"` refines a message into these, then these into their regions
/// and segments ([`inner_pieces`]).
pub fn whole_media(message: &Message, global: usize, spec: &MediaSpec) -> Vec<(String, Piece)> {
    let (mut images, mut clips) = (0, 0);
    let mut out = Vec::new();
    for (part, content) in message.parts.iter().enumerate() {
        match content {
            Part::Image { image } if spec.images != ImagePlayers::Whole => {
                let piece = Piece::Region {
                    part,
                    bounds: [0, 0, image.width, image.height],
                    label: None,
                };
                out.push((format!("m{global}.i{images}"), piece));
                images += 1;
            }
            Part::Audio { audio } if spec.audio != AudioPlayers::Whole => {
                let n = audio.samples.len();
                let piece = Piece::Segment {
                    part,
                    samples: 0..n,
                    start: 0.0,
                    end: n as f64 / f64::from(audio.sample_rate.max(1)),
                };
                out.push((format!("m{global}.c{clips}"), piece));
                clips += 1;
            }
            _ => {}
        }
    }
    out
}

/// The regions or segments of the media part that `whole` (from [`whole_media`]) covers, with
/// the ids they have when the message splits straight away.
pub fn inner_pieces(
    message: &Message,
    global: usize,
    whole: &Piece,
    spec: &MediaSpec,
) -> Vec<(String, Piece)> {
    let part = whole.part();
    match &message.parts[part] {
        Part::Image { image } => {
            let index = kind_index(message, part);
            region_pieces(image, (global, part, index), spec).unwrap_or_default()
        }
        Part::Audio { .. } => {
            let only_audio = MediaSpec {
                images: ImagePlayers::Whole,
                ..spec.clone()
            };
            (pieces(message, global, &only_audio).unwrap_or_default())
                .into_iter()
                .filter(|(_, piece)| piece.part() == part)
                .collect()
        }
        Part::Text { .. } => Vec::new(),
    }
}

/// Which of `message`'s parts of its kind part `part` is (image 0, 1, ... or clip 0, 1, ...):
/// the parts of that kind before it, as the plugin API's `ImageBox` and `AudioSpan` count.
pub fn kind_index(message: &Message, part: usize) -> usize {
    let Some(kind) = message.parts.get(part).map(std::mem::discriminant) else {
        return 0;
    };
    (message.parts[..part].iter())
        .filter(|p| std::mem::discriminant(*p) == kind)
        .count()
}

/// The regions image `index` of message `message` splits into, checked against its size.
fn image_regions(
    image: &Image,
    message: usize,
    index: usize,
    spec: &MediaSpec,
) -> Result<Vec<Region>, ExplainError> {
    let (w, h) = (image.width, image.height);
    let named = |what: String| {
        ExplainError::Players(format!(
            "image {index} of message {message} ({w}x{h}): {what}"
        ))
    };
    let regions = match spec.images {
        ImagePlayers::Grid => {
            let [rows, cols] = spec.grid;
            if rows == 0 || cols == 0 || rows > h || cols > w {
                return Err(named(format!(
                    "a grid of {rows} x {cols} cells needs 1 to {h} rows and 1 to {w} columns"
                )));
            }
            grid(w, h, rows, cols)
        }
        ImagePlayers::Regions | ImagePlayers::Whole => {
            let given = spec
                .regions
                .iter()
                .find(|r| r.message == message && r.image == index);
            match given {
                Some(given) => given.regions.clone(),
                None => vec![Region {
                    label: None,
                    bounds: [0, 0, w, h],
                }],
            }
        }
    };
    for (k, region) in regions.iter().enumerate() {
        let [x0, y0, x1, y1] = region.bounds;
        if x0 >= x1 || y0 >= y1 || x1 > w || y1 > h {
            return Err(named(format!(
                "region {k} [{x0}, {y0}, {x1}, {y1}] must have x0 < x1 <= {w} and y0 < y1 <= {h}"
            )));
        }
        let label = region.label.as_deref();
        if label.is_some() && regions[..k].iter().any(|r| r.label.as_deref() == label) {
            return Err(named(format!(
                "the label {:?} is given to two regions; labels name one region each",
                region.label.as_deref().unwrap_or_default()
            )));
        }
    }
    Ok(regions)
}

/// `rows x cols` cells of a `w x h` image, row by row, their edges at whole pixels.
pub fn grid(w: u32, h: u32, rows: u32, cols: u32) -> Vec<Region> {
    let edge = |i: u32, n: u32, size: u32| (u64::from(i) * u64::from(size) / u64::from(n)) as u32;
    (0..rows)
        .flat_map(|r| (0..cols).map(move |c| (r, c)))
        .map(|(r, c)| Region {
            label: None,
            bounds: [
                edge(c, cols, w),
                edge(r, rows, h),
                edge(c + 1, cols, w),
                edge(r + 1, rows, h),
            ],
        })
        .collect()
}

/// The segments of `audio`, as sample ranges covering it.
fn audio_segments(audio: &Audio, spec: &MediaSpec) -> Vec<Range<usize>> {
    let n = audio.samples.len();
    match spec.audio {
        AudioPlayers::Windows => {
            let step = ((spec.audio_window * f64::from(audio.sample_rate)) as usize).max(1);
            (0..n).step_by(step).map(|s| s..(s + step).min(n)).collect()
        }
        AudioPlayers::Pauses => pauses(&audio.samples, audio.sample_rate),
        AudioPlayers::Whole => std::iter::once(0..n).collect(),
    }
}

/// The stretches of `samples` between pauses, covering them: a pause is at least
/// [`PAUSE_SECONDS`] of 20 ms frames whose RMS is below a tenth (-20 dB) of the loudest
/// frame's; each is cut at its middle. A clip without one is one segment.
pub fn pauses(samples: &[f32], rate: u32) -> Vec<Range<usize>> {
    let frame = (rate as usize / 50).max(1);
    let rms: Vec<f32> = samples
        .chunks(frame)
        .map(|f| (f.iter().map(|s| s * s).sum::<f32>() / f.len() as f32).sqrt())
        .collect();
    let loudest = rms.iter().copied().fold(0.0, f32::max);
    let quiet: Vec<bool> = rms.iter().map(|&r| r < loudest / 10.0).collect();
    let min_frames = (PAUSE_SECONDS * 50.0).ceil() as usize;
    let mut cuts = Vec::new();
    let mut k = 0;
    while k < quiet.len() {
        let run = quiet[k..].iter().take_while(|&&q| q).count();
        // A pause inside the clip, not a quiet start or end.
        if run >= min_frames && k > 0 && k + run < quiet.len() {
            cuts.push((k + run / 2) * frame);
        }
        k += run.max(1);
    }
    let mut edges = vec![0];
    edges.extend(cuts);
    edges.push(samples.len());
    edges.windows(2).map(|e| e[0]..e[1]).collect()
}

/// The shortest quiet stretch that counts as a pause, in seconds.
pub const PAUSE_SECONDS: f64 = 0.2;

/// `image` wholly painted with `fill`: where an absent region's pixels come from.
pub fn filled(image: &Image, fill: Fill) -> Image {
    let rgb: Vec<u8> = match fill {
        Fill::Gray => vec![128; image.rgb.len()],
        Fill::Mean => {
            let pixels = (image.rgb.len() / 3).max(1) as u64;
            let mut sums = [0u64; 3];
            for pixel in image.rgb.chunks(3) {
                for (s, &v) in sums.iter_mut().zip(pixel) {
                    *s += u64::from(v);
                }
            }
            let mean = sums.map(|s| (s / pixels) as u8);
            mean.iter().copied().cycle().take(image.rgb.len()).collect()
        }
        Fill::Blur => {
            let buffer = image::RgbImage::from_raw(image.width, image.height, image.rgb.to_vec())
                .expect("an Image holds width x height RGB pixels");
            let sigma = image.width.max(image.height) as f32 / 10.0;
            image::imageops::blur(&buffer, sigma.max(1.0)).into_raw()
        }
    };
    Image {
        width: image.width,
        height: image.height,
        rgb: rgb.into(),
    }
}

/// `image` with the pixels of `boxes` taken from `absent` (the same size).
pub fn painted(image: &Image, absent: &Image, boxes: &[[u32; 4]]) -> Image {
    let mut rgb = image.rgb.to_vec();
    let row = image.width as usize * 3;
    for &[x0, y0, x1, y1] in boxes {
        for y in y0 as usize..y1 as usize {
            let span = y * row + x0 as usize * 3..y * row + x1 as usize * 3;
            rgb[span.clone()].copy_from_slice(&absent.rgb[span]);
        }
    }
    Image {
        width: image.width,
        height: image.height,
        rgb: rgb.into(),
    }
}

/// `audio` with the samples of `ranges` silenced.
pub fn silenced(audio: &Audio, ranges: &[Range<usize>]) -> Audio {
    let mut samples = audio.samples.to_vec();
    for range in ranges {
        samples[range.clone()].fill(0.0);
    }
    Audio {
        samples: samples.into(),
        sample_rate: audio.sample_rate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Image players on a backend that sees no images, audio players on one that hears no
    /// audio, and `hide` on one that cannot hide are refused by setting; media the
    /// conversation does not hold ask nothing of the backend.
    #[test]
    fn media_players_ask_the_backend_for_what_they_need() {
        let image = Image::new(2, 2, vec![0; 12]).unwrap();
        let message = Message::new(
            lmhost_plugin_api::Role::User,
            vec![Part::Image { image }, Part::text("What is it?")],
        );
        let conversation = ConversationSnapshot::new(vec![lmhost_plugin_api::Turn {
            messages: vec![message].into(),
        }])
        .unwrap();
        let grid = MediaSpec {
            images: ImagePlayers::Grid,
            ..MediaSpec::default()
        };
        let windows = MediaSpec {
            audio: AudioPlayers::Windows,
            ..MediaSpec::default()
        };
        let blind = Capabilities::default();
        let err = check_backend(&grid, false, &conversation, &blind).unwrap_err();
        assert!(err
            .to_string()
            .contains("`image_players = \"grid\"` needs a backend that sees images"));
        let sees = Capabilities {
            image_input: true,
            ..blind
        };
        assert!(check_backend(&grid, false, &conversation, &sees).is_ok());
        assert!(check_backend(&windows, false, &conversation, &blind).is_ok());
        let err = check_backend(&grid, true, &conversation, &sees).unwrap_err();
        assert!(err
            .to_string()
            .contains("`absence = \"hide\"` needs a backend that can hide"));
        let hides = Capabilities {
            hides: true,
            ..sees
        };
        assert!(check_backend(&grid, true, &conversation, &hides).is_ok());
    }

    #[test]
    fn a_grid_covers_the_image_once() {
        let cells = grid(10, 7, 3, 4);
        assert_eq!(cells.len(), 12);
        let area: u32 = cells
            .iter()
            .map(|c| (c.bounds[2] - c.bounds[0]) * (c.bounds[3] - c.bounds[1]))
            .sum();
        assert_eq!(area, 70);
        assert_eq!(cells[0].bounds, [0, 0, 2, 2]);
        assert_eq!(cells[11].bounds, [7, 4, 10, 7]);
    }

    /// Two bursts of tone with a 300 ms pause between them split at the pause; the quiet
    /// start and end stay with their neighbours.
    #[test]
    fn pauses_split_speech_where_it_stops() {
        let rate = 1000;
        let tone = |n: usize| (0..n).map(|i| (i as f32 * 0.3).sin() * 0.5);
        let quiet = |n: usize| std::iter::repeat_n(0.001f32, n);
        let samples: Vec<f32> = quiet(100)
            .chain(tone(400))
            .chain(quiet(300))
            .chain(tone(500))
            .chain(quiet(100))
            .collect();
        let segments = pauses(&samples, rate);
        assert_eq!(segments.len(), 2, "{segments:?}");
        let cut = segments[0].end;
        assert!((500..800).contains(&cut), "{cut}");
        assert_eq!(segments[1].end, samples.len());
        let one = pauses(&tone(1000).collect::<Vec<_>>(), rate);
        assert_eq!((one.len(), one[0].clone()), (1, 0..1000));
    }

    #[test]
    fn bad_regions_are_named() {
        let image = Image::new(4, 3, vec![0; 36]).unwrap();
        let message = Message::new(lmhost_plugin_api::Role::User, vec![Part::Image { image }]);
        let regions = |regions: Vec<Region>| MediaSpec {
            images: ImagePlayers::Regions,
            regions: vec![ImageRegions {
                message: 2,
                image: 0,
                regions,
            }],
            ..MediaSpec::default()
        };
        let region = |label: &str, bounds| Region {
            label: Some(label.into()),
            bounds,
        };
        let outside = regions(vec![region("dog", [0, 0, 5, 3])]);
        let err = pieces(&message, 2, &outside).unwrap_err().to_string();
        assert!(
            err.contains("image 0 of message 2 (4x3): region 0"),
            "{err}"
        );
        let twice = regions(vec![
            region("dog", [0, 0, 2, 2]),
            region("dog", [2, 0, 4, 2]),
        ]);
        let err = pieces(&message, 2, &twice).unwrap_err().to_string();
        assert!(err.contains("\"dog\" is given to two regions"), "{err}");
        let grid = MediaSpec {
            images: ImagePlayers::Grid,
            grid: [4, 2],
            ..MediaSpec::default()
        };
        let err = pieces(&message, 2, &grid).unwrap_err().to_string();
        assert!(err.contains("1 to 3 rows"), "{err}");
        let ok = regions(vec![region("dog", [1, 1, 3, 3])]);
        let found = pieces(&message, 2, &ok).unwrap();
        assert_eq!(found[0].0, "m2.i0.r0");
    }

    #[test]
    fn painting_takes_the_fill_inside_the_boxes_only() {
        let image = Image::new(
            2,
            2,
            vec![10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120],
        )
        .unwrap();
        let gray = painted(&image, &filled(&image, Fill::Gray), &[[1, 0, 2, 1]]);
        assert_eq!(gray.rgb[..6], [10, 20, 30, 128, 128, 128]);
        assert_eq!(gray.rgb[6..], image.rgb[6..]);
        let mean = filled(&image, Fill::Mean);
        assert_eq!(mean.rgb[..3], [55, 65, 75]);
    }
}
