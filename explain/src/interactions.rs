//! Interaction indices: what players do together beyond what each does alone, from the same
//! coalition values as the attributions (no model call of their own).
//!
//! Every index here comes from the Möbius transform of the game, as shapiq's `ExactComputer`
//! computes them (the reference test checks lmhost against it, `tests/data/shapiq_games.json`):
//! - **Möbius** m(S) = Σ_{T⊆S} (-1)^{|S|-|T|} v(T): the effect of S that no subset of it has
//!   (Harsanyi dividends); the values of every order sum back to v(N) - v(∅).
//! - **SII**, the Shapley interaction index (Grabisch & Roubens 1999):
//!   SII(S) = Σ_{T⊇S} m(T) / (|T| - |S| + 1); SII of one player is its Shapley value.
//! - **k-SII** (Bordt & von Luxburg 2023): SII aggregated to order k with the Bernoulli numbers,
//!   k-SII(S) = Σ_{T⊇S, |T|≤k} B_{|T|-|S|} SII(T). Its values of orders 1 to k sum to
//!   v(N) - v(∅), like Shapley values; at order 2 a pair's k-SII is its SII and a player's is its
//!   Shapley value less half its pairs'.

use serde::Serialize;

use crate::coalition::Coalition;
use crate::error::ExplainError;
use crate::settings::{InteractionIndex, Interactions};

/// `interactions = "all"` lists all 2^n - 1 subsets: past this many players the list outgrows
/// any report (8,191 entries at 13).
pub const MAX_ALL_ORDERS_PLAYERS: usize = 12;

/// One subset's interaction value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Interaction {
    /// Player indices, ascending.
    pub players: Vec<usize>,
    pub value: f64,
    /// Standard error of a sampled estimate; `None` for exact.
    pub std_error: Option<f64>,
}

impl Interaction {
    /// A value with no standard error: exact, or a surrogate's weight.
    pub fn new(players: Vec<usize>, value: f64) -> Interaction {
        Interaction {
            players,
            value,
            std_error: None,
        }
    }
}

/// Every subset of 1 to `order` players with its value under `index`: by size, then in
/// lexicographic order of the player indices.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InteractionValues {
    pub index: InteractionIndex,
    pub order: usize,
    pub values: Vec<Interaction>,
}

impl InteractionValues {
    /// The subsets of two or more players, strongest (largest |value|) first.
    pub fn strongest(&self) -> Vec<&Interaction> {
        let mut joint: Vec<&Interaction> =
            self.values.iter().filter(|i| i.players.len() > 1).collect();
        joint.sort_by(|a, b| b.value.abs().total_cmp(&a.value.abs()));
        joint
    }
}

impl InteractionValues {
    /// What the players of `present` add to v(∅) by these values' second-order picture: each
    /// present player's own effect and each present pair's; `None` beyond pairs. A player's SII
    /// is its Shapley value, which holds half of each of its pairs: that half comes off.
    pub fn gain(&self, present: &Coalition) -> Option<f64> {
        if self.order > 2 {
            return None;
        }
        let mut sum = 0.0;
        for i in &self.values {
            let inside = i.players.iter().filter(|&&p| present.contains(p)).count();
            if inside == i.players.len() {
                sum += i.value;
            }
            if self.index == InteractionIndex::Sii && i.players.len() == 2 {
                sum -= inside as f64 * i.value / 2.0;
            }
        }
        Some(sum)
    }
}

/// The largest subset an `interactions` setting asks for among `n` players; refuses `all` over
/// more than [`MAX_ALL_ORDERS_PLAYERS`].
pub fn order(interactions: Interactions, n: usize) -> Result<usize, ExplainError> {
    match interactions {
        Interactions::None => Ok(0),
        Interactions::Pairs => Ok(2.min(n)),
        Interactions::All if n > MAX_ALL_ORDERS_PLAYERS => Err(ExplainError::Estimator(format!(
            "`interactions = \"all\"` lists every subset of the {n} players (2^{n} - 1 of \
             them), more than a report can show past {MAX_ALL_ORDERS_PLAYERS} players; use \
             `interactions = \"pairs\"`, or fewer players"
        ))),
        Interactions::All => Ok(n),
    }
}

/// The interactions of every subset of 1 to `order` players, from `values[mask]`, the value
/// of the coalition of the set bits of `mask` (all 2^n of them).
pub fn exact(n: usize, values: &[f64], index: InteractionIndex, order: usize) -> InteractionValues {
    assert_eq!(values.len(), 1 << n, "one value per coalition");
    let m = moebius(values);
    let subsets = subsets_up_to(n, order);
    let value_of = |mask: usize| match index {
        InteractionIndex::Moebius => m[mask],
        InteractionIndex::Sii => sii(n, &m, mask),
        InteractionIndex::KSii => k_sii(n, &m, mask, order),
    };
    InteractionValues {
        index,
        order,
        values: subsets
            .into_iter()
            .map(|mask| {
                let players = (0..n).filter(|i| mask >> i & 1 == 1).collect();
                Interaction::new(players, value_of(mask))
            })
            .collect(),
    }
}

