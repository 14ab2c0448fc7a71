//! Byte-size and percentage values (`4GiB`, `1.5G`, `512M`, `4294967296`, `50`).

/// Which unit spellings a value may use. gpuslice's own variables accept only binary units; the
/// aliases borrowed from HAMi and MPS accept their conventions too (both mean powers of 1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Units {
    /// `B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, K, M, G, T` (all powers of 1024; `Ki`..`Ti` are
    /// Kubernetes' spelling of the binary units, as in `resources.limits`).
    Gpuslice,
    /// gpuslice units plus HAMi's lower-case `k`, `m`, `g`, `t`.
    Hami,
    /// gpuslice units plus MPS's `KB`, `MB`, `GB`, `TB` (MPS means KiB..TiB by them).
    Mps,
}

impl Units {
    fn expected(self) -> &'static str {
        match self {
            Units::Gpuslice => "B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, K, M, G, T",
            Units::Hami => "B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, K, M, G, T, k, m, g, t",
            Units::Mps => "B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, K, M, G, T, KB, MB, GB, TB",
        }
    }

    fn shift(self, unit: &str) -> Option<u32> {
        let common = match unit {
            "" | "B" => Some(0),
            "K" | "KiB" | "Ki" => Some(10),
            "M" | "MiB" | "Mi" => Some(20),
            "G" | "GiB" | "Gi" => Some(30),
            "T" | "TiB" | "Ti" => Some(40),
            _ => None,
        };
        common.or(match (self, unit) {
            (Units::Hami, "k") => Some(10),
            (Units::Hami, "m") => Some(20),
            (Units::Hami, "g") => Some(30),
            (Units::Hami, "t") => Some(40),
            (Units::Mps, "KB") => Some(10),
            (Units::Mps, "MB") => Some(20),
            (Units::Mps, "GB") => Some(30),
            (Units::Mps, "TB") => Some(40),
            _ => None,
        })
    }
}

/// Parses a size such as `4GiB`, `1.5GiB`, `512M` or `4294967296` into bytes.
///
/// The error text says what is wrong and what was expected; the caller prefixes it with where the
/// value came from (`GPUSLICE_MEMORY_LIMIT="4 GB": ...`).
pub fn parse_size(text: &str, units: Units) -> Result<u64, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty value (expected a size such as 4GiB, 512MiB or 4294967296)".into());
    }
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = (&s[..num_end], s[num_end..].trim());
    if num.is_empty() {
        return Err("not a number (expected a size such as 4GiB, 512MiB or 4294967296)".into());
    }
    let Some(shift) = units.shift(unit) else {
        return Err(format!(
            "unknown unit \"{unit}\" (expected {})",
            units.expected()
        ));
    };
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if int_part.is_empty() || frac_part.contains('.') || (num.contains('.') && frac_part.is_empty())
    {
        return Err("malformed number (expected digits with an optional decimal part)".into());
    }
    if frac_part.len() > 12 {
        return Err("too many decimal places (at most 12)".into());
    }
    let too_large = || "too large (at most 16 EiB - 1 bytes)".to_string();
    // u128 with at most 20+12 digits cannot overflow before the final range check.
    let int: u128 = if int_part.len() > 20 {
        return Err(too_large());
    } else {
        int_part.parse().map_err(|_| too_large())?
    };
    let frac: u128 = if frac_part.is_empty() {
        0
    } else {
        frac_part.parse().map_err(|_| too_large())?
    };
    let scale = 10u128.pow(frac_part.len() as u32);
    let numer = (int * scale + frac) << shift;
    if numer % scale != 0 {
        return Err("not a whole number of bytes".into());
    }
    u64::try_from(numer / scale).map_err(|_| too_large())
}

/// Parses a percentage `1..=100` (compute share / cap). Decimals round to the nearest integer
/// (MPS accepts them), but never to 0.
pub fn parse_percent(text: &str) -> Result<u8, String> {
    let s = text.trim().trim_end_matches('%').trim();
    let expected = "expected a percentage from 1 to 100";
    let value: f64 = match s.parse::<f64>() {
        Ok(v) if v.is_finite() && s.chars().all(|c| c.is_ascii_digit() || c == '.') => v,
        _ => return Err(format!("not a number ({expected})")),
    };
    if value <= 0.0 || value > 100.0 {
        return Err(format!("out of range ({expected})"));
    }
    Ok((value.round() as u8).max(1))
}

