//! A metadata-only GGUF reader: the header and the key/value pairs, nothing of the tensors.
//!
//! Tokenizers, chat templates and model hyper-parameters all live in a GGUF file's key/value
//! section, so a text front end needs no tensor code to read them. The layout follows ggml's
//! `gguf.cpp` (<https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>): magic `GGUF`,
//! version 2 or 3, tensor count, kv count, then the pairs, then each tensor's name, shape, type
//! and offset, all little-endian. Lengths and counts read from the file are checked against what
//! is left of it, values are capped in number, and shapes must not overflow, so a hostile header
//! cannot make the reader (or a loader that reads the file after it) allocate more than the
//! file holds.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

/// How deep arrays of arrays may nest; real files use one level.
const MAX_DEPTH: usize = 8;

/// How many values (array elements included) the metadata may hold: each costs 32 bytes in
/// memory however few it takes in the file, so this bounds the reader at 512 MiB. The largest
/// real vocabularies (262,144 tokens, with scores, types and merges) hold under 2 million.
const MAX_VALUES: u64 = 16 << 20;

/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;

/// The fewest bytes a tensor's header entry takes: name length, dimension count, type, offset.
const MIN_TENSOR_ENTRY: u64 = 8 + 4 + 4 + 8;

/// One GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as a signed integer, for any integer type.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as an `f32`, for either float type.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// The name of the value's type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// Why a GGUF file's metadata could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("not a GGUF file: magic {found:?}, expected \"GGUF\"")]
    Magic { found: String },
    #[error("unsupported GGUF version {found}, expected 2 or 3")]
    Version { found: u32 },
    #[error("the GGUF file ends early, while reading {what}")]
    Truncated { what: String },
    #[error("key `{key}`: {what} length {len} exceeds the GGUF file ({left} bytes left)")]
    TooLong {
        key: String,
        what: &'static str,
        len: u64,
        left: u64,
    },
    #[error("key `{key}`: unknown value type {found}, expected 0 to 12")]
    ValueType { key: String, found: u32 },
    #[error("key `{key}`: arrays nested deeper than {MAX_DEPTH} levels")]
    Nesting { key: String },
    #[error("key `{key}`: a string that is not UTF-8")]
    Utf8 { key: String },
    #[error("the metadata holds more than {MAX_VALUES} values")]
    TooManyValues,
    #[error(
        "the header declares {count} tensors, more than the file's {left} bytes left can describe"
    )]
    TooManyTensors { count: u64, left: u64 },
    #[error("tensor `{name}`: {problem}")]
    Tensor { name: String, problem: String },
    #[error("reading the file: {0}")]
    Io(#[from] io::Error),
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: Box<GgufError>,
    },
}

/// The key/value metadata of a GGUF file, and its tensors' headers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    version: u32,
    tensor_count: u64,
    values: HashMap<String, Value>,
    tensors: Vec<TensorHeader>,
}

/// One tensor's entry in the header: its name, shape (ggml order, fastest-varying first), ggml
/// type id and offset from the start of the data section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorHeader {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub offset: u64,
}

impl TensorHeader {
    /// How many elements the shape holds (it was checked not to overflow).
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

impl Metadata {
    /// Reads the metadata of the GGUF file at `path`; the error names the path.
    pub fn read(path: &Path) -> Result<Metadata, GgufError> {
        let in_file = |source: GgufError| GgufError::File {
            path: path.to_path_buf(),
            source: Box::new(source),
        };
        let file = File::open(path).map_err(|e| in_file(e.into()))?;
        let len = file.metadata().map_err(|e| in_file(e.into()))?.len();
        let mut reader = Reader::new(BufReader::new(file), len);
        reader.metadata().map_err(in_file)
    }

    /// Reads metadata from a stream positioned at the start of a GGUF file. Without a known
    /// length, sizes are bounded by what the stream actually delivers.
    pub fn from_reader(r: &mut impl Read) -> Result<Metadata, GgufError> {
        Reader::new(r, u64::MAX).metadata()
    }

