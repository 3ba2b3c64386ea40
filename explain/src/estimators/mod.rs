//! Estimators: each turns a number of players into a plan (the coalitions whose values it
//! needs), then the values of those coalitions into attributions. Planning first lets the caller
//! deduplicate, order and persist the evaluations.

mod exact;
mod kernel;
mod lasso;
mod linalg;
mod loo;
mod msr;
mod permutation;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::coalition::Coalition;
use super::error::ExplainError;
use super::interactions::{self, InteractionValues};
use super::settings::{Estimand, EstimatorKind, InteractionIndex, Interactions};

/// How to estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct EstimatorSettings {
    pub kind: EstimatorKind,
    pub estimand: Estimand,
    /// Coalition evaluations a sampling estimator may plan (duplicates included).
    pub budget: usize,
    pub seed: u64,
    /// `exact` refuses more players than this.
    pub max_exact_players: usize,
    /// Which interactions to estimate besides the attributions.
    pub interactions: Interactions,
    pub interaction_index: InteractionIndex,
}

impl Default for EstimatorSettings {
    fn default() -> Self {
        EstimatorSettings {
            kind: EstimatorKind::Exact,
            estimand: Estimand::Shapley,
            budget: 1000,
            seed: 0,
            max_exact_players: 16,
            interactions: Interactions::None,
            interaction_index: InteractionIndex::KSii,
        }
    }
}

/// Attributions: one value per player, with a standard error from sampling estimators, and
/// the interactions the settings ask for.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimates {
    pub values: Vec<f64>,
    pub std_errors: Option<Vec<f64>>,
    pub interactions: Option<InteractionValues>,
}

/// The coalitions an estimator needs, distinct, with the structure to combine their values.
#[derive(Debug, Clone)]
pub struct Plan {
    n: usize,
    settings: EstimatorSettings,
    coalitions: Vec<Coalition>,
    kind: PlanKind,
}

#[derive(Debug, Clone)]
enum PlanKind {
    /// `coalitions[mask]` is the coalition of the set bits of `mask`.
    Exact,
    /// For each permutation, the index of the coalition after each prefix (n + 1 entries,
    /// from empty to full) and the player added at each step.
    Permutations {
        walks: Vec<(Vec<usize>, Vec<usize>)>,
        antithetic: bool,
    },
    /// Indices of the sampled coalitions, with repeats.
    Samples(Vec<usize>),
    /// Per player, the index of the full coalition without it.
    LeaveOneOut(Vec<usize>),
    /// Sampled coalition pairs and the least squares that combines them.
    Kernel(kernel::Kernel),
    /// Sampled coalitions, with repeats, for the LASSO surrogate.
    Lasso(lasso::Lasso),
}

/// Builds a plan's coalition list, each coalition once.
#[derive(Default)]
struct Interner {
    coalitions: Vec<Coalition>,
    index: HashMap<Coalition, usize>,
}

impl Interner {
    fn add(&mut self, c: Coalition) -> usize {
        if let Some(&i) = self.index.get(&c) {
            return i;
        }
        self.coalitions.push(c.clone());
        self.index.insert(c, self.coalitions.len() - 1);
        self.coalitions.len() - 1
    }
}

