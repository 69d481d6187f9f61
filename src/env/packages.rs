//! Packages of an environment: listing installed distributions without a
//! shell, and checking install specs before any of them reaches `pip` or
//! `conda` as an argv item.

use std::collections::BTreeMap;
use std::path::Path;

/// Run with `<python> -I -c`: prints `[[name, version], ...]` of every
/// installed distribution (`importlib.metadata`, CPython 3.8+).
pub(crate) const LIST_SCRIPT: &str = r#"import json, sys
from importlib import metadata
seen = {}
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    if name and name.lower() not in seen:
        seen[name.lower()] = [name, dist.version]
json.dump(sorted(seen.values(), key=lambda p: p[0].lower()), sys.stdout)
"#;

/// Conda packages recorded in `conda-meta/*.json` (name -> version).
pub(crate) fn conda_packages(prefix: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(prefix.join("conda-meta")) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Ok(record) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        if let (Some(name), Some(version)) = (record["name"].as_str(), record["version"].as_str()) {
            out.insert(name.to_string(), version.to_string());
        }
    }
    out
}

/// Check a pip requirement (PEP 508: `name[extras] specifiers ; marker` or
/// `name @ url`). Options (`-r`, `--index-url`, ...) and anything else are
/// refused with the reason.
pub(crate) fn check_pip_spec(spec: &str) -> Result<(), String> {
    let (req, marker) = match spec.split_once(';') {
        Some((req, marker)) => (req, Some(marker)),
        None => (spec, None),
    };
    if let Some(marker) = marker {
        check_marker(marker)?;
    }
    let req = req.trim();
    let name_end = req
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        .unwrap_or(req.len());
    check_name(&req[..name_end])?;
    let mut rest = req[name_end..].trim_start();
    if let Some(after) = rest.strip_prefix('[') {
        let Some((extras, tail)) = after.split_once(']') else {
            return Err("has an unclosed extras list".into());
        };
        for extra in extras.split(',') {
            check_name(extra.trim()).map_err(|e| format!("extra {e}"))?;
        }
        rest = tail.trim_start();
    }
    if let Some(url) = rest.strip_prefix('@') {
        let url = url.trim();
        let scheme_ok = ["https://", "http://", "file://", "git+"]
            .iter()
            .any(|s| url.starts_with(s));
        if !scheme_ok || url.chars().any(char::is_whitespace) {
            return Err("has a direct reference that is not a URL".into());
        }
        return Ok(());
    }
    let specifiers = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or(rest);
    if specifiers.trim().is_empty() {
        return Ok(());
    }
    for clause in specifiers.split(',') {
        let clause = clause.trim();
        let op_len = ["===", "~=", "==", "!=", "<=", ">=", "<", ">"]
            .iter()
            .find(|op| clause.starts_with(**op))
            .map(|op| op.len())
            .ok_or_else(|| format!("has a version clause {clause:?} without an operator"))?;
        let version = clause[op_len..].trim();
        let ok = !version.is_empty()
            && version.chars().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, '.' | '*' | '+' | '!' | '-' | '_')
            });
        if !ok {
            return Err(format!("has an invalid version in {clause:?}"));
        }
    }
    Ok(())
}

/// Variables an environment marker may test (PEP 508).
const MARKER_VARS: &[&str] = &[
    "python_version",
    "python_full_version",
    "os_name",
    "sys_platform",
    "platform_release",
    "platform_system",
    "platform_version",
    "platform_machine",
    "platform_python_implementation",
    "implementation_name",
    "implementation_version",
    "extra",
];

