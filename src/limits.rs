//! Limits: what a request may carry, what a run may use, what it returns,
//! and how a request's own limits and timeout are narrowed to the server's.

use std::time::Duration;

use crate::api::RunLimits;
use crate::error::ExecError;
use crate::protocol::WireLimits;

/// Shortest ttl a session takes: session times (`expires_at`) are kept to
/// the millisecond, so a shorter one cannot be told from none.
pub(crate) const MIN_SESSION_TTL: f64 = 0.001;

/// `seconds` (positive and finite) as a duration, at most `max`: checked
/// before converting, since `Duration::from_secs_f64` panics past `u64`.
pub(crate) fn capped_secs(seconds: f64, max: Duration) -> Duration {
    if seconds >= max.as_secs_f64() {
        max
    } else {
        Duration::from_secs_f64(seconds)
    }
}

/// Caps on what a run returns besides its output.
#[derive(Debug, Clone, Copy)]
pub struct ResultLimits {
    /// Largest single artifact returned with its content.
    pub max_artifact_bytes: u64,
    /// Content of all artifacts of one run together.
    pub max_artifacts_bytes: u64,
    /// Longest `result` repr before it is cut.
    pub max_result_chars: u64,
}

/// Hard ceilings for limits a request sets where the server sets none.
const MAX_PROCESSES: u64 = 4096;
const MAX_MEMORY_BYTES: u64 = 16 << 30;

/// A request's own limits, each within what the server allows: a request may
/// lower a configured limit, never raise it.
pub(crate) fn narrow_limits(
    configured: &WireLimits,
    asked: &RunLimits,
) -> Result<WireLimits, ExecError> {
    let pick = |name: &str, asked: Option<u64>, ceiling: Option<u64>| match asked {
        Some(0) => Err(ExecError::BadRequest(format!(
            "limits.{name} must be positive"
        ))),
        Some(v) => Ok(Some(ceiling.map_or(v, |c| v.min(c)))),
        None => Ok(ceiling),
    };
    Ok(WireLimits {
        cpu_seconds: pick("cpu_seconds", asked.cpu_seconds, configured.cpu_seconds)?,
        memory_bytes: pick(
            "memory_bytes",
            asked.memory_bytes,
            configured.memory_bytes.or(Some(MAX_MEMORY_BYTES)),
        )?,
        file_size_bytes: pick(
            "file_size_bytes",
            asked.file_size_bytes,
            configured.file_size_bytes,
        )?,
        open_files: pick("open_files", asked.open_files, configured.open_files)?,
        processes: pick(
            "processes",
            asked.processes,
            configured.processes.or(Some(MAX_PROCESSES)),
        )?,
        disk_bytes: pick("disk_bytes", asked.disk_bytes, configured.disk_bytes)?,
    })
}

/// Caps on what one request may carry (the body as a whole is capped by
/// `max_body_bytes`).
#[derive(Debug, Clone, Copy, serde::Serialize, utoipa::ToSchema)]
pub struct RequestLimits {
    /// Bytes of `code`.
    pub max_code_bytes: usize,
    /// Entries in `files`.
    pub max_files: usize,
    /// Decoded bytes of all `files` together.
    pub max_files_bytes: usize,
}

/// A number a person reads in a message (seconds, a tolerance): as `{}`
/// writes it (`30`, `2.5`, `0.0123456789`), except below 1e-4 and from
/// 1e16 on, where that is a long row of zeros (`1e-300` has 300 digits)
/// and scientific notation (`1e-300`, `1.5e16`) is short; Python's `repr`
/// switches there too.
pub(crate) fn readable(x: f64) -> String {
    let size = x.abs();
    if size != 0.0 && size.is_finite() && !(1e-4..1e16).contains(&size) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// The wall-clock limit of a run or session: `asked` when positive, at most
/// `max`; `default` when the request asks for none.
pub(crate) fn run_timeout(asked: Option<f64>, default: f64, max: f64) -> Result<f64, ExecError> {
    match asked {
        None => Ok(default),
        Some(t) if t.is_finite() && t > 0.0 => Ok(t.min(max)),
        Some(t) => Err(ExecError::BadRequest(format!(
            "timeout must be a positive number of seconds, got {}",
            readable(t)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_short() {
        for (s, text) in [
            (30.0, "30"),
            (2.5, "2.5"),
            (0.0123456789, "0.0123456789"),
            (0.0001, "0.0001"),
            (0.0, "0"),
            (1e-300, "1e-300"),
            (-1e-300, "-1e-300"),
            (1.5e-7, "1.5e-7"),
            (123456789012345.0, "123456789012345"),
            (1e300, "1e300"),
        ] {
            assert_eq!(readable(s), text, "{s:e}");
        }
    }

    #[test]
    fn a_request_may_lower_a_limit_never_raise_it() {
        let configured = WireLimits {
            memory_bytes: Some(1 << 30),
            processes: None,
            ..WireLimits::default()
        };
        let asked = RunLimits {
            memory_bytes: Some(2 << 30),
            processes: Some(8),
            open_files: Some(64),
            ..RunLimits::default()
        };
        let run = narrow_limits(&configured, &asked).unwrap();
        assert_eq!(run.memory_bytes, Some(1 << 30));
        assert_eq!(run.processes, Some(8));
        assert_eq!(run.open_files, Some(64));
        let lower = RunLimits {
            memory_bytes: Some(1 << 20),
            ..RunLimits::default()
        };
        assert_eq!(
            narrow_limits(&configured, &lower).unwrap().memory_bytes,
            Some(1 << 20)
        );
        // Unset server-side, a request's own value is capped by a hard ceiling.
        let huge = RunLimits {
            processes: Some(1 << 40),
            ..RunLimits::default()
        };
        assert_eq!(
            narrow_limits(&configured, &huge).unwrap().processes,
            Some(MAX_PROCESSES)
        );
        let zero = RunLimits {
            cpu_seconds: Some(0),
            ..RunLimits::default()
        };
        let err = narrow_limits(&configured, &zero).unwrap_err().to_string();
        assert!(err.contains("limits.cpu_seconds must be positive"), "{err}");
    }

    #[test]
    fn a_timeout_is_positive_and_capped() {
        assert_eq!(run_timeout(None, 30.0, 300.0).unwrap(), 30.0);
        assert_eq!(run_timeout(Some(1000.0), 30.0, 300.0).unwrap(), 300.0);
        assert_eq!(run_timeout(Some(0.5), 30.0, 300.0).unwrap(), 0.5);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = run_timeout(Some(bad), 30.0, 300.0).unwrap_err().to_string();
            assert!(err.contains("positive number of seconds"), "{err}");
        }
    }
}
