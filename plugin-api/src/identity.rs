//! A frozen, plain-C description of a plugin, read before abi_stable's layout check.
//!
//! When a plugin's layout does not match the host's, abi_stable refuses it with a long report
//! that names neither the plugin nor its API version. This symbol never changes layout, so the
//! host can always say which plugin, built against which API, was refused.

/// The symbol `export_plugin!` defines, NUL-terminated for `dlsym`.
pub const IDENTITY_SYMBOL: &[u8] = b"lmhost_plugin_identity\0";

/// Tells an lmhost identity from an unrelated symbol of the same name.
pub const IDENTITY_MAGIC: u64 = 0x6c6d_686f_7374_0001;

/// A borrowed `&'static str` in C layout.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawStr {
    ptr: *const u8,
    len: usize,
}

impl RawStr {
    pub const fn new(s: &'static str) -> Self {
        RawStr {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }

    /// # Safety
    /// `self` must come from [`RawStr::new`] in a library that is still loaded.
    pub unsafe fn to_string_lossy(self) -> String {
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// Never change this layout: it is how every past and future plugin introduces itself.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PluginIdentity {
    pub magic: u64,
    pub name: RawStr,
    pub version: RawStr,
    pub api_version: RawStr,
}

/// The signature of the identity symbol.
pub type IdentityFn = extern "C" fn() -> PluginIdentity;