    /// Metadata made of the given pairs (for tests and tools that build tiny models).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, Value)>) -> Metadata {
        Metadata {
            version: 3,
            tensor_count: 0,
            values: pairs.into_iter().collect(),
            tensors: Vec::new(),
        }
    }

    /// The tensors' headers, in file order.
    pub fn tensors(&self) -> &[TensorHeader] {
        &self.tensors
    }

    /// The GGUF version of the file (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// How many tensors the file declares.
    pub fn tensor_count(&self) -> u64 {
        self.tensor_count
    }

    /// All pairs.
    pub fn values(&self) -> &HashMap<String, Value> {
        &self.values
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key)
    }

    /// A string value.
    pub fn str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// An integer value of any type that fits in a `u32`.
    pub fn u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_i128()?.try_into().ok()
    }

    /// An integer value of any type that fits in a `u64`.
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_i128()?.try_into().ok()
    }

    /// A float value (`f32` or `f64`).
    pub fn f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    /// A boolean value.
    pub fn bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// An array value.
    pub fn array(&self, key: &str) -> Option<&[Value]> {
        match self.get(key)? {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A little-endian reader that knows how many bytes the file has left.
struct Reader<R> {
    inner: R,
    left: u64,
    /// Values the metadata may still hold ([`MAX_VALUES`]).
    values_left: u64,
}

impl<R: Read> Reader<R> {
    fn new(inner: R, len: u64) -> Self {
        Reader {
            inner,
            left: len,
            values_left: MAX_VALUES,
        }
    }

    fn metadata(&mut self) -> Result<Metadata, GgufError> {
        let magic: [u8; 4] = self.bytes(|| "the magic".into())?;
        if &magic != b"GGUF" {
            return Err(GgufError::Magic {
                found: String::from_utf8_lossy(&magic).into_owned(),
            });
        }
        let version = u32::from_le_bytes(self.bytes(|| "the version".into())?);
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version { found: version });
        }
        let tensor_count = u64::from_le_bytes(self.bytes(|| "the tensor count".into())?);
        let kv_count = u64::from_le_bytes(self.bytes(|| "the key/value count".into())?);
        let mut values = HashMap::new();
        for index in 0..kv_count {
            let key = self.string(&format!("key #{index}"), "key")?;
            let ty = u32::from_le_bytes(self.bytes(|| format!("the type of `{key}`"))?);
            let value = self.value(&key, ty, 0)?;
            values.insert(key, value);
        }
        if tensor_count > self.left / MIN_TENSOR_ENTRY {
            return Err(GgufError::TooManyTensors {
                count: tensor_count,
                left: self.left,
            });
        }
        let tensors = (0..tensor_count)
            .map(|index| self.tensor(index))
            .collect::<Result<_, _>>()?;
        Ok(Metadata {
            version,
            tensor_count,
            values,
            tensors,
        })
    }

    /// Tensor `index`'s header entry: at most [`MAX_DIMS`] dimensions whose product fits in a
    /// `u64`.
    fn tensor(&mut self, index: u64) -> Result<TensorHeader, GgufError> {
        let name = self.string(&format!("tensor #{index}"), "name")?;
        let n_dims = u32::from_le_bytes(self.bytes(|| format!("the dimensions of `{name}`"))?);
        let problem = |problem: String| GgufError::Tensor {
            name: name.clone(),
            problem,
        };
        if n_dims > MAX_DIMS {
            return Err(problem(format!(
                "{n_dims} dimensions, expected at most {MAX_DIMS}"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(u64::from_le_bytes(
                self.bytes(|| format!("the shape of `{name}`"))?,
            ));
        }
        if dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .is_none()
        {
            return Err(problem(format!(
                "shape {dims:?} holds more elements than a u64 counts"
            )));
        }
        let ggml_type = u32::from_le_bytes(self.bytes(|| format!("the type of `{name}`"))?);
        let offset = u64::from_le_bytes(self.bytes(|| format!("the offset of `{name}`"))?);
        Ok(TensorHeader {
            name,
            dims,
            ggml_type,
            offset,
        })
    }

    /// `N` bytes; `what` names them if the file ends first.
    fn bytes<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let mut buf = [0u8; N];
        if self.left < N as u64 {
            return Err(GgufError::Truncated { what: what() });
        }
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| eof_as(e, what))?;
        self.left -= N as u64;
        Ok(buf)
    }

    /// A length-prefixed string; `key` names the pair for messages.
    fn string(&mut self, key: &str, what: &'static str) -> Result<String, GgufError> {
        let len = u64::from_le_bytes(self.bytes(|| format!("the {what} length of `{key}`"))?);
        if len > self.left {
            return Err(GgufError::TooLong {
                key: key.to_string(),
                what,
                len,
                left: self.left,
            });
        }
        let mut buf = Vec::new();
        let read = (&mut self.inner).take(len).read_to_end(&mut buf)?;
        if (read as u64) < len {
            return Err(GgufError::Truncated {
                what: format!("the {what} of `{key}`"),
            });
        }
        self.left -= len;
        String::from_utf8(buf).map_err(|_| GgufError::Utf8 {
            key: key.to_string(),
        })
    }

    fn value(&mut self, key: &str, ty: u32, depth: usize) -> Result<Value, GgufError> {
        self.values_left = (self.values_left.checked_sub(1)).ok_or(GgufError::TooManyValues)?;
        let what = || format!("the value of `{key}`");
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.bytes(what)?)),
            1 => Value::I8(i8::from_le_bytes(self.bytes(what)?)),
            2 => Value::U16(u16::from_le_bytes(self.bytes(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes(what)?)),
            4 => Value::U32(u32::from_le_bytes(self.bytes(what)?)),
            5 => Value::I32(i32::from_le_bytes(self.bytes(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes(what)?)),
            7 => Value::Bool(self.bytes::<1>(&what)?[0] != 0),
            8 => Value::String(self.string(key, "string")?),
            9 => self.array(key, depth)?,
            10 => Value::U64(u64::from_le_bytes(self.bytes(what)?)),
            11 => Value::I64(i64::from_le_bytes(self.bytes(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes(what)?)),
            found => {
                return Err(GgufError::ValueType {
                    key: key.to_string(),
                    found,
                })
            }
        })
    }

    fn array(&mut self, key: &str, depth: usize) -> Result<Value, GgufError> {
        if depth >= MAX_DEPTH {
            return Err(GgufError::Nesting {
                key: key.to_string(),
            });
        }
        let what = || format!("the array header of `{key}`");
        let ty = u32::from_le_bytes(self.bytes(what)?);
        let len = u64::from_le_bytes(self.bytes(what)?);
        // Every element takes at least one byte, so a longer array cannot fit in the file.
        if len > self.left {
            return Err(GgufError::TooLong {
                key: key.to_string(),
                what: "array",
                len,
                left: self.left,
            });
        }
        if len > self.values_left {
            return Err(GgufError::TooManyValues);
        }
        let mut items = Vec::with_capacity(len.min(1 << 16) as usize);
        for _ in 0..len {
            items.push(self.value(key, ty, depth + 1)?);
        }
        Ok(Value::Array(items))
    }
}