/// Renders bytes for humans: `4 GiB`, `1.5 GiB`, `123 B`, `unlimited` for `u64::MAX`.
pub fn format_bytes(bytes: u64) -> String {
    if bytes == u64::MAX {
        return "unlimited".into();
    }
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (name, shift) in UNITS {
        let unit = 1u64 << shift;
        if bytes >= unit {
            let whole = bytes / unit;
            let hundredths = ((bytes % unit) as u128 * 100 / unit as u128) as u64;
            return match hundredths {
                0 => format!("{whole} {name}"),
                h if h % 10 == 0 => format!("{whole}.{} {name}", h / 10),
                h => format!("{whole}.{h:02} {name}"),
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn sizes() {
        let g = Units::Gpuslice;
        let table: &[(&str, u64)] = &[
            ("4GiB", 4 * GIB),
            ("4096MiB", 4 * GIB),
            ("4G", 4 * GIB),
            ("512M", 512 << 20),
            ("1.5GiB", 3 * GIB / 2),
            ("1TiB", 1 << 40),
            ("2T", 2 << 40),
            ("64KiB", 64 << 10),
            ("64K", 64 << 10),
            ("4294967296", 4 * GIB),
            ("100B", 100),
            ("0", 0),
            (" 4 GiB ", 4 * GIB),
            ("0.5K", 512),
            ("18446744073709551615", u64::MAX),
        ];
        for (text, want) in table {
            assert_eq!(parse_size(text, g), Ok(*want), "{text}");
        }
    }

    #[test]
    fn size_errors() {
        let g = Units::Gpuslice;
        let table: &[(&str, &str)] = &[
            (
                "4 GB",
                "unknown unit \"GB\" (expected B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, K, M, G, T)",
            ),
            (
                "4g",
                "unknown unit \"g\" (expected B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, K, M, G, T)",
            ),
            (
                "",
                "empty value (expected a size such as 4GiB, 512MiB or 4294967296)",
            ),
            (
                "GiB",
                "not a number (expected a size such as 4GiB, 512MiB or 4294967296)",
            ),
            (
                "-1",
                "not a number (expected a size such as 4GiB, 512MiB or 4294967296)",
            ),
            (
                "1.2.3G",
                "malformed number (expected digits with an optional decimal part)",
            ),
            (
                "1.G",
                "malformed number (expected digits with an optional decimal part)",
            ),
            (
                ".5G",
                "malformed number (expected digits with an optional decimal part)",
            ),
            ("0.1B", "not a whole number of bytes"),
            ("16777216TiB", "too large (at most 16 EiB - 1 bytes)"),
            (
                "18446744073709551616",
                "too large (at most 16 EiB - 1 bytes)",
            ),
            (
                "99999999999999999999999",
                "too large (at most 16 EiB - 1 bytes)",
            ),
        ];
        for (text, want) in table {
            assert_eq!(parse_size(text, g), Err(want.to_string()), "{text}");
        }
    }

    /// Kubernetes' binary suffixes (`4Gi`, as a pod's `resources.limits` writes them), for every
    /// spelling set; its other suffixes (`Pi`, `Ei`, decimal `k`) stay errors that list the units.
    #[test]
    fn kubernetes_units() {
        let table: &[(&str, u64)] = &[
            ("4Gi", 4 * GIB),
            ("512Mi", 512 << 20),
            ("64Ki", 64 << 10),
            ("1Ti", 1 << 40),
            ("1.5Gi", 3 * GIB / 2),
            (" 2 Gi ", 2 * GIB),
        ];
        for units in [Units::Gpuslice, Units::Hami, Units::Mps] {
            for (text, want) in table {
                assert_eq!(parse_size(text, units), Ok(*want), "{text} ({units:?})");
            }
        }
        assert_eq!(
            parse_size("1Pi", Units::Gpuslice),
            Err(
                "unknown unit \"Pi\" (expected B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, K, M, G, T)"
                    .into()
            )
        );
        assert!(parse_size("4gi", Units::Gpuslice).is_err());
        assert!(parse_size("4GI", Units::Gpuslice).is_err());
    }

    #[test]
    fn alias_units() {
        assert_eq!(parse_size("4g", Units::Hami), Ok(4 * GIB));
        assert_eq!(parse_size("512m", Units::Hami), Ok(512 << 20));
        assert_eq!(parse_size("512MB", Units::Mps), Ok(512 << 20));
        assert_eq!(parse_size("1GB", Units::Mps), Ok(GIB));
        assert!(parse_size("1GB", Units::Hami).is_err());
        assert!(parse_size("1g", Units::Mps).is_err());
    }

    #[test]
    fn percents() {
        assert_eq!(parse_percent("50"), Ok(50));
        assert_eq!(parse_percent("100"), Ok(100));
        assert_eq!(parse_percent("1"), Ok(1));
        assert_eq!(parse_percent("33.4"), Ok(33));
        assert_eq!(parse_percent("25%"), Ok(25));
        assert_eq!(parse_percent("0.2"), Ok(1));
        assert_eq!(
            parse_percent("0"),
            Err("out of range (expected a percentage from 1 to 100)".into())
        );
        assert_eq!(
            parse_percent("101"),
            Err("out of range (expected a percentage from 1 to 100)".into())
        );
        assert_eq!(
            parse_percent("half"),
            Err("not a number (expected a percentage from 1 to 100)".into())
        );
        assert_eq!(
            parse_percent("-5"),
            Err("not a number (expected a percentage from 1 to 100)".into())
        );
    }

    #[test]
    fn formatting() {
        assert_eq!(format_bytes(4 * GIB), "4 GiB");
        assert_eq!(format_bytes(3 * GIB / 2), "1.5 GiB");
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes(u64::MAX), "unlimited");
    }
}