/// The Möbius transform, one pass per player: after pass i, `m[mask]` holds the alternating
/// sum over the subsets of `mask` that differ from it in players up to i.
fn moebius(values: &[f64]) -> Vec<f64> {
    let mut m = values.to_vec();
    let mut bit = 1;
    while bit < m.len() {
        for mask in 0..m.len() {
            if mask & bit != 0 {
                m[mask] -= m[mask ^ bit];
            }
        }
        bit <<= 1;
    }
    m
}

/// SII of `s`: its supersets' Möbius values, each over one more than the players it adds.
fn sii(n: usize, m: &[f64], s: usize) -> f64 {
    supersets(n, s)
        .map(|t| m[t] / f64::from((t ^ s).count_ones() + 1))
        .sum()
}

/// k-SII of `s` at order `k`: the SII of its supersets up to `k` players, Bernoulli-weighted.
fn k_sii(n: usize, m: &[f64], s: usize, k: usize) -> f64 {
    supersets(n, s)
        .filter(|t| t.count_ones() as usize <= k)
        .map(|t| BERNOULLI[(t ^ s).count_ones() as usize] * sii(n, m, t))
        .sum()
}

/// B_0 to B_12 (with B_1 = -1/2): enough for k-SII up to [`MAX_ALL_ORDERS_PLAYERS`].
const BERNOULLI: [f64; MAX_ALL_ORDERS_PLAYERS + 1] = [
    1.0,
    -0.5,
    1.0 / 6.0,
    0.0,
    -1.0 / 30.0,
    0.0,
    1.0 / 42.0,
    0.0,
    -1.0 / 30.0,
    0.0,
    5.0 / 66.0,
    0.0,
    -691.0 / 2730.0,
];

/// The masks over `n` players that contain `s`.
fn supersets(n: usize, s: usize) -> impl Iterator<Item = usize> {
    let rest = ((1usize << n) - 1) & !s;
    // Every subset of `rest`, by the standard decrement-and-mask walk, from `rest` down to 0.
    let mut next = Some(rest);
    std::iter::from_fn(move || {
        let sub = next?;
        next = (sub != 0).then(|| (sub - 1) & rest);
        Some(s | sub)
    })
}