fn eof_as(e: io::Error, what: impl FnOnce() -> String) -> GgufError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        GgufError::Truncated { what: what() }
    } else {
        e.into()
    }
}

#[cfg(test)]
pub(crate) mod write {
    //! A GGUF writer for tests: just enough to produce the files the reader reads.

    use super::Value;

    fn type_id(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    fn value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.extend(x.to_le_bytes()),
            Value::I8(x) => out.extend(x.to_le_bytes()),
            Value::U16(x) => out.extend(x.to_le_bytes()),
            Value::I16(x) => out.extend(x.to_le_bytes()),
            Value::U32(x) => out.extend(x.to_le_bytes()),
            Value::I32(x) => out.extend(x.to_le_bytes()),
            Value::U64(x) => out.extend(x.to_le_bytes()),
            Value::I64(x) => out.extend(x.to_le_bytes()),
            Value::F32(x) => out.extend(x.to_le_bytes()),
            Value::F64(x) => out.extend(x.to_le_bytes()),
            Value::Bool(x) => out.push(u8::from(*x)),
            Value::String(s) => string(out, s),
            Value::Array(items) => {
                let ty = items.first().map_or(4, type_id);
                out.extend(ty.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|item| value(out, item));
            }
        }
    }

    /// A GGUF v3 file with no tensors and the given pairs.
    pub(crate) fn gguf(pairs: &[(&str, Value)]) -> Vec<u8> {
        with_tensors(pairs, &[])
    }

    /// A GGUF v3 header with the given pairs and tensor entries `(name, dims, type, offset)`.
    pub(crate) fn with_tensors(
        pairs: &[(&str, Value)],
        tensors: &[(&str, &[u64], u32, u64)],
    ) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((pairs.len() as u64).to_le_bytes());
        for (key, v) in pairs {
            string(&mut out, key);
            out.extend(type_id(v).to_le_bytes());
            value(&mut out, v);
        }
        for (name, dims, ty, offset) in tensors {
            string(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::write::gguf;
    use super::*;

    fn sample() -> Vec<(&'static str, Value)> {
        vec![
            ("general.architecture", Value::String("llama".into())),
            ("llama.context_length", Value::U64(2048)),
            ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
            ("eps", Value::F32(1e-5)),
            ("small", Value::I8(-3)),
            (
                "tokens",
                Value::Array(vec![Value::String("a".into()), Value::String("ü".into())]),
            ),
            (
                "nested",
                Value::Array(vec![Value::Array(vec![Value::I16(1), Value::I16(2)])]),
            ),
            ("wide", Value::F64(0.5)),
        ]
    }

    #[test]
    fn reads_back_every_type() {
        let bytes = gguf(&sample());
        let meta = Metadata::from_reader(&mut bytes.as_slice()).expect("valid file");
        for (key, v) in sample() {
            assert_eq!(meta.get(key), Some(&v), "{key}");
        }
        assert_eq!(meta.str("general.architecture"), Some("llama"));
        assert_eq!(meta.u32("llama.context_length"), Some(2048));
        assert_eq!(meta.u32("small"), None);
        assert_eq!(meta.bool("tokenizer.ggml.add_bos_token"), Some(true));
        assert_eq!(meta.f32("wide"), Some(0.5));
        assert_eq!(meta.version(), 3);
    }

    #[test]
    fn read_names_the_path() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("bad.gguf");
        std::fs::write(&path, b"GGML\x03\0\0\0").expect("write");
        let err = Metadata::read(&path).expect_err("bad magic").to_string();
        assert!(err.contains("bad.gguf"), "{err}");
        assert!(err.contains("expected \"GGUF\""), "{err}");
    }

    #[test]
    fn refuses_other_versions() {
        let mut bytes = gguf(&[]);
        bytes[4] = 1;
        let err = Metadata::from_reader(&mut bytes.as_slice()).expect_err("v1");
        assert!(
            err.to_string().contains("version 1, expected 2 or 3"),
            "{err}"
        );
    }

    #[test]
    fn a_huge_string_length_is_an_error_not_an_allocation() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("huge.gguf");
        let mut bytes = gguf(&[("x", Value::String("short".into()))]);
        let at = bytes.len() - 5 - 8;
        bytes[at..at + 8].copy_from_slice(&9_000_000_000_000_000_000u64.to_le_bytes());
        std::fs::write(&path, &bytes).expect("write");
        let err = Metadata::read(&path).expect_err("too long").to_string();
        assert!(
            err.contains("key `x`: string length 9000000000000000000 exceeds the GGUF file"),
            "{err}"
        );
        let err = Metadata::from_reader(&mut bytes.as_slice()).expect_err("truncated");
        assert!(err.to_string().contains("ends early"), "{err}");
    }

    /// Tensor entries read back; a header that declares a billion tensors, a name of 2^60
    /// bytes, five dimensions or a shape whose product overflows is refused by name before
    /// anything is allocated for it.
    #[test]
    fn tensor_headers_are_read_and_hostile_ones_refused() {
        let pairs = [("general.architecture", Value::String("llama".into()))];
        let ok = write::with_tensors(&pairs, &[("w", &[4, 2], 1, 64), ("b", &[4], 0, 0)]);
        let meta = Metadata::from_reader(&mut ok.as_slice()).expect("valid header");
        let w = &meta.tensors()[0];
        assert_eq!(
            (w.name.as_str(), &w.dims[..], w.ggml_type, w.offset),
            ("w", &[4, 2][..], 1, 64)
        );
        assert_eq!((meta.tensors().len(), w.elements()), (2, 8));
        let refused = |bytes: Vec<u8>| -> String {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("hostile.gguf");
            std::fs::write(&path, &bytes).expect("write");
            Metadata::read(&path).expect_err("hostile").to_string()
        };
        let mut billion = write::with_tensors(&pairs, &[("w", &[4], 0, 0)]);
        billion[8..16].copy_from_slice(&1_000_000_000u64.to_le_bytes());
        let err = refused(billion);
        assert!(
            err.contains("declares 1000000000 tensors, more than the file's"),
            "{err}"
        );
        let mut long_name = write::with_tensors(&pairs, &[("w", &[4], 0, 0)]);
        let at = long_name.len() - (1 + 4 + 8 + 4 + 8) - 8;
        long_name[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let err = refused(long_name);
        assert!(
            err.contains("name length 1152921504606846976 exceeds the GGUF file"),
            "{err}"
        );
        let err = refused(write::with_tensors(
            &pairs,
            &[("w", &[1, 1, 1, 1, 1], 0, 0)],
        ));
        assert!(
            err.contains("tensor `w`: 5 dimensions, expected at most 4"),
            "{err}"
        );
        let err = refused(write::with_tensors(
            &pairs,
            &[("w", &[1 << 40, 1 << 40], 0, 0)],
        ));
        assert!(
            err.contains("tensor `w`: shape [1099511627776, 1099511627776] holds more elements"),
            "{err}"
        );
    }

    /// An array longer than the values the reader may hold is refused before its elements are
    /// read, though the file holds its bytes.
    #[test]
    fn more_values_than_the_cap_are_refused() {
        let mut bytes = gguf(&[("a", Value::Array(vec![Value::U8(1)]))]);
        let at = bytes.len() - 1 - 8;
        bytes[at..at + 8].copy_from_slice(&(MAX_VALUES + 1).to_le_bytes());
        bytes.resize(bytes.len() + MAX_VALUES as usize, 0);
        let err = Metadata::from_reader(&mut bytes.as_slice()).expect_err("too many");
        assert!(
            err.to_string().contains("more than 16777216 values"),
            "{err}"
        );
    }

    #[test]
    fn a_huge_array_length_is_an_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("array.gguf");
        let mut bytes = gguf(&[("a", Value::Array(vec![Value::U8(1)]))]);
        let at = bytes.len() - 1 - 8;
        bytes[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&path, &bytes).expect("write");
        let err = Metadata::read(&path).expect_err("too long").to_string();
        assert!(err.contains("key `a`: array length"), "{err}");
    }

    #[test]
    fn truncation_and_unknown_types_are_named() {
        let bytes = gguf(&sample());
        for cut in [3, 10, 30, bytes.len() - 1] {
            let err = Metadata::from_reader(&mut &bytes[..cut]).expect_err("cut");
            assert!(err.to_string().contains("ends early"), "{cut}: {err}");
        }
        let mut bytes = gguf(&[("t", Value::U8(0))]);
        let at = bytes.len() - 1 - 4;
        bytes[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
        let err = Metadata::from_reader(&mut bytes.as_slice()).expect_err("type");
        assert!(
            err.to_string().contains("key `t`: unknown value type 99"),
            "{err}"
        );
    }

    #[test]
    fn deep_nesting_is_refused() {
        let mut v = Value::U8(0);
        for _ in 0..MAX_DEPTH + 1 {
            v = Value::Array(vec![v]);
        }
        let bytes = gguf(&[("deep", v)]);
        let err = Metadata::from_reader(&mut bytes.as_slice()).expect_err("deep");
        assert!(err.to_string().contains("nested deeper"), "{err}");
    }
}
