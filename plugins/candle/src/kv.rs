//! Per-layer key/value state in shared buffers that are written in place only where no state
//! reads.
//!
//! A layer's keys and values live in a buffer with spare capacity along the sequence axis,
//! shared by every clone of the state; a state reads positions `0..len` of it. The buffer keeps
//! a high-water mark, the positions ever written. Invariant: **a position below the mark is
//! never written again.** An append writes in place only when this state's `len` is the mark
//! (claimed atomically, as clones may live on other threads) and capacity remains; otherwise
//! it copies its `0..len` into a new buffer of twice the length (copy on fork). So appending
//! costs O(new positions) amortized, a clone is an immutable snapshot that costs a few
//! reference counts, and cropping only shortens `len`: a prefix cache can hand out clones of a
//! stored state and no later decoding, on any branch, can change what they hold, because any
//! position a state or a view handed out reads is below the mark.
//!
//! Spare capacity is at most the positions held (a decoding state doubles as it grows; a
//! generation's, no more than its reply can add: [`KvState::with_room_for`]). Stored
//! segments ([`KvState::slice`], [`KvState::concat`]) are exact-sized copies, so what a cache
//! counts with [`KvState::bytes`] is what it keeps alive.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::{CpuStorage, DType, Layout, Result, Storage, Tensor};
use lmhost_plugin_kit::prefix_cache::Segment;

/// Keys and values of every layer, each read as `(1, kv_heads, seq_len, head_dim)`.
#[derive(Debug, Clone)]
pub struct KvState {
    layers: Vec<Option<Layer>>,
    /// What a copying append leaves room for.
    room: Room,
    /// How a layer's first append stores its keys and values (none: as they come); later
    /// ones follow the layer.
    dtype: Option<DType>,
    /// Positions `0..base.len()` are another state's, read where it holds them and never copied
    /// ([`KvState::after`]); `layers` then hold the positions after them.
    base: Option<Arc<KvState>>,
}

/// A layer's keys and values as attention reads them after an append: the prefix of a state
/// made with [`KvState::after`], where that prefix lies, then this state's own positions.
pub struct Parts {
    pub prefix: Option<Prefix>,
    pub k: Tensor,
    pub v: Tensor,
}

/// The prefix part of [`Parts`].
pub struct Prefix {
    pub k: Tensor,
    pub v: Tensor,
    /// The buffer and length the prefix is read from: parts with one `id` read one prefix.
    pub id: (usize, usize),
}

impl Parts {
    /// The whole keys and values, the prefix copied before this state's own where there is one.
    pub fn whole(self) -> Result<(Tensor, Tensor)> {
        match self.prefix {
            None => Ok((self.k, self.v)),
            Some(p) => Ok((
                Tensor::cat(&[&p.k, &self.k], SEQ_DIM)?,
                Tensor::cat(&[&p.v, &self.v], SEQ_DIM)?,
            )),
        }
    }
}

/// Positions a copying append leaves room for past what it writes.
#[derive(Clone, Copy, Debug)]
enum Room {
    /// As many as the state then holds: appends copy O(1) amortized.
    Double,
    /// None: a state scored once and dropped ([`KvState::without_spare`]).
    None,
    /// At most this many, never more than doubling would leave ([`KvState::with_room_for`]).
    For(usize),
}

/// One layer of a state: positions `0..len` of a buffer it may share.
#[derive(Debug, Clone)]
struct Layer {
    buf: Arc<Buffer>,
    len: usize,
}

/// Contiguous keys and values `(1, kv_heads, capacity, head_dim)`.
#[derive(Debug)]
struct Buffer {
    k: Tensor,
    v: Tensor,
    /// One-value views of `k` and `v`'s storage, through which [`Layer::push_in_place`]
    /// writes: an in-place op hands its op the whole storage, and candle's check of a layout
    /// of one value allocates nothing (of `k`'s four axes it collects a vector).
    handles: Option<(Tensor, Tensor)>,
    /// The high-water mark: positions `0..written` have been written and never change again.
    written: AtomicUsize,
}

/// The sequence axis of `(batch, heads, seq, head_dim)`.
const SEQ_DIM: usize = 2;

impl Layer {
    /// A layer over contiguous `k` and `v` whose first `len` positions are written.
    fn over(k: Tensor, v: Tensor, len: usize) -> Self {
        let handle = |t: &Tensor| t.flatten_all()?.narrow(0, 0, 1);
        let handles = handle(&k).and_then(|hk| Ok((hk, handle(&v)?))).ok();
        Layer {
            buf: Arc::new(Buffer {
                k,
                v,
                handles,
                written: AtomicUsize::new(len),
            }),
            len,
        }
    }

