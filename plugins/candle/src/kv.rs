//! Per-layer key/value state that grows by concatenation.
//!
//! Appending builds new tensors and never writes into existing ones, so a clone is an immutable
//! snapshot that costs a few reference counts, and cropping is a view. A prefix cache can hand
//! out clones of a stored state and no later decoding, on any branch, can change what it holds.
//! (A preallocated buffer written in place would let a shorter branch overwrite a longer one.)

use candle_core::{Result, Tensor};

/// Keys and values of every layer, each shaped `(1, kv_heads, seq_len, head_dim)`.
#[derive(Debug, Clone)]
pub struct KvState {
    layers: Vec<Option<(Tensor, Tensor)>>,
}

/// The sequence axis of `(batch, heads, seq, head_dim)`.
const SEQ_DIM: usize = 2;

impl KvState {
    pub fn new(n_layers: usize) -> Self {
        KvState {
            layers: vec![None; n_layers],
        }
    }

    /// Positions held (the same in every layer).
    pub fn len(&self) -> usize {
        match self.layers.first() {
            Some(Some((k, _))) => k.dim(SEQ_DIM).unwrap_or(0),
            _ => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `k` and `v` to `layer` and returns its whole keys and values.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let slot = &mut self.layers[layer];
        let (k, v) = match slot.take() {
            None => (k.contiguous()?, v.contiguous()?),
            Some((k0, v0)) => (
                Tensor::cat(&[&k0, k], SEQ_DIM)?,
                Tensor::cat(&[&v0, v], SEQ_DIM)?,
            ),
        };
        *slot = Some((k.clone(), v.clone()));
        Ok((k, v))
    }

    /// Keeps the first `len` positions of every layer.
    pub fn crop(&mut self, len: usize) -> Result<()> {
        for slot in &mut self.layers {
            if let Some((k, v)) = slot {
                *slot = if len == 0 {
                    None
                } else {
                    Some((k.narrow(SEQ_DIM, 0, len)?, v.narrow(SEQ_DIM, 0, len)?))
                };
            }
        }
        Ok(())
    }

    /// Bytes of the positions held (a cropped view is counted at its cropped length).
    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .flatten()
            .map(|(k, v)| ((k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes()) as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn step(state: &mut KvState, value: f32, n: usize) -> Tensor {
        let t = Tensor::full(value, (1, 2, n, 4), &Device::Cpu).unwrap();
        state.append(0, &t, &t).unwrap().0
    }

    #[test]
    fn snapshots_survive_appends_on_other_branches() {
        let mut a = KvState::new(1);
        step(&mut a, 1.0, 3);
        let snapshot = a.clone();
        step(&mut a, 2.0, 2);
        let mut b = snapshot.clone();
        b.crop(2).unwrap();
        let keys = step(&mut b, 3.0, 1);
        assert_eq!(snapshot.len(), 3);
        assert_eq!(a.len(), 5);
        assert_eq!(b.len(), 3);
        let row = |t: &Tensor, i| {
            t.narrow(2, i, 1)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()[0]
        };
        assert_eq!(row(&keys, 2), 3.0);
        let (a_keys, _) = a.layers[0].clone().unwrap();
        assert_eq!(row(&a_keys, 2), 1.0, "branch b must not write into a");
        assert_eq!(a.bytes(), 2 * 5 * 2 * 4 * DType::F32.size_in_bytes() as u64);
    }
}
