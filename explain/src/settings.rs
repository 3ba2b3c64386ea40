//! The choices an explanation is made of, named as in the config file and on the command line.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Defines a unit enum whose variants have snake_case names used by serde, `FromStr` and
/// `Display`; an unknown name is refused with the list of known ones.
macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? } default $default:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl Default for $name {
            fn default() -> Self { $name::$default }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(format!(
                        "unknown {} `{s}`; expected one of: {}",
                        stringify!($name).to_lowercase(),
                        Self::NAMES.join(", ")
                    )),
                }
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

named_enum! {
    /// What an absent image region is painted with: mid gray, the image's mean colour, or the
    /// image blurred (a Gaussian of a tenth of its longer side, which washes out an object a
    /// few times smaller than the image), as captum and PixelSHAP fill masked regions.
    Fill { Gray = "gray", Mean = "mean", Blur = "blur" } default Gray
}

named_enum! {
    /// Which players an image splits into: none (it goes with its message), a grid of cells,
    /// or the regions the conversation gives it.
    ImagePlayers { Whole = "whole", Grid = "grid", Regions = "regions" } default Whole
}

named_enum! {
    /// Which players an audio clip splits into: none (it goes with its message), fixed
    /// windows, or the stretches between its pauses.
    AudioPlayers { Whole = "whole", Windows = "windows", Pauses = "pauses" } default Whole
}

named_enum! {
    /// What one player is. `auto` starts from messages and refines the strongest (see
    /// [`crate::hierarchy`]).
    Granularity {
        Messages = "messages",
        Sentences = "sentences",
        Words = "words",
        Auto = "auto",
    } default Messages
}

named_enum! {
    /// What happens to an absent player's text.
    AbsenceKind {
        Delete = "delete",
        Pad = "pad",
        Neutral = "neutral",
        Hide = "hide",
    } default Delete
}

named_enum! {
    /// The value of a coalition.
    ValueKind {
        AnswerLogprob = "answer_logprob",
        GeneratedLogprob = "generated_logprob",
        EmbeddingCosine = "embedding_cosine",
        TfidfCosine = "tfidf_cosine",
    } default AnswerLogprob
}

named_enum! {
    /// How attributions are computed from coalition values.
    EstimatorKind {
        /// Every coalition: 2^n values.
        Exact = "exact",
        /// Monte Carlo over random permutations (Castro et al. 2009).
        Permutation = "permutation",
        /// Permutations in antithetic pairs, each with its reverse (Mitchell et al. 2022).
        Antithetic = "antithetic",
        /// Uniform random coalitions with maximum sample reuse, for Banzhaf (Wang & Jia 2023).
        Msr = "msr",
        /// Leave-one-out: v(N) - v(N without i), n + 1 values; a baseline, not Shapley.
        Loo = "loo",
        /// KernelSHAP: weighted least squares over paired coalitions (Lundberg & Lee 2017;
        /// Covert & Lee 2021).
        Kernel = "kernel",
        /// ContextCite: a sparse linear surrogate fitted by the LASSO on uniform random
        /// ablations, its penalty chosen by cross-validation (Cohen-Wang et al. 2024).
        Lasso = "lasso",
    } default Exact
}

named_enum! {
    /// How a report shows the values (nlp-shap's normalizers, [`crate::normalize`]); the values
    /// computed and stored stay as they are.
    Normalizer {
        Identity = "identity",
        /// Each value over the sum of their absolute values.
        AbsSum = "abs_sum",
        /// Scaled to [0, 1] between the smallest and the largest, then to a sum of one.
        MinMax = "min_max",
        /// Shifted so the smallest is 0, raised to `normalize_power`, then to a sum of one.
        PowerShift = "power_shift",
    } default Identity
}

named_enum! {
    /// Which attribution: Shapley weighs coalitions by size, Banzhaf uniformly.
    Estimand { Shapley = "shapley", Banzhaf = "banzhaf" } default Shapley
}

/// What happens to absent players.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Absence {
    /// Their text is removed (and a message left empty with it).
    Delete,
    /// Their text is replaced by `placeholder`.
    Pad { placeholder: String },
    /// Their text is replaced by `fill` once per character (nlp-shap's `neutral`): the prompt
    /// keeps each player's width, so positions after it do not move.
    Neutral { fill: char },
    /// Their text stays, hidden from the attention of the last message and the answer (a
    /// backend's `score_hidden`): the messages before the last are computed once for every
    /// coalition. A coalition's prompt (its key and order) is its `Delete` rendering.
    Hide,
}

impl Absence {
    pub fn pad(placeholder: impl Into<String>) -> Self {
        Absence::Pad {
            placeholder: placeholder.into(),
        }
    }

    /// `placeholder` is `Pad`'s text, and `Neutral`'s fill character (its first).
    pub fn new(kind: AbsenceKind, placeholder: &str) -> Self {
        match kind {
            AbsenceKind::Delete => Absence::Delete,
            AbsenceKind::Pad => Absence::pad(placeholder),
            AbsenceKind::Neutral => Absence::Neutral {
                fill: placeholder.chars().next().unwrap_or('_'),
            },
            AbsenceKind::Hide => Absence::Hide,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_known() {
        for name in EstimatorKind::NAMES {
            assert_eq!(name.parse::<EstimatorKind>().unwrap().as_str(), *name);
        }
        let err = "lime".parse::<EstimatorKind>().unwrap_err();
        assert!(
            err.contains("exact, permutation, antithetic, msr, loo, kernel, lasso"),
            "{err}"
        );
    }
}

named_enum! {
    /// Which interactions an explanation adds to its attributions ([`crate::interactions`]):
    /// none, every pair of players (`exact`, or `lasso`'s surrogate with pairs), or every
    /// subset (`exact` over a few players only).
    Interactions { None = "none", Pairs = "pairs", All = "all" } default None
}

named_enum! {
    /// How an interaction is measured: k-SII (the pairs' and the players' values sum to the
    /// total, like Shapley values), SII (the Shapley interaction index) or the Möbius transform
    /// (each subset's effect that no smaller subset has).
    InteractionIndex { KSii = "k-sii", Sii = "sii", Moebius = "moebius" } default KSii
}