    /// This layer's first `len` positions (the same buffer).
    fn prefix(&self, len: usize) -> Result<Self> {
        if len > self.len {
            candle_core::bail!("a prefix of {len} positions of a state of {}", self.len);
        }
        Ok(Layer {
            buf: self.buf.clone(),
            len,
        })
    }

    /// Views of the keys and values held.
    fn views(&self) -> Result<(Tensor, Tensor)> {
        Ok((
            self.buf.k.narrow(SEQ_DIM, 0, self.len)?,
            self.buf.v.narrow(SEQ_DIM, 0, self.len)?,
        ))
    }

    /// Positions the buffer has room for.
    fn capacity(&self) -> usize {
        self.buf.k.dims()[SEQ_DIM]
    }

    /// Claims positions `len..len + n` of the buffer for this layer, if nothing was ever
    /// written there and they fit; returns whether it did.
    fn claim(&self, n: usize) -> bool {
        self.len + n <= self.capacity()
            && self
                .buf
                .written
                .compare_exchange(self.len, self.len + n, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Writes `k` and `v` after this layer's positions in place, if nothing was ever written
    /// there and they fit; returns whether it did.
    fn append_in_place(&mut self, k: &Tensor, v: &Tensor) -> Result<bool> {
        let n = k.dim(SEQ_DIM)?;
        if !self.claim(n) {
            return Ok(false);
        }
        self.buf.k.slice_set(&k.contiguous()?, SEQ_DIM, self.len)?;
        self.buf.v.slice_set(&v.contiguous()?, SEQ_DIM, self.len)?;
        self.len += n;
        Ok(true)
    }

    /// Writes one position, `(kv_heads, head_dim)` row-major each, after this layer's in
    /// place, as [`Layer::append_in_place`] does.
    fn push_in_place(&mut self, k: &[f32], v: &[f32]) -> Result<bool> {
        let (Some((hk, hv)), &[1, heads, capacity, d]) = (&self.buf.handles, self.buf.k.dims())
        else {
            return Ok(false);
        };
        let contiguous = self.buf.k.is_contiguous() && self.buf.v.is_contiguous();
        let fits = k.len() == heads * d && v.len() == heads * d;
        if !(contiguous && fits && self.claim(1)) {
            return Ok(false);
        }
        let write = |values, start| WritePosition {
            values,
            at: start + self.len * d,
            stride: (capacity * d, d),
        };
        hk.inplace_op1(&write(k, self.buf.k.layout().start_offset()))?;
        hv.inplace_op1(&write(v, self.buf.v.layout().start_offset()))?;
        self.len += 1;
        Ok(true)
    }

    /// `held` followed by `k` and `v` in a new buffer with the room `room` says, up to what
    /// `held` holds (none after a first append: a state that is never extended costs what it
    /// holds).
    fn grown(held: Option<&Layer>, k: &Tensor, v: &Tensor, room: Room) -> Result<Self> {
        let old = held.map_or(0, |l| l.len);
        let len = old + k.dim(SEQ_DIM)?;
        let double = len.max(2 * old) - len;
        let spare = match room {
            Room::Double => double,
            Room::None => 0,
            Room::For(n) => n.min(double),
        };
        let views = held.map(Layer::views).transpose()?;
        let join = |held: Option<&Tensor>, new: &Tensor| {
            let mut parts: Vec<Tensor> = held.into_iter().cloned().collect();
            parts.push(new.contiguous()?);
            if spare > 0 {
                let (b, heads, _, d) = new.dims4()?;
                parts.push(Tensor::zeros(
                    (b, heads, spare, d),
                    new.dtype(),
                    new.device(),
                )?);
            }
            Tensor::cat(&parts, SEQ_DIM)?.contiguous()
        };
        Ok(Layer::over(
            join(views.as_ref().map(|(k, _)| k), k)?,
            join(views.as_ref().map(|(_, v)| v), v)?,
            len,
        ))
    }
}

/// Writes one position's values, `(heads, d)` row-major, into a contiguous f32 CPU buffer
/// `(1, heads, capacity, d)` where the position's head 0 starts at `at`; the
/// layout the op is handed is a one-value handle's, not the buffer's.
struct WritePosition<'a> {
    values: &'a [f32],
    at: usize,
    /// Values from one head to the next, and per position.
    stride: (usize, usize),
}

impl candle_core::InplaceOp1 for WritePosition<'_> {
    fn name(&self) -> &'static str {
        "kv-write-position"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, _: &Layout) -> Result<()> {
        match storage {
            CpuStorage::F32(data) => self.write(data, |dst, row| dst.copy_from_slice(row)),
            // Rounded to nearest, as candle's `to_dtype` rounds an appended tensor.
            CpuStorage::F16(data) => self.write(data, |dst, row| {
                dst.iter_mut()
                    .zip(row)
                    .for_each(|(d, x)| *d = half::f16::from_f32(*x))
            }),
            _ => candle_core::bail!("a state's row written into keys neither f32 nor f16"),
        }
    }
}