impl Plan {
    /// Plans for `n` players; refuses settings that cannot work, naming the alternative.
    pub fn new(n: usize, settings: &EstimatorSettings) -> Result<Plan, ExplainError> {
        if n == 0 {
            return Err(ExplainError::Estimator("there are no players".into()));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(settings.seed);
        let (coalitions, kind) = match (settings.kind, settings.estimand) {
            (EstimatorKind::Exact, _) => {
                (exact::plan(n, settings.max_exact_players)?, PlanKind::Exact)
            }
            (EstimatorKind::Permutation | EstimatorKind::Antithetic, Estimand::Shapley) => {
                let antithetic = settings.kind == EstimatorKind::Antithetic;
                let (coalitions, walks) =
                    permutation::plan(n, settings.budget, antithetic, &mut rng);
                (coalitions, PlanKind::Permutations { walks, antithetic })
            }
            (EstimatorKind::Msr, Estimand::Banzhaf) => {
                let (coalitions, samples) = msr::plan(n, settings.budget, &mut rng);
                (coalitions, PlanKind::Samples(samples))
            }
            (EstimatorKind::Loo, Estimand::Shapley) => {
                let (coalitions, without) = loo::plan(n);
                (coalitions, PlanKind::LeaveOneOut(without))
            }
            (EstimatorKind::Kernel, Estimand::Shapley) => {
                let (coalitions, kernel) = kernel::plan(n, settings.budget, &mut rng)?;
                (coalitions, PlanKind::Kernel(kernel))
            }
            (EstimatorKind::Lasso, Estimand::Shapley) => {
                let pairs = (settings.interactions != Interactions::None)
                    .then_some(settings.interaction_index);
                let (coalitions, lasso) = lasso::plan(n, settings.budget, pairs, &mut rng)?;
                (coalitions, PlanKind::Lasso(lasso))
            }
            (
                kind @ (EstimatorKind::Permutation
                | EstimatorKind::Antithetic
                | EstimatorKind::Loo
                | EstimatorKind::Kernel
                | EstimatorKind::Lasso),
                Estimand::Banzhaf,
            ) => {
                return Err(ExplainError::Estimator(format!(
                    "`{kind}` {}; for `estimand = \"banzhaf\"` use \
                     `estimator = \"msr\"` (sampling) or `\"exact\"`",
                    match kind {
                        EstimatorKind::Loo => {
                            "is a baseline offered under the Shapley estimand only"
                        }
                        EstimatorKind::Lasso => {
                            "is a sparse surrogate offered under the Shapley estimand only"
                        }
                        _ => "estimates Shapley values",
                    }
                )))
            }
            (EstimatorKind::Msr, Estimand::Shapley) => {
                return Err(ExplainError::Estimator(
                    "`msr` estimates Banzhaf values; for `estimand = \"shapley\"` use \
                     `estimator = \"antithetic\"`, `\"permutation\"` or `\"kernel\"` \
                     (sampling), `\"lasso\"` (a sparse surrogate) or `\"exact\"`"
                        .into(),
                ))
            }
        };
        check_interactions(n, settings)?;
        Ok(Plan {
            n,
            settings: settings.clone(),
            coalitions,
            kind,
        })
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn settings(&self) -> &EstimatorSettings {
        &self.settings
    }

    /// The distinct coalitions to evaluate; the empty and the full one are always among them.
    pub fn coalitions(&self) -> &[Coalition] {
        &self.coalitions
    }

    /// Index of the empty coalition in `coalitions()`.
    pub fn empty_index(&self) -> usize {
        0
    }

    /// Index of the full coalition in `coalitions()`.
    pub fn full_index(&self) -> usize {
        match self.kind {
            PlanKind::Exact => self.coalitions.len() - 1,
            _ => 1,
        }
    }

    /// Combines `values` (one per coalition, in the order of `coalitions()`) into attributions.
    pub fn estimate(&self, values: &[f64]) -> Estimates {
        assert_eq!(
            values.len(),
            self.coalitions.len(),
            "one value per coalition"
        );
        match &self.kind {
            PlanKind::Exact => {
                let order = interactions::order(self.settings.interactions, self.n).unwrap_or(0);
                Estimates {
                    interactions: (order > 0).then(|| {
                        interactions::exact(self.n, values, self.settings.interaction_index, order)
                    }),
                    ..exact::estimate(self.n, self.settings.estimand, values)
                }
            }
            PlanKind::Permutations { walks, antithetic } => {
                permutation::estimate(self.n, walks, *antithetic, values)
            }
            PlanKind::Samples(samples) => msr::estimate(&self.coalitions, samples, values),
            PlanKind::LeaveOneOut(without) => loo::estimate(self.full_index(), without, values),
            PlanKind::Kernel(kernel) => kernel.estimate(&self.coalitions, values),
            PlanKind::Lasso(lasso) => lasso.estimate(&self.coalitions, values),
        }
    }
}

/// Refuses interactions the settings cannot give, naming the setting to change.
fn check_interactions(n: usize, settings: &EstimatorSettings) -> Result<(), ExplainError> {
    if settings.interactions == Interactions::None {
        return Ok(());
    }
    match (settings.kind, settings.interactions) {
        (EstimatorKind::Exact, _) => {}
        (EstimatorKind::Lasso, Interactions::Pairs) => lasso::check_pairs(n)?,
        (kind, which) => {
            return Err(ExplainError::Estimator(format!(
                "`interactions = \"{which}\"` needs `estimator = \"exact\"` (every \
                 coalition's value){}; `{kind}` does not give them",
                match which {
                    Interactions::Pairs => " or `\"lasso\"` (a sparse surrogate with pairs)",
                    _ => "",
                }
            )));
        }
    }
    if settings.estimand == Estimand::Banzhaf
        && settings.interaction_index != InteractionIndex::Moebius
    {
        return Err(ExplainError::Estimator(format!(
            "`interaction_index = \"{}\"` extends Shapley values; with `estimand = \
             \"banzhaf\"` use `interaction_index = \"moebius\"`",
            settings.interaction_index
        )));
    }
    interactions::order(settings.interactions, n).map(|_| ())
}

/// Mean and standard error of the mean of `xs` (standard error 0 for fewer than 2 samples).
fn mean_and_se(xs: &[f64]) -> (f64, f64) {
    let m = xs.len() as f64;
    if xs.is_empty() {
        return (0.0, f64::INFINITY);
    }
    let mean = xs.iter().sum::<f64>() / m;
    if xs.len() < 2 {
        return (mean, f64::INFINITY);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (m - 1.0);
    (mean, (var / m).sqrt())
}
