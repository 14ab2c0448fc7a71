//! (simcuda-exec owns this file)
