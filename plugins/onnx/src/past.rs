//! The keys and values of a sequence's past positions, as the graph takes them back in
//! (`past_key_values.N.key/value`, one sequence of the batch: [kv_heads, positions, head_dim]
//! each). Buffers are shared by clones and never written after they are made, so a state handed
//! to the prefix cache is a snapshot.

use std::sync::Arc;

use lmhost_plugin_kit::prefix_cache::Segment;

/// One layer's keys and values, each `heads × len × dim`, row-major.
#[derive(Debug)]
pub struct Layer {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

#[derive(Debug, Clone)]
pub struct Past {
    pub heads: usize,
    pub dim: usize,
    pub len: usize,
    /// Empty for a state of no positions made before the shape was known.
    pub layers: Arc<Vec<Layer>>,
}

impl Past {
    /// No positions, for a model of `layers` layers with `heads` key/value heads of `dim`.
    pub fn empty(layers: usize, heads: usize, dim: usize) -> Past {
        Past {
            heads,
            dim,
            len: 0,
            layers: Arc::new(
                (0..layers)
                    .map(|_| Layer {
                        keys: Vec::new(),
                        values: Vec::new(),
                    })
                    .collect(),
            ),
        }
    }

    /// Positions `start..start + len` of one head-major buffer.
    fn cut(&self, buffer: &[f32], start: usize, len: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.heads * len * self.dim);
        for head in 0..self.heads {
            let from = (head * self.len + start) * self.dim;
            out.extend_from_slice(&buffer[from..from + len * self.dim]);
        }
        out
    }
}

impl Segment for Past {
    fn empty() -> Self {
        Past::empty(0, 0, 0)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| ((l.keys.len() + l.values.len()) * 4) as u64)
            .sum()
    }

    fn slice(&self, start: usize, len: usize) -> Option<Self> {
        if start + len > self.len {
            return None;
        }
        let layers = self
            .layers
            .iter()
            .map(|l| Layer {
                keys: self.cut(&l.keys, start, len),
                values: self.cut(&l.values, start, len),
            })
            .collect();
        Some(Past {
            len,
            layers: Arc::new(layers),
            ..*self
        })
    }

    fn prefix(&self, len: usize) -> Option<Self> {
        self.slice(0, len)
    }

    fn concat(parts: &[Self]) -> Option<Self> {
        let first = parts.first()?;
        if parts.len() == 1 {
            return Some(first.clone());
        }
        let (heads, dim) = (first.heads, first.dim);
        let len = parts.iter().map(|p| p.len).sum();
        let join = |buffer: fn(&Layer) -> &[f32], layer: usize| {
            let mut out = Vec::with_capacity(heads * len * dim);
            for head in 0..heads {
                for part in parts {
                    let from = head * part.len * dim;
                    out.extend_from_slice(
                        &buffer(&part.layers[layer])[from..from + part.len * dim],
                    );
                }
            }
            out
        };
        let layers = (0..first.layers.len())
            .map(|layer| Layer {
                keys: join(|l| &l.keys, layer),
                values: join(|l| &l.values, layer),
            })
            .collect();
        Some(Past {
            heads,
            dim,
            len,
            layers: Arc::new(layers),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One layer, 2 heads of dim 2; position p of head h holds (100h + p, -(100h + p)).
    fn past(positions: std::ops::Range<usize>) -> Past {
        let len = positions.len();
        let values = |sign: f32| {
            (0..2)
                .flat_map(|h| positions.clone().map(move |p| sign * (100 * h + p) as f32))
                .flat_map(|x| [x, x])
                .collect()
        };
        Past {
            heads: 2,
            dim: 2,
            len,
            layers: Arc::new(vec![Layer {
                keys: values(1.0),
                values: values(-1.0),
            }]),
        }
    }

    fn assert_same(a: &Past, b: &Past) {
        assert_eq!((a.len, a.heads, a.dim), (b.len, b.heads, b.dim));
        assert_eq!(a.layers[0].keys, b.layers[0].keys);
        assert_eq!(a.layers[0].values, b.layers[0].values);
    }

    #[test]
    fn slices_and_concatenations_keep_each_head_in_order() {
        let whole = past(0..5);
        assert_same(&whole.slice(1, 3).unwrap(), &past(1..4));
        assert_same(&whole.prefix(2).unwrap(), &past(0..2));
        let parts = [past(0..2), past(2..3), past(3..5)];
        assert_same(&Past::concat(&parts).unwrap(), &whole);
        assert!(whole.slice(4, 2).is_none());
        assert_eq!(whole.bytes(), 2 * 2 * 5 * 2 * 4);
    }
}