/// An environment marker: marker variables, quoted strings, comparison
/// operators, `and`/`or`/`in`/`not` and parentheses; nothing else.
fn check_marker(marker: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("has an invalid environment marker: {why}"));
    let mut chars = marker.chars().peekable();
    let mut comparisons = 0;
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() || c == '(' || c == ')' {
            chars.next();
        } else if c == '\'' || c == '"' {
            chars.next();
            if !chars.by_ref().any(|d| d == c) {
                return bad("unclosed string");
            }
        } else if "<>=!~".contains(c) {
            while chars.peek().is_some_and(|d| "<>=!~".contains(*d)) {
                chars.next();
            }
            comparisons += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut word = String::new();
            while let Some(&d) = chars.peek() {
                if d.is_ascii_alphanumeric() || d == '_' || d == '.' {
                    word.push(d);
                    chars.next();
                } else {
                    break;
                }
            }
            match word.as_str() {
                "in" => comparisons += 1,
                "and" | "or" | "not" => {}
                w if MARKER_VARS.contains(&w) => {}
                w => return bad(&format!("{w:?} is not a marker variable")),
            }
        } else {
            return bad(&format!("unexpected {c:?}"));
        }
    }
    if comparisons == 0 {
        return bad("no comparison");
    }
    Ok(())
}

/// Check a Conda match spec: `[channel::]name[ op version[=build]]`, e.g.
/// `numpy`, `numpy=1.26`, `numpy>=1.24,<2`, `conda-forge::numpy==1.26.4=py311*`.
pub(crate) fn check_conda_spec(spec: &str) -> Result<(), String> {
    let spec = spec.trim();
    let (channel, rest) = match spec.split_once("::") {
        Some((channel, rest)) => (Some(channel), rest),
        None => (None, spec),
    };
    if let Some(channel) = channel {
        check_name(channel).map_err(|e| format!("channel {e}"))?;
    }
    let name_end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        .unwrap_or(rest.len());
    check_name(&rest[..name_end])?;
    let constraint = rest[name_end..].trim();
    let ok = constraint.chars().all(|c| {
        c.is_ascii_alphanumeric()
            || matches!(
                c,
                '.' | '*' | '+' | '_' | '=' | '<' | '>' | '!' | ',' | '|' | '~' | ' '
            )
    });
    if !ok
        || (!constraint.is_empty()
            && !constraint.starts_with(['=', '<', '>', '!', '~', '.'])
            && !constraint.starts_with(|c: char| c.is_ascii_digit()))
    {
        return Err(format!("has an invalid version constraint {constraint:?}"));
    }
    Ok(())
}

/// A distribution name: letters, digits, `.`, `_`, `-`; starts and ends with
/// a letter or digit (so never looks like an option).
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!("name {name:?} is not a valid package name"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_specs() {
        for good in [
            "requests",
            "requests==2.31.0",
            "numpy>=1.24,<2",
            "pandas[excel, performance] ~= 2.1",
            "tiny_pkg @ file:///tmp/x/tiny_pkg-1.0-py3-none-any.whl",
            "foo (>=1.0)",
            "bar==1.0; python_version >= '3.8'",
            "baz; sys_platform == \"linux\" and (python_version < '3.12' or extra == 'x')",
            "echo",
        ] {
            assert!(
                check_pip_spec(good).is_ok(),
                "{good:?}: {:?}",
                check_pip_spec(good)
            );
        }
        for bad in [
            "",
            "--version;",
            "-r",
            "--index-url=http://evil",
            "-e.",
            "foo; ",
            "numpy; rm -rf /",
            "numpy; python_version >= '3' ; x",
            "numpy; python_version",
            "foo==",
            "foo==1.0 && rm -rf /",
            "foo bar",
            "$(id)",
            "foo @ /etc/passwd",
            "./local/dir",
            "foo[",
        ] {
            assert!(check_pip_spec(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn conda_specs() {
        for good in [
            "numpy",
            "numpy=1.26",
            "numpy>=1.24,<2",
            "conda-forge::numpy==1.26.4=py311*",
            "python 3.11.*",
        ] {
            assert!(
                check_conda_spec(good).is_ok(),
                "{good:?}: {:?}",
                check_conda_spec(good)
            );
        }
        for bad in [
            "",
            "--force",
            "-c",
            "numpy;rm",
            "::numpy",
            "numpy $(id)",
            "numpy`id`",
        ] {
            assert!(check_conda_spec(bad).is_err(), "{bad:?} accepted");
        }
    }
}
