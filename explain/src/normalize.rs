//! nlp-shap's display normalizers: what a report shows in place of each level's values. They
//! change the shown numbers only; the values computed, stored and written as `value` stay.

use crate::settings::Normalizer;

/// `values` as `normalizer` shows them; `power` is `power_shift`'s exponent (> 0). Where a
/// normalizer would divide by zero (all values zero, or all equal) it behaves as nlp-shap's:
/// `abs_sum` and `power_shift` return the values as they are, `min_max` a uniform split.
pub fn normalized(values: &[f64], normalizer: Normalizer, power: f64) -> Vec<f64> {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    match normalizer {
        Normalizer::Identity => values.to_vec(),
        Normalizer::AbsSum => over(values, values, values.iter().map(|v| v.abs()).sum()),
        Normalizer::PowerShift => {
            let powered: Vec<f64> = values.iter().map(|v| (v - min).powf(power)).collect();
            over(values, &powered, powered.iter().sum())
        }
        Normalizer::MinMax if max - min == 0.0 => vec![1.0 / values.len() as f64; values.len()],
        Normalizer::MinMax => {
            let scaled: Vec<f64> = values.iter().map(|v| (v - min) / (max - min)).collect();
            over(values, &scaled, scaled.iter().sum())
        }
    }
}

/// `shown` over `total`; `values` as they are when `total` is zero.
fn over(values: &[f64], shown: &[f64], total: f64) -> Vec<f64> {
    if total == 0.0 {
        return values.to_vec();
    }
    shown.iter().map(|x| x / total).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same numbers as nlp-shap 0.2.1's own normalizers give (written by
    /// scripts/nlp-shap-normalizers.py), to the last bits that a different order of
    /// summation may change.
    #[test]
    fn values_match_nlp_shap() {
        let data: serde_json::Value =
            serde_json::from_str(include_str!("../tests/data/nlp_shap_normalizers.json")).unwrap();
        let floats = |v: &serde_json::Value| -> Vec<f64> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        let cases = data["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 36);
        for case in cases {
            let name = case["normalizer"].as_str().unwrap();
            let normalizer: Normalizer = name.parse().unwrap();
            let power = case["power"].as_f64().unwrap_or(1.0);
            let values = floats(&case["values"]);
            let ours = normalized(&values, normalizer, power);
            let theirs = floats(&case["normalized"]);
            assert_eq!(ours.len(), theirs.len(), "{name} {values:?}");
            for (a, b) in ours.iter().zip(&theirs) {
                assert!(
                    (a - b).abs() <= 1e-15 * b.abs().max(1.0),
                    "{name} {power} {values:?}: {ours:?} vs {theirs:?}"
                );
            }
        }
    }
}