impl WritePosition<'_> {
    /// Each head's row into `data`, through `put`.
    fn write<T>(&self, data: &mut [T], put: impl Fn(&mut [T], &[f32])) -> Result<()> {
        let (head, d) = self.stride;
        for (h, row) in self.values.chunks_exact(d).enumerate() {
            let at = self.at + h * head;
            match data.get_mut(at..at + d) {
                Some(dst) => put(dst, row),
                None => candle_core::bail!("a state's row written past its buffer"),
            }
        }
        Ok(())
    }
}

/// One layer's keys and values as a decode pass reads them in place: values at
/// `data[start + head * head_stride + position * d..][..d]` for positions `0..len`.
pub struct LayerData<'a> {
    pub k: Values<'a>,
    pub v: Values<'a>,
    pub start: usize,
    pub head_stride: usize,
    pub len: usize,
}

/// A state's keys or values as stored: f32, or f16 where the model keeps them so (half the
/// memory and the reads; see the `kv_cache_dtype` option).
#[derive(Clone, Copy)]
pub enum Values<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
}

impl<'a> Values<'a> {
    /// The values of `storage`, if it is f32 or f16 on CPU.
    pub fn of(storage: &'a Storage) -> Option<Self> {
        match storage {
            Storage::Cpu(CpuStorage::F32(data)) => Some(Values::F32(data)),
            Storage::Cpu(CpuStorage::F16(data)) => Some(Values::F16(data)),
            _ => None,
        }
    }
}

impl KvState {
    /// A state of `n_layers` layers that keeps keys and values in the dtype they come in.
    pub fn new(n_layers: usize) -> Self {
        KvState {
            layers: vec![None; n_layers],
            room: Room::Double,
            dtype: None,
            base: None,
        }
    }

    /// A state that continues `prefix` without copying it: its appends go to buffers of its
    /// own (with no spare room), and attention reads the prefix where `prefix` holds it
    /// ([`KvState::append_parts`]). For a state scored once and dropped, such as a coalition
    /// after a long cached context: it costs the positions it adds, not those it continues.
    /// Such a state never decodes in place ([`KvState::read`] gives `None`).
    pub fn after(prefix: KvState) -> KvState {
        if prefix.base.is_some() || prefix.is_empty() {
            return prefix.without_spare();
        }
        let dtype =
            (prefix.layers.iter().flatten().next()).map_or(prefix.dtype, |l| Some(l.buf.k.dtype()));
        KvState {
            layers: vec![None; prefix.layers.len()],
            room: Room::None,
            dtype,
            base: Some(Arc::new(prefix)),
        }
    }

    /// Positions read from the state this one continues ([`KvState::after`]).
    fn base_len(&self) -> usize {
        self.base.as_ref().map_or(0, |b| b.len())
    }

    /// This state's own layers as a state of their own (positions counted from the base's
    /// end).
    fn own(&self) -> KvState {
        KvState {
            base: None,
            ..self.clone()
        }
    }

