//! simgpu's shared state (placeholder until simgpu-core lands).
pub fn trace(_args: std::fmt::Arguments<'_>) {}
