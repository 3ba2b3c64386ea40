//! Token-embedding tables, and a table tied to the output layer.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Result, Tensor};

use crate::kernels::{self};

use super::linear::{dequantize_row, BlockData, Blocks, Kernel};
use super::*;

/// A token-embedding table and the output layer tied to it. The layer is built first, holding
/// the only reference to quantized CPU blocks, so that it may keep them in the layout its
/// kernel reads fastest ([`kernels::interleave`]) in place of the stored ones; the table then
/// looks its rows up in the layer (bit for bit the values the stored blocks hold): in its
/// dense prefill copy (`auto` on CPU, `mixed`), or in its blocks (`compact`). Formats whose
/// layer holds other values (requantized, or a dtype's rounding) or that compute through
/// candle keep the table beside the layer, sharing the stored blocks ([`Embedding::new`]).
pub fn tied(w: Weight, format: WeightFormat, dtype: DType) -> Result<(Embedding, Linear)> {
    let layer_first = match &w {
        Weight::Quantized(q) if q.device().is_cpu() && kernels::supports(q.dtype()) => match format
        {
            WeightFormat::Compact => true,
            WeightFormat::Auto | WeightFormat::Mixed => {
                format.decode_copy(true, dtype, &w.device())
            }
            _ => false,
        },
        _ => false,
    };
    if !layer_first {
        let embedding = Embedding::new(&w, dtype)?;
        return Ok((embedding, Linear::new(w, None, format, dtype)?));
    }
    let linear = Linear::new(w, None, format, dtype)?;
    let table = match &linear.prefill {
        Kernel::Candle(QMatMul::Tensor(dense)) => Table::Dense(dense.clone()),
        Kernel::Lmhost(Blocks {
            data: BlockData::Stored(q),
            ..
        }) => Table::Quantized(q.clone()),
        Kernel::Lmhost(Blocks {
            dtype,
            shape,
            data: BlockData::Interleaved(data),
        }) => Table::Interleaved {
            dtype: *dtype,
            shape: *shape,
            data: data.clone(),
        },
        _ => candle_core::bail!("a tied output layer without the table's values"),
    };
    Ok((Embedding { table, dtype }, linear))
}

/// A token-embedding table. A quantized table on CPU stays as stored and dequantizes only the
/// rows looked up (the values a dense copy would hold), so a 7B model's table costs its size in
/// the file, not four bytes a value.
pub struct Embedding {
    table: Table,
    dtype: DType,
}

enum Table {
    Dense(Tensor),
    Quantized(Arc<QTensor>),
    /// The interleaved blocks of the output layer tied to the table ([`tied`]), `shape`
    /// `(rows, k)`.
    Interleaved {
        dtype: GgmlDType,
        shape: (usize, usize),
        data: Arc<Vec<u8>>,
    },
}

impl Embedding {
    /// The table of `w`, looked up in `dtype`.
    pub fn new(w: &Weight, dtype: DType) -> Result<Self> {
        let table = match w {
            Weight::Quantized(q) if q.device().is_cpu() => Table::Quantized(q.clone()),
            w => Table::Dense(w.dense(dtype)?),
        };
        Ok(Embedding { table, dtype })
    }

    /// The rows of `ids` (a vector of u32), `(ids, hidden)` in the compute dtype.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match &self.table {
            Table::Dense(t) => t.index_select(ids, 0),
            Table::Quantized(q) => q.embedding(ids)?.to_dtype(self.dtype),
            Table::Interleaved { dtype, shape, data } => {
                let ids: Vec<usize> = ids
                    .to_vec1::<u32>()?
                    .into_iter()
                    .map(|i| i as usize)
                    .collect();
                let rows = kernels::interleaved_rows(*dtype, data, *shape, &ids)?;
                Tensor::from_vec(rows, (ids.len(), shape.1), &Device::Cpu)?.to_dtype(self.dtype)
            }
        }
    }

    /// Row `id` into `out` (f32, the values [`Embedding::forward`] gives) where the table lies
    /// on CPU and the compute dtype is f32, with no allocation; `false` for other tables.
    pub fn row_into(&self, id: u32, out: &mut [f32]) -> Result<bool> {
        let (id, k) = (id as usize, out.len());
        match &self.table {
            Table::Dense(t) if self.dtype == DType::F32 => {
                if t.dims().get(1) != Some(&k) {
                    candle_core::bail!("rows of {k} values from a table shaped {:?}", t.dims());
                }
                let row = f32_values(t, |table| {
                    let row = table.get(id * k..(id + 1) * k);
                    row.map(|row| out.copy_from_slice(row)).is_some()
                });
                match row {
                    Some(false) => candle_core::bail!("token id {id} is past the embedding table"),
                    found => Ok(found.is_some()),
                }
            }
            Table::Interleaved { dtype, shape, data } if self.dtype == DType::F32 => {
                kernels::interleaved_rows_into(*dtype, data, *shape, &[id], out)?;
                Ok(true)
            }
            Table::Quantized(q) if self.dtype == DType::F32 => match q.data()? {
                std::borrow::Cow::Borrowed(data) => {
                    dequantize_row(q.dtype(), data, id, out)?;
                    Ok(true)
                }
                std::borrow::Cow::Owned(_) => Ok(false),
            },
            _ => Ok(false),
        }
    }

    pub fn device(&self) -> Device {
        match &self.table {
            Table::Dense(t) => t.device().clone(),
            Table::Quantized(q) => q.device(),
            Table::Interleaved { .. } => Device::Cpu,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tied table looks up the rows the stored blocks hold in every format, whichever copy it
    /// reads them from (`auto`'s: the layer's dense prefill copy; `compact`'s: the layer's
    /// blocks, interleaved on AVX-512), and the tied layer computes what the same layer untied
    /// (sharing the stored blocks) does, within what the summation order moves.
    #[test]
    fn a_tied_table_reads_the_stored_rows_and_its_layer_computes_as_untied() -> Result<()> {
        let dense = Tensor::randn(0f32, 1.0, (40, 64), &Device::Cpu)?;
        let quantized = || -> Result<Weight> {
            Ok(Weight::Quantized(Arc::new(QTensor::quantize(
                &dense,
                GgmlDType::Q8_0,
            )?)))
        };
        let ids = Tensor::new(&[3u32, 0, 39, 3], &Device::Cpu)?;
        let x = Tensor::randn(0f32, 1.0, (3, 64), &Device::Cpu)?;
        let diff = |a: &Tensor, b: &Tensor| -> Result<f32> {
            a.sub(b)?.abs()?.max_all()?.to_scalar::<f32>()
        };
        let w = quantized()?;
        let rows = Embedding::new(&w, DType::F32)?.forward(&ids)?;
        for format in [
            WeightFormat::Auto,
            WeightFormat::Mixed,
            WeightFormat::Compact,
            WeightFormat::AsStored,
            WeightFormat::Q4_0,
        ] {
            let (table, layer) = tied(quantized()?, format, DType::F32)?;
            assert_eq!(diff(&table.forward(&ids)?, &rows)?, 0.0, "{format:?}");
            let untied = Linear::new(w.clone(), None, format, DType::F32)?;
            for phase in [prefilling::<Result<_>>, generating] {
                let (ours, theirs) = phase(|| Ok((layer.forward(&x)?, untied.forward(&x)?)))?;
                let scale = theirs.abs()?.max_all()?.to_scalar::<f32>()?;
                assert!(diff(&ours, &theirs)? <= 1e-5 * scale, "{format:?}");
            }
        }
        Ok(())
    }
}