    /// This state, storing the keys and values of layers it has none of yet as `dtype` (f32 or
    /// f16: see the `kv_cache_dtype` option).
    pub fn stored_as(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// This state, whose appends that copy leave no room to grow: a state that is scored once
    /// and dropped (a coalition after a long cached prefix) then copies the prefix once, not
    /// into a buffer of twice its size.
    pub fn without_spare(mut self) -> Self {
        self.room = Room::None;
        self
    }

    /// This state, whose appends that copy leave room for at most `n` more positions: a
    /// generation's state after its prompt, which its reply extends by fewer than `n`, copies
    /// the prompt once into a buffer of the prompt and the reply, not of twice the prompt.
    pub fn with_room_for(mut self, n: usize) -> Self {
        self.room = Room::For(n);
        self
    }

    /// Positions held (the same in every layer).
    pub fn len(&self) -> usize {
        self.base_len()
            + match self.layers.first() {
                Some(Some(layer)) => layer.len,
                _ => 0,
            }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions its buffers have room for (at least [`KvState::len`]; every layer grows alike,
    /// so the first layer's): what its memory is sized for while it decodes.
    pub fn capacity(&self) -> usize {
        self.base_len()
            + match self.layers.first() {
                Some(Some(layer)) => layer.capacity(),
                _ => 0,
            }
    }

    /// Appends `k` and `v` to `layer`, stored as the layer's keys are (for its first, as
    /// [`KvState::stored_as`] says, else as they come), and returns its whole keys and values
    /// (views that never change; a copy for a state made with [`KvState::after`]).
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        self.append_parts(layer, k, v)?.whole()
    }

    /// [`KvState::append`], returning the keys and values in their parts, none copied.
    pub fn append_parts(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<Parts> {
        let prefix = match &self.base {
            Some(base) => match &base.layers[layer] {
                Some(held) => {
                    let (k, v) = held.views()?;
                    let id = (Arc::as_ptr(&held.buf) as usize, held.len);
                    Some(Prefix { k, v, id })
                }
                None => None,
            },
            None => None,
        };
        let slot = &mut self.layers[layer];
        let dtype = slot.as_ref().map(|held| held.buf.k.dtype()).or(self.dtype);
        let stored = |t: &Tensor| dtype.map_or_else(|| Ok(t.clone()), |dtype| t.to_dtype(dtype));
        let (k, v) = (&stored(k)?, &stored(v)?);
        let in_place = match slot.as_mut() {
            Some(held) => held.append_in_place(k, v)?,
            None => false,
        };
        let (k, v) = match slot {
            Some(held) if in_place => held.views()?,
            _ => {
                let grown = Layer::grown(slot.as_ref(), k, v, self.room)?;
                slot.insert(grown).views()?
            }
        };
        Ok(Parts { prefix, k, v })
    }

    /// Appends one position to `layer`: `k` and `v` are `(kv_heads, head_dim)` row-major f32.
    /// In place (no allocation) where [`KvState::append`] would write in place; a layer with
    /// no keys yet, or one that must copy, goes through [`KvState::append`].
    pub fn push(&mut self, layer: usize, (k, v): (&[f32], &[f32]), kv_heads: usize) -> Result<()> {
        if let Some(held) = &mut self.layers[layer] {
            if held.push_in_place(k, v)? {
                return Ok(());
            }
        }
        let shape = (1, kv_heads, 1, k.len() / kv_heads.max(1));
        let device = &candle_core::Device::Cpu;
        let (k, v) = (
            Tensor::from_slice(k, shape, device)?,
            Tensor::from_slice(v, shape, device)?,
        );
        self.append(layer, &k, &v).map(drop)
    }

    /// Runs `f` over `layer`'s keys and values where they lie, if the layer holds f32 or f16
    /// values on CPU; `None` otherwise.
    pub fn read<R>(&self, layer: usize, f: impl FnOnce(LayerData<'_>) -> R) -> Option<R> {
        if self.base.is_some() {
            return None;
        }
        let held = self.layers.get(layer)?.as_ref()?;
        let (k, layout) = held.buf.k.storage_and_layout();
        let (v, v_layout) = held.buf.v.storage_and_layout();
        let (k, v) = (Values::of(&k)?, Values::of(&v)?);
        let &[1, _, capacity, d] = layout.dims() else {
            return None;
        };
        if !layout.is_contiguous() || layout != v_layout {
            return None;
        }
        Some(f(LayerData {
            k,
            v,
            start: layout.start_offset(),
            head_stride: capacity * d,
            len: held.len,
        }))
    }

    /// Makes `layer` hold positions `0..len` of `other`'s `layer` (a view, no copy): a sequence
    /// of a packed forward taking a prefix another sequence of the same pass has just computed.
    /// A later append here writes past `len` in place only if `other` holds no more than `len`.
    /// Where `other` continues a state ([`KvState::after`]), so does this one, from the first
    /// layer adopted on: it reads the positions `other` reads there.
    pub fn adopt(&mut self, layer: usize, other: &KvState, len: usize) -> Result<()> {
        let from_base = other.base_len().min(len);
        if let (Some(base), None) = (&other.base, &self.base) {
            let mut base = (**base).clone();
            base.crop(from_base)?;
            self.base = Some(Arc::new(base));
            self.room = Room::None;
        }
        self.layers[layer] = match &other.layers[layer] {
            Some(held) if len > from_base => Some(held.prefix(len - from_base)?),
            _ => None,
        };
        Ok(())
    }

    /// Keeps the first `len` positions of every layer. A state made with [`KvState::after`]
    /// cropped into its prefix becomes a view of that prefix.
    pub fn crop(&mut self, len: usize) -> Result<()> {
        let base_len = self.base_len();
        if let Some(base) = self.base.take_if(|_| len <= base_len) {
            let mut base = (*base).clone();
            base.crop(len)?;
            self.layers = base.layers;
            return Ok(());
        }
        let own = len - base_len;
        for slot in &mut self.layers {
            if let Some(held) = slot {
                *slot = if own == 0 {
                    None
                } else {
                    Some(held.prefix(own)?)
                };
            }
        }
        Ok(())
    }

    /// The keys and values of `layer`, if anything was appended to it (copied after the prefix
    /// for a state made with [`KvState::after`]).
    pub fn layer(&self, layer: usize) -> Option<(Tensor, Tensor)> {
        let own = self
            .layers
            .get(layer)?
            .as_ref()
            .and_then(|l| l.views().ok());
        let Some(base) = self.base.as_ref().and_then(|b| b.layer(layer)) else {
            return own;
        };
        match own {
            None => Some(base),
            Some((k, v)) => Some((
                Tensor::cat(&[&base.0, &k], SEQ_DIM).ok()?,
                Tensor::cat(&[&base.1, &v], SEQ_DIM).ok()?,
            )),
        }
    }

    /// Positions `start..start + len` as a state of their own, copied into exactly-sized
    /// buffers: a stored segment never keeps a larger tensor it was cut from alive.
    pub fn slice(&self, start: usize, len: usize) -> Result<KvState> {
        if let Some(base) = &self.base {
            let b = base.len();
            return match (start >= b, start + len <= b) {
                (true, _) => self.own().slice(start - b, len),
                (_, true) => base.slice(start, len),
                _ => KvState::concat(&[
                    base.slice(start, b - start)?,
                    self.own().slice(0, start + len - b)?,
                ]),
            };
        }
        let copy = |t: &Tensor| t.narrow(SEQ_DIM, start, len)?.force_contiguous();
        let layers = self
            .layers
            .iter()
            .map(|slot| match slot {
                Some(held) if len > 0 => {
                    let (k, v) = held.views()?;
                    Ok(Some(Layer::over(copy(&k)?, copy(&v)?, len)))
                }
                _ => Ok(None),
            })
            .collect::<Result<_>>()?;
        Ok(KvState {
            layers,
            room: Room::Double,
            dtype: self.dtype,
            base: None,
        })
    }

    /// The states of consecutive position ranges joined into one, in order. One part comes back
    /// as a cheap clone; several are copied once into new, exactly-sized buffers.
    pub fn concat(parts: &[KvState]) -> Result<KvState> {
        let Some(first) = parts.first() else {
            return Ok(KvState::new(0));
        };
        if parts.len() == 1 {
            return Ok(first.clone());
        }
        let layers = (0..first.layers.len())
            .map(|layer| {
                let (ks, vs): (Vec<Tensor>, Vec<Tensor>) =
                    parts.iter().filter_map(|part| part.layer(layer)).unzip();
                if ks.is_empty() {
                    return Ok(None);
                }
                let k = Tensor::cat(&ks, SEQ_DIM)?.contiguous()?;
                let len = k.dim(SEQ_DIM)?;
                Ok(Some(Layer::over(
                    k,
                    Tensor::cat(&vs, SEQ_DIM)?.contiguous()?,
                    len,
                )))
            })
            .collect::<Result<_>>()?;
        Ok(KvState {
            layers,
            room: Room::Double,
            dtype: parts.last().map_or(first.dtype, |last| last.dtype),
            base: None,
        })
    }

    /// Bytes of the positions held (a cropped view is counted at its cropped length; spare
    /// capacity is not counted).
    pub fn bytes(&self) -> u64 {
        self.base.as_ref().map_or(0, |b| b.bytes())
            + self
                .layers
                .iter()
                .flatten()
                .map(|l| {
                    let (_, heads, _, d) = l.buf.k.dims4().unwrap_or_default();
                    (2 * heads * l.len * d * l.buf.k.dtype().size_in_bytes()) as u64
                })
                .sum::<u64>()
    }
}

/// What the prompt-prefix cache keeps: a slice copies, a prefix is a view, and appends never
/// reach a stored position (see [`KvState::append`]).
impl Segment for KvState {
    fn empty() -> Self {
        KvState::new(0)
    }

    fn len(&self) -> usize {
        KvState::len(self)
    }

    fn bytes(&self) -> u64 {
        KvState::bytes(self)
    }

    fn slice(&self, start: usize, len: usize) -> Option<Self> {
        KvState::slice(self, start, len).ok()
    }

    fn prefix(&self, len: usize) -> Option<Self> {
        let mut view = self.clone();
        view.crop(len).ok()?;
        Some(view)
    }

    fn concat(parts: &[Self]) -> Option<Self> {
        KvState::concat(parts).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// Appends `n` positions holding `value` (keys) and `-value` (values) to layer 0.
    fn step(state: &mut KvState, value: f32, n: usize) -> Tensor {
        let t = Tensor::full(value, (1, 2, n, 4), &Device::Cpu).unwrap();
        state.append(0, &t, &t.neg().unwrap()).unwrap().0
    }

    /// The value at each position of layer 0, checked to agree across heads, keys and values.
    fn values(state: &KvState) -> Vec<f32> {
        let Some((k, v)) = state.layer(0) else {
            return Vec::new();
        };
        let keys: Vec<Vec<Vec<f32>>> = k.squeeze(0).unwrap().to_vec3().unwrap();
        let neg: Vec<Vec<Vec<f32>>> = v.neg().unwrap().squeeze(0).unwrap().to_vec3().unwrap();
        assert_eq!(keys, neg);
        let rows: Vec<f32> = keys[0].iter().map(|row| row[0]).collect();
        assert!(keys.iter().all(|head| head
            .iter()
            .zip(&rows)
            .all(|(row, &x)| row.iter().all(|&y| y == x))));
        rows
    }

    /// A state of one position per value.
    fn state_of(values: &[f32]) -> KvState {
        let mut state = KvState::new(1);
        for &value in values {
            step(&mut state, value, 1);
        }
        state
    }

    fn buffer(state: &KvState) -> &Arc<Buffer> {
        &state.layers[0].as_ref().unwrap().buf
    }

    /// A generation's state copies its prompt once into room for its reply alone, and the
    /// reply's positions land there in place; past that room it copies again, and it never
    /// leaves more room than doubling would.
    #[test]
    fn room_for_a_reply_is_what_the_first_copy_leaves() {
        let capacity = KvState::capacity;
        let mut prompt = KvState::new(1);
        step(&mut prompt, 1.0, 100);
        assert_eq!(capacity(&prompt), 100, "a first append is exact");
        let mut doubling = prompt.clone();
        step(&mut doubling, 2.0, 1);
        assert_eq!(capacity(&doubling), 200);
        let mut reply = prompt.with_room_for(3);
        step(&mut reply, 2.0, 1);
        assert_eq!(capacity(&reply), 104);
        let before = buffer(&reply).clone();
        (0..3).for_each(|_| drop(step(&mut reply, 3.0, 1)));
        assert!(Arc::ptr_eq(&before, buffer(&reply)), "the reply in place");
        step(&mut reply, 4.0, 1);
        assert_eq!(capacity(&reply), 108);
        let mut expected = vec![1.0; 100];
        expected.extend([2.0, 3.0, 3.0, 3.0, 4.0]);
        assert_eq!(values(&reply), expected);
        let mut short = KvState::new(1).with_room_for(1000);
        step(&mut short, 1.0, 10);
        step(&mut short, 1.0, 1);
        assert_eq!(capacity(&short), 20, "capped at doubling");
    }

    /// A state made with `after` adds buffers for its own positions only: attention reads the
    /// prefix where the cached state holds it (one id for every state continuing it), and
    /// slices, crops, copies and shares across the prefix's end hold what a flat state holds.
    #[test]
    fn a_state_after_a_prefix_holds_only_its_own_positions() {
        let cached = state_of(&[1.0, 2.0, 3.0]);
        let mut a = KvState::after(cached.clone());
        let mut b = KvState::after(cached.clone());
        let t = |x: f32, n| Tensor::full(x, (1, 2, n, 4), &Device::Cpu).unwrap();
        let pa = a.append_parts(0, &t(4.0, 2), &t(-4.0, 2)).unwrap();
        let pb = b.append_parts(0, &t(5.0, 1), &t(-5.0, 1)).unwrap();
        let (prefix_a, prefix_b) = (pa.prefix.unwrap(), pb.prefix.unwrap());
        assert_eq!(prefix_a.id, prefix_b.id, "one prefix, read where it lies");
        assert_eq!(prefix_a.id.0, Arc::as_ptr(buffer(&cached)) as usize);
        assert_eq!(pa.k.dims()[2], 2, "its own positions only");
        assert_eq!((a.len(), a.bytes()), (5, cached.bytes() / 3 * 5));
        assert_eq!(values(&a), [1.0, 2.0, 3.0, 4.0, 4.0]);
        assert_eq!(
            values(&cached),
            [1.0, 2.0, 3.0],
            "the cached state is untouched"
        );
        for (start, len) in [(0, 2), (1, 4), (3, 2), (4, 1)] {
            let flat = state_of(&[1.0, 2.0, 3.0, 4.0, 4.0]);
            let want = values(&flat.slice(start, len).unwrap());
            assert_eq!(values(&a.slice(start, len).unwrap()), want, "{start}+{len}");
        }
        // A sequence of the same pass taking 4 positions of `a` reads the prefix where it
        // lies too, and one position of `a`'s own.
        let mut c = KvState::new(1);
        c.adopt(0, &a, 4).unwrap();
        let pc = c.append_parts(0, &t(6.0, 1), &t(-6.0, 1)).unwrap();
        assert_eq!(pc.prefix.unwrap().id, prefix_a.id);
        assert_eq!(values(&c), [1.0, 2.0, 3.0, 4.0, 6.0]);
        assert_eq!(values(&a), [1.0, 2.0, 3.0, 4.0, 4.0], "`a` is untouched");
        let mut cropped = a.clone();
        cropped.crop(4).unwrap();
        assert_eq!(values(&cropped), [1.0, 2.0, 3.0, 4.0]);
        cropped.crop(2).unwrap();
        assert_eq!((cropped.len(), values(&cropped)), (2, vec![1.0, 2.0]));
        assert!(
            Arc::ptr_eq(buffer(&cropped), buffer(&cached)),
            "a view of the prefix"
        );
    }

    #[test]
    fn a_snapshot_is_unchanged_by_appends_in_place_after_it() {
        let mut a = KvState::new(1);
        step(&mut a, 1.0, 3);
        step(&mut a, 2.0, 1);
        let snapshot = a.clone();
        step(&mut a, 3.0, 2);
        assert!(Arc::ptr_eq(buffer(&a), buffer(&snapshot)), "wrote in place");
        assert_eq!(values(&snapshot), [1.0, 1.0, 1.0, 2.0]);
        assert_eq!(values(&a), [1.0, 1.0, 1.0, 2.0, 3.0, 3.0]);
    }

    #[test]
    fn branches_forked_from_one_snapshot_do_not_see_each_other() {
        let mut root = KvState::new(1);
        step(&mut root, 1.0, 2);
        step(&mut root, 1.0, 1);
        let (mut b, mut c) = (root.clone(), root.clone());
        let keys_b = step(&mut b, 2.0, 1);
        let keys_c = step(&mut c, 3.0, 1);
        assert!(
            Arc::ptr_eq(buffer(&b), buffer(&root)),
            "the first writes in place"
        );
        assert!(!Arc::ptr_eq(buffer(&c), buffer(&root)), "the second copies");
        step(&mut b, 4.0, 1);
        step(&mut root, 5.0, 1);
        assert_eq!(values(&b), [1.0, 1.0, 1.0, 2.0, 4.0]);
        assert_eq!(values(&c), [1.0, 1.0, 1.0, 3.0]);
        assert_eq!(values(&root), [1.0, 1.0, 1.0, 5.0]);
        // Tensors handed out by earlier appends do not change either.
        let position_3 = |keys: &Tensor| {
            let at = keys.narrow(2, 3, 1).unwrap();
            at.max_all().unwrap().to_scalar::<f32>().unwrap()
        };
        assert_eq!(position_3(&keys_b), 2.0);
        assert_eq!(position_3(&keys_c), 3.0);
    }

    #[test]
    fn crop_then_append_leaves_the_longer_snapshot_intact() {
        let mut a = KvState::new(1);
        step(&mut a, 1.0, 2);
        step(&mut a, 2.0, 3);
        let long = a.clone();
        a.crop(3).unwrap();
        step(&mut a, 9.0, 1);
        assert_eq!(values(&a), [1.0, 1.0, 2.0, 9.0]);
        assert_eq!(values(&long), [1.0, 1.0, 2.0, 2.0, 2.0]);
        a.crop(0).unwrap();
        assert!(a.is_empty() && a.layer(0).is_none());
        step(&mut a, 7.0, 1);
        assert_eq!(values(&a), [7.0]);
        assert!(a.crop(2).is_err(), "cannot crop past the end");
    }

    #[test]
    fn adopt_then_append_leaves_the_other_state_intact() {
        let mut a = KvState::new(1);
        step(&mut a, 1.0, 1);
        step(&mut a, 1.0, 1);
        step(&mut a, 2.0, 1);
        let mut part = KvState::new(1);
        part.adopt(0, &a, 2).unwrap();
        step(&mut part, 3.0, 1);
        let mut whole = KvState::new(1);
        whole.adopt(0, &a, 3).unwrap();
        step(&mut whole, 4.0, 1);
        assert!(Arc::ptr_eq(buffer(&whole), buffer(&a)), "wrote in place");
        step(&mut a, 5.0, 1);
        assert_eq!(values(&part), [1.0, 1.0, 3.0]);
        assert_eq!(values(&whole), [1.0, 1.0, 2.0, 4.0]);
        assert_eq!(values(&a), [1.0, 1.0, 2.0, 5.0]);
        assert!(part.adopt(0, &a, 5).is_err(), "cannot adopt past the end");
    }

    #[test]
    fn appends_copy_amortized_and_bytes_count_positions_held() {
        let mut a = KvState::new(1);
        let mut buffers = 0;
        for i in 0..200 {
            let before = a.layers[0].as_ref().map(|l| l.buf.clone());
            step(&mut a, i as f32, 1);
            buffers += usize::from(before.is_none_or(|b| !Arc::ptr_eq(&b, buffer(&a))));
        }
        assert_eq!(buffers, 9, "one buffer per doubling: 1, 2, 4, ..., 256");
        assert_eq!(values(&a), (0..200).map(|i| i as f32).collect::<Vec<_>>());
        let position = 2 * 2 * 4 * DType::F32.size_in_bytes() as u64;
        assert_eq!(a.bytes(), 200 * position, "spare capacity is not counted");
        a.crop(50).unwrap();
        assert_eq!(a.bytes(), 50 * position);
        let stored = a.slice(10, 40).unwrap();
        assert_eq!(
            stored.layers[0]
                .as_ref()
                .unwrap()
                .buf
                .k
                .dim(SEQ_DIM)
                .unwrap(),
            40
        );
    }

    /// A state stored as f16 keeps what it is given rounded to f16, whether appended as a
    /// tensor or pushed in place, in half the bytes; its slices and joins stay f16.
    #[test]
    fn an_f16_state_rounds_what_it_holds_and_counts_half_the_bytes() {
        let third = 1.0f32 / 3.0;
        let rounded = half::f16::from_f32(third).to_f32();
        assert_ne!(rounded, third);
        let (mut f16s, mut f32s) = (KvState::new(1).stored_as(DType::F16), KvState::new(1));
        for state in [&mut f16s, &mut f32s] {
            // 1, 2, then a buffer of 4 with room for the pushed position.
            (0..3).for_each(|_| drop(step(state, third, 1)));
            let before = buffer(state).clone();
            state.push(0, (&[third; 8], &[-third; 8]), 2).unwrap();
            assert!(Arc::ptr_eq(&before, buffer(state)), "pushed in place");
        }
        let (k, v) = f16s.layer(0).unwrap();
        assert_eq!((k.dtype(), v.dtype()), (DType::F16, DType::F16));
        let as_f32 = |state: &KvState| {
            let (k, v) = state.layer(0).unwrap();
            let f32s = |t: Tensor| t.to_dtype(DType::F32).unwrap();
            let mut copy = KvState::new(1);
            copy.append(0, &f32s(k), &f32s(v)).unwrap();
            copy
        };
        assert_eq!(values(&as_f32(&f16s)), [rounded; 4]);
        assert_eq!(values(&f32s), [third; 4]);
        assert_eq!(2 * f16s.bytes(), f32s.bytes());
        let parts = [f16s.slice(0, 1).unwrap(), f16s.slice(1, 3).unwrap()];
        let mut joined = KvState::concat(&parts).unwrap();
        step(&mut joined, third, 1);
        assert_eq!(joined.layer(0).unwrap().0.dtype(), DType::F16);
        assert_eq!(values(&as_f32(&joined)), [rounded; 5]);
        // The decode step finds f16 values where they lie.
        let read = f16s.read(0, |data| matches!(data.k, Values::F16(_)));
        assert_eq!(read, Some(true));
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
            assert_eq!(flat(&k), flat(&k0));
            assert_eq!(flat(&v), flat(&v0));
        }
        assert!(a.slice(1, 0).unwrap().is_empty());
    }

    #[test]
    fn branches_grown_from_cached_prefixes_leave_the_cache_alone() {
        use lmhost_plugin_kit::prefix_cache::PrefixCache;
        let mut cache = PrefixCache::new(16, 0);
        let stored = [1.0, 2.0, 3.0, 4.0, 5.0];
        cache.store(&[1, 2, 3, 4, 5], state_of(&stored));
        // A view of part of one stored segment, grown.
        let (mut b, len) = cache.lookup(&[1, 2, 3, 8, 8, 8], 0).unwrap();
        assert_eq!(len, 3);
        step(&mut b, 8.0, 2);
        assert_eq!(values(&b), [1.0, 2.0, 3.0, 8.0, 8.0]);
        cache.store(&[1, 2, 3, 8, 8], b);
        let (again, len) = cache.lookup(&[1, 2, 3, 4, 5, 6], 0).unwrap();
        assert_eq!(len, 5);
        assert_eq!(values(&again), stored);
        // A whole stored segment (after the split above, [1, 2, 3] is one), grown.
        let (mut head, len) = cache.lookup(&[1, 2, 3, 9], 0).unwrap();
        assert_eq!(len, 3);
        step(&mut head, 9.0, 3);
        // Segments joined from several nodes, grown.
        let (mut grown, _) = cache.lookup(&[1, 2, 3, 4, 5, 6], 0).unwrap();
        step(&mut grown, 6.0, 3);
        let (again, _) = cache.lookup(&[1, 2, 3, 4, 5, 6], 0).unwrap();
        assert_eq!(values(&again), stored);
        let (again, _) = cache.lookup(&[1, 2, 3, 8, 8, 0], 0).unwrap();
        assert_eq!(values(&again), [1.0, 2.0, 3.0, 8.0, 8.0]);
    }
}
