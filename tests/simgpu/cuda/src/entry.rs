//! (simcuda-mem owns this file)
