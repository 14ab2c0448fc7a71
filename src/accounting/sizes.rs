//! Sizes the driver does not report before (or at all), estimated from above: a pitched
//! allocation before its pitch is known, an array's footprint.

use super::{Device, Tenant};
use gpuslice_api::{CUerror, CUresult};

/// A pitched allocation as the program asked for it (`cuMemAllocPitch`).
#[derive(Clone, Copy, Debug)]
pub struct Pitch {
    pub width: u64,
    pub height: u64,
    /// Bytes per element (4, 8 or 16).
    pub element: u32,
}

impl Tenant {
    /// A pitched allocation: `call` allocates and returns the address and the pitch the driver
    /// chose; `free` undoes it when the quota has no room for pitch x height.
    pub fn alloc_pitch(
        &self,
        device: &Device,
        request: Pitch,
        call: impl FnOnce() -> Result<(u64, Option<u64>), CUerror>,
        free: impl FnOnce(u64) -> CUresult,
    ) -> CUresult {
        let Pitch {
            width,
            height,
            element,
        } = request;
        if !matches!(element, 4 | 8 | 16) || width == 0 || height == 0 {
            // Arguments the documentation says the driver refuses (an element size other than 4,
            // 8 or 16 bytes, an empty extent): its own error, not a quota refusal. Should a driver
            // allocate anyway, the allocation is charged afterwards, or freed.
            let (key, pitch) = call()?;
            let bytes = pitch.unwrap_or(0).saturating_mul(height);
            return self
                .charged(device, bytes, "cuMemAllocPitch", || Ok(key))
                .inspect_err(|_| {
                    let _ = free(key);
                });
        }
        // Before the call the pitch is not known: charge the width rounded to the usual 512-byte
        // pitch alignment, then settle on pitch x height.
        let estimate = width
            .div_ceil(512)
            .saturating_mul(512)
            .saturating_mul(height);
        let mut key = 0;
        let mut pitch = None;
        self.charged(device, estimate, "cuMemAllocPitch", || {
            (key, pitch) = call()?;
            Ok(key)
        })?;
        let real_bytes = pitch.unwrap_or(estimate).saturating_mul(height);
        if let Err(e) = self.recharge(key, device, real_bytes, "cuMemAllocPitch") {
            // Over quota once the real pitch is known: undo the allocation.
            let _ = self.uncharge(key, || free(key));
            return Err(e);
        }
        Ok(())
    }
}

/// Bytes per channel element of a `CUarray_format`.
fn format_bytes(format: u32) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // (UN)SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // (UN)SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // (UN)SIGNED_INT32, FLOAT
        _ => 16,                 // packed / block-compressed formats: at most 16 bytes a texel
    }
}

/// The device memory an array takes, estimated from above: texels x bytes, each mipmap level in
/// turn, rounded up to the 2 MiB pages arrays are laid out in. The driver does not report an array's
/// footprint, so the estimate is deliberately not smaller than what a driver lays out.
pub fn array_bytes(
    width: u64,
    height: u64,
    depth: u64,
    format: u32,
    channels: u32,
    levels: u32,
) -> u64 {
    const PAGE: u64 = 2 << 20;
    let texel = format_bytes(format).saturating_mul(u64::from(channels.max(1)));
    let mut total: u64 = 0;
    let (mut w, mut h, mut d) = (width.max(1), height.max(1), depth.max(1));
    for _ in 0..levels.clamp(1, 32) {
        total = total.saturating_add(w.saturating_mul(h).saturating_mul(d).saturating_mul(texel));
        w = (w / 2).max(1);
        h = (h / 2).max(1);
        d = (d / 2).max(1);
    }
    total.div_ceil(PAGE).saturating_mul(PAGE)
}

#[cfg(test)]
mod tests {
    use super::array_bytes;

    #[test]
    fn arrays_round_up_to_pages() {
        assert_eq!(array_bytes(1024, 1024, 0, 0x20, 4, 1), 16 << 20);
        assert_eq!(array_bytes(1, 0, 0, 0x01, 1, 1), 2 << 20);
        // Mipmaps add their levels: 16 MiB + 4 MiB + 1 MiB + ...
        assert_eq!(array_bytes(1024, 1024, 0, 0x20, 4, 11), 22 << 20);
    }
}
