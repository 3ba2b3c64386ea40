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

    /// Makes `layer` hold positions `0..len` of `other`'s `layer` (a view, no copy): a sequence
    /// of a packed forward taking a prefix another sequence of the same pass has just computed.
    /// Nothing is written into `other`: a later append here concatenates into new tensors.
    pub fn adopt(&mut self, layer: usize, other: &KvState, len: usize) -> Result<()> {
        self.layers[layer] = match other.layer(layer) {
            Some((k, v)) if len > 0 => {
                Some((k.narrow(SEQ_DIM, 0, len)?, v.narrow(SEQ_DIM, 0, len)?))
            }
            _ => None,
        };
        Ok(())
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

    /// The keys and values of `layer`, if anything was appended to it.
    pub fn layer(&self, layer: usize) -> Option<(&Tensor, &Tensor)> {
        self.layers.get(layer)?.as_ref().map(|(k, v)| (k, v))
    }

    /// Positions `start..start + len` as a state of their own, copied into exactly-sized
    /// buffers: a stored segment never keeps a larger tensor it was cut from alive.
    pub fn slice(&self, start: usize, len: usize) -> Result<KvState> {
        let copy = |t: &Tensor| t.narrow(SEQ_DIM, start, len)?.force_contiguous();
        let layers = self
            .layers
            .iter()
            .map(|slot| match slot {
                Some((k, v)) if len > 0 => Ok(Some((copy(k)?, copy(v)?))),
                _ => Ok(None),
            })
            .collect::<Result<_>>()?;
        Ok(KvState { layers })
    }

    /// The states of consecutive position ranges joined into one, in order. One part comes back
    /// as a cheap clone; several are copied once into new buffers.
    pub fn concat(parts: &[KvState]) -> Result<KvState> {
        let Some(first) = parts.first() else {
            return Ok(KvState::new(0));
        };
        if parts.len() == 1 {
            return Ok(first.clone());
        }
        let layers = (0..first.layers.len())
            .map(|layer| {
                let (ks, vs): (Vec<&Tensor>, Vec<&Tensor>) =
                    parts.iter().filter_map(|part| part.layer(layer)).unzip();
                if ks.is_empty() {
                    return Ok(None);
                }
                Ok(Some((
                    Tensor::cat(&ks, SEQ_DIM)?,
                    Tensor::cat(&vs, SEQ_DIM)?,
                )))
            })
            .collect::<Result<_>>()?;
        Ok(KvState { layers })
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

    #[test]
    fn slices_own_exact_buffers_and_concat_restores_the_whole() {
        let mut a = KvState::new(2);
        for (layer, value) in [(0, 1.0), (1, 2.0)] {
            let t = Tensor::arange(0f32, 10.0, &Device::Cpu)
                .unwrap()
                .affine(1.0, value * 100.0)
                .unwrap()
                .reshape((1, 1, 5, 2))
                .unwrap();
            a.append(layer, &t, &t.neg().unwrap()).unwrap();
        }
        let head = a.slice(0, 2).unwrap();
        let tail = a.slice(2, 3).unwrap();
        assert_eq!((head.len(), tail.len()), (2, 3));
        assert_eq!(head.bytes() + tail.bytes(), a.bytes());
        let joined = KvState::concat(&[head, tail]).unwrap();
        for layer in 0..2 {
            let (k, v) = joined.layer(layer).unwrap();
            let (k0, v0) = a.layer(layer).unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(flat(k), flat(k0));
            assert_eq!(flat(v), flat(v0));
        }
        assert!(a.slice(1, 0).unwrap().is_empty());
    }
}
