//! MIG instances' identity. In MIG mode `cuDeviceGetUuid_v2` "returns its MIG UUID which uniquely
//! identifies the subscribed MIG compute instance" (cuda.h), the same 16 bytes that NVML,
//! `nvidia-smi -L`, `CUDA_VISIBLE_DEVICES` and device plugins spell `MIG-<uuid>` (MIG user guide,
//! "CUDA Device Enumeration": "each MIG device is assigned a GPU UUID starting with MIG-<UUID>",
//! <https://docs.nvidia.com/datacenter/tesla/mig-user-guide/mig-device-names.html>). CUDA does not
//! say whether a device is a MIG instance; NVML does: `nvmlDeviceGetHandleByUUID` finds a GPU by
//! its `GPU-` UUID and a MIG instance by its `MIG-` UUID. A device is keyed (limits, ledgers, views,
//! status) by the form NVML knows it by.

use std::sync::Mutex;

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`: the form NVML and `nvidia-smi -L` give a GPU's UUID.
pub fn format_uuid(b: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(40);
    out.push_str("GPU-");
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 15)]));
    }
    out
}

/// The key of the device whose UUID is `bytes`: `MIG-…` when NVML knows it as a MIG instance, else
/// `GPU-…` (also when NVML is not there to ask: a MIG instance is then keyed `GPU-<its UUID>`).
/// Asked once per device and process while NVML answers (a cold path: device resolution, ledger
/// and device-ledger joins).
pub fn device_key(bytes: &[u8; 16]) -> String {
    // (UUID, is a MIG instance); a few devices per process at most.
    static KNOWN: Mutex<Vec<([u8; 16], bool)>> = Mutex::new(Vec::new());
    let gpu = format_uuid(bytes);
    let known = KNOWN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(b, _)| b == bytes)
        .map(|&(_, mig)| mig);
    let mig = match known {
        Some(mig) => mig,
        None => match super::measure::known_as_mig_instance(&gpu) {
            Some(mig) => {
                let mut cache = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
                if !cache.iter().any(|(b, _)| b == bytes) {
                    cache.push((*bytes, mig));
                }
                mig
            }
            None => false,
        },
    };
    if mig {
        mig_form(&gpu)
    } else {
        gpu
    }
}

/// `MIG-…` for a UUID's `GPU-…` form.
pub fn mig_form(gpu: &str) -> String {
    format!("MIG-{}", gpu.get(4..).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuid_text() {
        let b = [
            0x53, 0x49, 0x4d, 0x47, 0x50, 0x55, 0x40, 0x00, 0x80, 0, 0, 0, 0, 0, 0, 0x1f,
        ];
        assert_eq!(
            super::format_uuid(&b),
            "GPU-53494d47-5055-4000-8000-00000000001f"
        );
    }

    #[test]
    fn mig_form_keeps_the_uuid() {
        assert_eq!(
            super::mig_form("GPU-53494d47-4d49-4000-8000-000000000001"),
            "MIG-53494d47-4d49-4000-8000-000000000001"
        );
    }
}
