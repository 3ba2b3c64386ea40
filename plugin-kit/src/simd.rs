//! The widest SIMD that lmhost's own kernels may use: what the CPU has, capped by the
//! environment variable `LMHOST_SIMD` (`scalar`, `avx2` or `avx512`).
//!
//! Every kernel that picks an instruction set at run time asks here first, so one switch runs
//! the narrower paths on a wider CPU: the test suite runs with `LMHOST_SIMD=avx2` as well, so
//! the paths a CPU without AVX-512 takes are exercised on one that has it, and a user can rule
//! out a path they distrust. Libraries' own kernels (candle's, ONNX Runtime's) are not capped.

use std::sync::OnceLock;

/// The environment variable that caps the SIMD level.
pub const VAR: &str = "LMHOST_SIMD";

/// Instruction-set levels, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Simd {
    Scalar,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512 (the kernels that need VNNI ask the CPU for it too).
    Avx512,
}

impl Simd {
    const NAMES: [(&'static str, Simd); 3] = [
        ("scalar", Simd::Scalar),
        ("avx2", Simd::Avx2),
        ("avx512", Simd::Avx512),
    ];

    /// A level by its name, or an error naming the variable and the names it takes.
    pub fn parse(name: &str) -> Result<Simd, String> {
        let name = name.trim();
        Self::NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, level)| level)
            .ok_or_else(|| {
                format!("{VAR}={name:?} is not a SIMD level; expected scalar, avx2 or avx512")
            })
    }

    /// The cap `LMHOST_SIMD` sets (none when unset or empty), read once per process. A
    /// backend checks it when it is made, so an unknown value is refused by name.
    pub fn cap() -> Result<Option<Simd>, String> {
        static CAP: OnceLock<Result<Option<Simd>, String>> = OnceLock::new();
        CAP.get_or_init(|| match std::env::var(VAR) {
            Ok(name) if !name.trim().is_empty() => Simd::parse(&name).map(Some),
            _ => Ok(None),
        })
        .clone()
    }

    /// Whether kernels of this level may run (the CPU is asked separately). An unknown cap,
    /// refused where a backend is made, allows everything here rather than panicking in a
    /// kernel.
    pub fn allowed(self) -> bool {
        Simd::cap().ok().flatten().is_none_or(|cap| self <= cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_by_name_and_unknown_ones_are_named() {
        assert_eq!(Simd::parse("AVX2"), Ok(Simd::Avx2));
        assert_eq!(Simd::parse(" scalar "), Ok(Simd::Scalar));
        assert_eq!(Simd::parse("avx512"), Ok(Simd::Avx512));
        let err = Simd::parse("sse4").unwrap_err();
        assert!(
            err.contains("LMHOST_SIMD") && err.contains("avx512"),
            "{err}"
        );
        assert!(Simd::Scalar < Simd::Avx2 && Simd::Avx2 < Simd::Avx512);
    }
}
