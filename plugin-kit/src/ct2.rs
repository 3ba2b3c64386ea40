//! Reads CTranslate2 `model.bin` files (faster-whisper's format) into named f32 variables.
//!
//! Layout (little-endian; CTranslate2's `models/model.cc`): u32 binary version; for version >= 2
//! a spec name and a u32 revision; a u32 variable count; per variable a name, a u8 rank, rank u32
//! dimensions, for version >= 4 a u8 dtype (0 f32, 1 i8, 2 i16, 3 i32, 4 f16, 5 bf16) and a u32
//! byte count, then the data; then (version >= 3) a u32 alias count and alias pairs. Strings are
//! a u16 length and bytes, NUL-padded. Every count and size is checked against the bytes there
//! are, so a hostile file is an error, never an allocation beyond what it holds (aliases copy at
//! most as many values as the file stores).

use std::collections::HashMap;

use half::{bf16, f16};

/// One variable as stored: dimensions and values (converted to f32).
pub struct Variable {
    pub dims: Vec<usize>,
    pub values: Vec<f32>,
}

/// A bounds-checked reader; every short read is an error naming the offset.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "truncated: {what} needs {n} bytes at offset {} but the file has {}",
                self.pos,
                self.bytes.len()
            ));
        };
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, String> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let n = self.u16(what)? as usize;
        let raw = self.take(n, what)?;
        let raw = raw.split(|&b| b == 0).next().unwrap_or_default();
        String::from_utf8(raw.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }
}

fn decode(raw: &[u8], dtype: u8, name: &str) -> Result<Vec<f32>, String> {
    let values = match dtype {
        0 => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        1 => raw.iter().map(|&b| f32::from(b as i8)).collect(),
        2 => raw
            .chunks_exact(2)
            .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])))
            .collect(),
        3 => raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
            .collect(),
        4 => raw
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        5 => raw
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(format!(
                "variable `{name}` has unknown dtype {other}; expected 0-5 (f32, i8, i16, i32, f16, bf16)"
            ))
        }
    };
    Ok(values)
}

/// Parses the variables (aliases resolved to copies) of a `model.bin` image: its spec name
/// (`WhisperSpec`) and its variables by name.
pub fn parse(bytes: &[u8]) -> Result<(String, HashMap<String, Variable>), String> {
    let mut c = Cursor { bytes, pos: 0 };
    let version = c.u32("the binary version")?;
    if !(1..=6).contains(&version) {
        return Err(format!(
            "binary version {version} is not a CTranslate2 model (expected 1 to 6)"
        ));
    }
    let spec = if version >= 2 {
        let spec = c.string("the spec name")?;
        c.u32("the spec revision")?;
        spec
    } else {
        String::new()
    };
    let count = c.u32("the variable count")?;
    let mut vars = HashMap::new();
    for i in 0..count {
        let name = c.string(&format!("the name of variable {i}"))?;
        let rank = c.u8(&format!("the rank of `{name}`"))?;
        let dims = (0..rank)
            .map(|_| {
                c.u32(&format!("the dimensions of `{name}`"))
                    .map(|d| d as usize)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (dtype, n_bytes) = if version >= 4 {
            let dtype = c.u8(&format!("the dtype of `{name}`"))?;
            (dtype, c.u32(&format!("the size of `{name}`"))? as usize)
        } else {
            (0, c.u32(&format!("the size of `{name}`"))? as usize * 4)
        };
        let values = decode(
            c.take(n_bytes, &format!("the data of `{name}`"))?,
            dtype,
            &name,
        )?;
        let expected = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if expected != Some(values.len()) {
            return Err(format!(
                "variable `{name}` holds {} values but its dimensions {dims:?} need {}",
                values.len(),
                expected.map_or("more than a usize counts".into(), |n| n.to_string())
            ));
        }
        vars.insert(name, Variable { dims, values });
    }
    if version >= 3 && c.pos < bytes.len() {
        let stored: usize = vars.values().map(|v| v.values.len()).sum();
        let mut copied = 0usize;
        let aliases = c.u32("the alias count")?;
        for _ in 0..aliases {
            let alias = c.string("an alias name")?;
            let target = c.string("an alias target")?;
            if let Some(v) = vars.get(&target) {
                // A few bytes of alias would otherwise buy a copy of any variable, each time.
                copied = copied.saturating_add(v.values.len());
                if copied > stored {
                    return Err(format!(
                        "aliases copy more values than the file's {stored}; a model.bin's \
                         aliases name a few shared variables"
                    ));
                }
                let copy = Variable {
                    dims: v.dims.clone(),
                    values: v.values.clone(),
                };
                vars.insert(alias, copy);
            }
        }
    }
    Ok((spec, vars))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u16 + 1).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }

    /// A version-6 image with one f16 variable, one f32 variable and an alias.
    fn image() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&6u32.to_le_bytes());
        string(&mut b, "WhisperSpec");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes());
        string(&mut b, "a");
        b.push(1);
        b.extend_from_slice(&2u32.to_le_bytes());
        b.push(4);
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&[0x00, 0x3c, 0x00, 0xc0]); // f16 1.0, -2.0
        string(&mut b, "s");
        b.push(0);
        b.push(0);
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&6f32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        string(&mut b, "b");
        string(&mut b, "a");
        b
    }

    #[test]
    fn parses_names_dims_dtypes_and_aliases() {
        let (spec, vars) = parse(&image()).unwrap();
        assert_eq!(spec, "WhisperSpec");
        assert_eq!(vars["a"].dims, vec![2]);
        assert_eq!(vars["a"].values, vec![1.0, -2.0]);
        assert_eq!(vars["b"].values, vec![1.0, -2.0]);
        assert_eq!(vars["s"].values, vec![6.0]);
    }

    #[test]
    fn truncated_or_foreign_files_are_errors_not_panics() {
        let full = image();
        for cut in [0, 3, 10, 30, full.len() - 3] {
            let err = parse(&full[..cut])
                .err()
                .expect("truncated image must fail");
            assert!(
                err.contains("truncated") || err.contains("alias"),
                "{cut}: {err}"
            );
        }
        let err = parse(b"GGUF\x03\x00\x00\x00").err().unwrap();
        assert!(err.contains("not a CTranslate2 model"), "{err}");
    }

    /// Dimensions whose product overflows are refused by name, not multiplied into a panic.
    #[test]
    fn overflowing_dimensions_are_refused() {
        let mut b = Vec::new();
        b.extend_from_slice(&6u32.to_le_bytes());
        string(&mut b, "WhisperSpec");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        string(&mut b, "w");
        b.push(3);
        [u32::MAX; 3]
            .iter()
            .for_each(|d| b.extend_from_slice(&d.to_le_bytes()));
        b.push(0);
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&1f32.to_le_bytes());
        let err = parse(&b).err().unwrap();
        assert!(err.contains("need more than a usize counts"), "{err}");
    }

    /// Aliases that would copy a variable again and again are refused, not materialised.
    #[test]
    fn aliases_copying_more_than_the_file_holds_are_refused() {
        let mut b = image();
        b.truncate(b.len() - 4 - 2 * 4);
        b.extend_from_slice(&1000u32.to_le_bytes());
        for i in 0..1000 {
            string(&mut b, &format!("c{i}"));
            string(&mut b, "a");
        }
        let err = parse(&b).err().unwrap();
        assert!(err.contains("aliases copy more values"), "{err}");
    }
}