/// The masks of 1 to `order` players: by size, then lexicographic in the player indices.
fn subsets_up_to(n: usize, order: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for size in 1..=order.min(n) {
        let mut combination: Vec<usize> = (0..size).collect();
        loop {
            out.push(combination.iter().map(|&i| 1usize << i).sum());
            // The next combination: bump the rightmost index that can still move.
            let Some(at) = (0..size).rev().find(|&j| combination[j] < n - size + j) else {
                break;
            };
            combination[at] += 1;
            for j in at + 1..size {
                combination[j] = combination[j - 1] + 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// v over 4 players: 3 when players 0 and 2 are both present, plus 1 for player 1.
    fn planted() -> Vec<f64> {
        (0..16usize)
            .map(|mask| {
                let both = mask & 0b101 == 0b101;
                3.0 * f64::from(u8::from(both)) + f64::from((mask >> 1 & 1) as u8)
            })
            .collect()
    }

    fn value(v: &InteractionValues, players: &[usize]) -> f64 {
        v.values
            .iter()
            .find(|i| i.players == players)
            .map(|i| i.value)
            .unwrap()
    }

    #[test]
    fn a_planted_pair_is_the_only_interaction_and_splits_in_its_players_values() {
        let values = planted();
        for index in [InteractionIndex::Moebius, InteractionIndex::Sii] {
            let v = exact(4, &values, index, 2);
            assert_eq!(v.values.len(), 4 + 6);
            assert_eq!(v.strongest()[0].players, [0, 2]);
            assert!((value(&v, &[0, 2]) - 3.0).abs() < 1e-12);
            assert!(v.strongest()[1..].iter().all(|i| i.value.abs() < 1e-12));
        }
        // SII of one player is its Shapley value: half the pair's 3 each, and 1 for player 1.
        let sii = exact(4, &values, InteractionIndex::Sii, 2);
        let singles: Vec<f64> = (0..4).map(|i| value(&sii, &[i])).collect();
        assert_eq!(singles, [1.5, 1.0, 1.5, 0.0]);
        // k-SII keeps the pair whole and takes it out of its players' values.
        let k = exact(4, &values, InteractionIndex::KSii, 2);
        let singles: Vec<f64> = (0..4).map(|i| value(&k, &[i])).collect();
        assert_eq!(singles, [0.0, 1.0, 0.0, 0.0]);
        assert!((value(&k, &[0, 2]) - 3.0).abs() < 1e-12);
    }

    #[test]
    fn moebius_and_k_sii_of_every_order_sum_to_the_whole_game() {
        // A game with effects of every order.
        let n = 5;
        let values: Vec<f64> = (0..1usize << n)
            .map(|mask| (mask as f64 * 0.37).sin() + mask.count_ones() as f64)
            .collect();
        let total = values[(1 << n) - 1] - values[0];
        for index in [InteractionIndex::Moebius, InteractionIndex::KSii] {
            let all = exact(n, &values, index, n);
            assert_eq!(all.values.len(), (1 << n) - 1);
            let sum: f64 = all.values.iter().map(|i| i.value).sum();
            assert!((sum - total).abs() < 1e-9, "{index}: {sum} vs {total}");
        }
        let pairs = exact(n, &values, InteractionIndex::KSii, 2);
        let sum: f64 = pairs.values.iter().map(|i| i.value).sum();
        assert!(
            (sum - total).abs() < 1e-9,
            "k-SII at order 2: {sum} vs {total}"
        );
        // At the full order, k-SII is the Möbius transform.
        let moebius = exact(n, &values, InteractionIndex::Moebius, n);
        let k = exact(n, &values, InteractionIndex::KSii, n);
        for (a, b) in moebius.values.iter().zip(&k.values) {
            assert!((a.value - b.value).abs() < 1e-9, "{:?}", a.players);
        }
    }

    /// shapiq 1.8's `ExactComputer` on stored games (written by scripts/shapiq-reference.py):
    /// the README conversation's exact run, a planted game and a random one, each index at
    /// order 2 and at every order. Both sides compute in f64 from the same stored values, so
    /// only the order of summation differs: 1e-9 holds on any CPU.
    #[test]
    fn values_match_shapiq_on_stored_games() {
        let data: serde_json::Value =
            serde_json::from_str(include_str!("../tests/data/shapiq_games.json")).unwrap();
        let games = data["games"].as_array().unwrap();
        assert_eq!(games.len(), 3);
        for game in games {
            let n = game["n"].as_u64().unwrap() as usize;
            let values: Vec<f64> = game["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            for reference in game["indices"].as_array().unwrap() {
                let index: InteractionIndex = reference["index"].as_str().unwrap().parse().unwrap();
                let order = reference["order"].as_u64().unwrap() as usize;
                let expected = reference["values"].as_object().unwrap();
                let ours = exact(n, &values, index, order);
                for interaction in &ours.values {
                    let key: Vec<String> =
                        interaction.players.iter().map(|p| p.to_string()).collect();
                    // shapiq leaves out the k-SII values that are exactly 0.
                    let theirs = expected
                        .get(&key.join(","))
                        .map_or(0.0, |v| v.as_f64().unwrap());
                    assert!(
                        (interaction.value - theirs).abs() < 1e-9,
                        "{} {index} order {order} {:?}: {} vs shapiq {theirs}",
                        game["name"],
                        interaction.players,
                        interaction.value
                    );
                }
                assert!(expected.len() <= ours.values.len());
            }
        }
    }

    #[test]
    fn pairs_predict_a_second_order_game_exactly_under_every_index() {
        // v = 0.5 + players' own effects + two pairs: second order, so every index's picture
        // gives back every coalition's value.
        let own = [1.0, -2.0, 0.25, 3.0];
        let v = |mask: usize| {
            let has = |p: usize| mask >> p & 1 == 1;
            let pairs = 1.5 * f64::from(u8::from(has(0) && has(3)))
                - 0.75 * f64::from(u8::from(has(1) && has(2)));
            0.5 + (0..4).filter(|&p| has(p)).map(|p| own[p]).sum::<f64>() + pairs
        };
        let values: Vec<f64> = (0..16).map(v).collect();
        for index in [
            InteractionIndex::KSii,
            InteractionIndex::Sii,
            InteractionIndex::Moebius,
        ] {
            let pairs = exact(4, &values, index, 2);
            for mask in 0..16usize {
                let present = Coalition::from_mask(4, mask as u64);
                let predicted = values[0] + pairs.gain(&present).unwrap();
                assert!((predicted - values[mask]).abs() < 1e-12, "{index} {mask:b}");
            }
        }
        let all = exact(4, &values, InteractionIndex::Moebius, 4);
        assert_eq!(all.gain(&Coalition::full(4)), None);
    }

    #[test]
    fn subsets_come_by_size_then_in_lexicographic_order() {
        let players = |mask: usize| (0..4).filter(|i| mask >> i & 1 == 1).collect::<Vec<_>>();
        let listed: Vec<Vec<usize>> = subsets_up_to(4, 2).into_iter().map(players).collect();
        let expected: Vec<Vec<usize>> = vec![
            vec![0],
            vec![1],
            vec![2],
            vec![3],
            vec![0, 1],
            vec![0, 2],
            vec![0, 3],
            vec![1, 2],
            vec![1, 3],
            vec![2, 3],
        ];
        assert_eq!(listed, expected);
        assert_eq!(subsets_up_to(5, 5).len(), 31);
        assert_eq!(supersets(4, 0b0101).count(), 4);
    }

    #[test]
    fn all_orders_are_refused_past_the_limit_naming_the_setting() {
        assert_eq!(order(Interactions::Pairs, 20).unwrap(), 2);
        assert_eq!(
            order(Interactions::All, MAX_ALL_ORDERS_PLAYERS).unwrap(),
            12
        );
        let e = order(Interactions::All, MAX_ALL_ORDERS_PLAYERS + 1).unwrap_err();
        assert!(e.to_string().contains("interactions = \"pairs\""), "{e}");
    }
}
