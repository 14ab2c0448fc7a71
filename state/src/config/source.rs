//! Where a setting's value can come from: gpuslice's variable, HAMi's or MPS's alias, or the
//! quota file. Below the table, its readers and the loader, which all name sources.

/// Where a value can come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A `GPUSLICE_*` variable.
    Env(&'static str),
    /// A HAMi variable (`_<i>` suffixes: one per device index).
    Hami(&'static str),
    /// An MPS variable.
    Mps(&'static str),
    /// A key of the quota file (`[devices]` for the per-device table).
    File(&'static str),
}

impl Source {
    /// The variable's name, when the source is one.
    pub fn variable(self) -> Option<&'static str> {
        match self {
            Source::Env(v) | Source::Hami(v) | Source::Mps(v) => Some(v),
            Source::File(_) => None,
        }
    }

    pub(super) fn describe(self) -> String {
        match self {
            Source::Env(v) => format!("`{v}`"),
            Source::Hami(v) => format!("`{v}` (HAMi)"),
            Source::Mps(v) => format!("`{v}` (MPS)"),
            Source::File(k) => format!("quota file `{k}`"),
        }
    }
}
