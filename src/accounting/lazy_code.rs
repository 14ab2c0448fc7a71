//! The code of a module or library the driver loads lazily, and what of it each context holds.

/// A module or library the driver loads lazily (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA
/// 12.2): its code goes to the device at lookups, each charged as it loads (see
/// [`Tenant::lazy_code_expected`]). A library's code is loaded per context: `cuLibraryLoadData`
/// says a lazily loaded library "will only be loaded when a function is needed for that context,
/// such as a kernel launch", so a second context needing the same kernel loads (and is charged)
/// it again; a module's, in its own context only (kept under context 0).
pub struct LazyCode {
    code: gpuslice_api::image::Code,
    /// What is loaded, by context handle.
    loaded: Vec<(usize, LoadedCode)>,
}

/// What of a lazily loaded module or library one context holds, and what it was charged there.
#[derive(Default)]
struct LoadedCode {
    data: bool,
    /// By index into `code.kernels`.
    kernels: Vec<bool>,
    bytes: u64,
    charged: u64,
}

impl LazyCode {
    pub(super) fn new(code: gpuslice_api::image::Code) -> Self {
        LazyCode {
            code,
            loaded: Vec::new(),
        }
    }

    fn in_context(&self, ctx: usize) -> Option<&LoadedCode> {
        self.loaded.iter().find(|(c, _)| *c == ctx).map(|(_, l)| l)
    }

    /// The bytes loaded in `ctx`.
    pub(super) fn bytes(&self, ctx: usize) -> u64 {
        self.in_context(ctx).map_or(0, |l| l.bytes)
    }

    /// The bytes loaded in `ctx` once `kernel` is looked up there, and the index of its code (if
    /// listed).
    pub(super) fn after_lookup(&self, ctx: usize, kernel: &[u8]) -> (u64, Option<usize>) {
        let loaded = self.in_context(ctx);
        let mut bytes = loaded.map_or(0, |l| l.bytes);
        if !loaded.is_some_and(|l| l.data) {
            bytes = bytes.saturating_add(self.code.data);
        }
        let index = self.code.kernels.iter().position(|(n, _)| n == kernel);
        let done = |i: usize| loaded.is_some_and(|l| l.kernels.get(i).copied().unwrap_or(false));
        if let Some(i) = index.filter(|&i| !done(i)) {
            bytes = bytes.saturating_add(self.code.kernels[i].1);
        }
        (bytes, index)
    }

    /// `kernel` loaded in `ctx`, which was charged `charged` more for it.
    pub(super) fn mark_loaded(&mut self, ctx: usize, kernel: &[u8], charged: u64) {
        let (bytes, index) = self.after_lookup(ctx, kernel);
        let at = match self.loaded.iter().position(|(c, _)| *c == ctx) {
            Some(at) => at,
            None => {
                self.loaded.push((ctx, LoadedCode::default()));
                self.loaded.len() - 1
            }
        };
        let n = self.code.kernels.len();
        let loaded = &mut self.loaded[at].1;
        loaded.kernels.resize(n, false);
        loaded.bytes = bytes;
        loaded.data = true;
        loaded.charged = loaded.charged.saturating_add(charged);
        if let Some(k) = index.and_then(|i| loaded.kernels.get_mut(i)) {
            *k = true;
        }
    }

    /// `ctx` was destroyed, and the code loaded in it with it: what it was charged there.
    pub(super) fn forget_context(&mut self, ctx: usize) -> u64 {
        if ctx == 0 {
            return 0;
        }
        let charged = self.in_context(ctx).map_or(0, |l| l.charged);
        self.loaded.retain(|(c, _)| *c != ctx);
        charged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_librarys_code_is_loaded_per_context() {
        let code = gpuslice_api::image::Code {
            data: 4096,
            kernels: vec![(b"a".to_vec(), 3 * MIB), (b"b".to_vec(), MIB)],
        };
        let mut lazy = LazyCode::new(code);
        let (one, two) = (0x1000, 0x2000);
        assert_eq!(lazy.after_lookup(one, b"a").0, 4096 + 3 * MIB);
        lazy.mark_loaded(one, b"a", 4 * MIB);
        assert_eq!(lazy.bytes(one), 4096 + 3 * MIB);
        // Loaded in the first context: nothing more there, all of it again in the second.
        assert_eq!(lazy.after_lookup(one, b"a").0, lazy.bytes(one));
        assert_eq!(lazy.after_lookup(two, b"a").0, 4096 + 3 * MIB);
        assert_eq!(lazy.after_lookup(one, b"b").0, 4096 + 4 * MIB);
        lazy.mark_loaded(two, b"a", 4 * MIB);
        lazy.mark_loaded(two, b"b", 0);
        assert_eq!(lazy.bytes(two), 4096 + 4 * MIB);
        // A destroyed context's code goes with it: what it was charged there comes back.
        assert_eq!(lazy.forget_context(two), 4 * MIB);
        assert_eq!(lazy.bytes(two), 0);
        assert_eq!(lazy.bytes(one), 4096 + 3 * MIB);
        assert_eq!(lazy.forget_context(0), 0);
    }

    const MIB: u64 = 1 << 20;
}
