//! How a case's output is compared with what was expected, and the one-line
//! diff summary a wrong answer carries.

use serde_json::Value;

/// Tolerance of `"float"` without a number.
const DEFAULT_TOLERANCE: f64 = 1e-6;

/// Longest excerpt of a line or token quoted in a diff summary.
const EXCERPT_CHARS: usize = 120;

/// A comparison mode (`compare` of a grading request).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Compare {
    /// Byte-for-byte equal output.
    Exact,
    /// Equal after dropping trailing whitespace of each line and trailing
    /// blank lines.
    Trim,
    /// Equal sequences of whitespace-separated tokens.
    Tokens,
    /// Tokens, where two numeric tokens are equal when they differ by at most
    /// the tolerance, absolutely or relatively to the larger one.
    Float(f64),
}

impl Compare {
    /// Parse `exact`, `trim`, `tokens`, `float` or `float:<tolerance>`.
    pub(crate) fn parse(text: &str) -> Result<Compare, String> {
        match text {
            "exact" => Ok(Compare::Exact),
            "trim" => Ok(Compare::Trim),
            "tokens" => Ok(Compare::Tokens),
            "float" => Ok(Compare::Float(DEFAULT_TOLERANCE)),
            other => match other.strip_prefix("float:").map(str::parse::<f64>) {
                Some(Ok(tol)) if tol.is_finite() && tol >= 0.0 => Ok(Compare::Float(tol)),
                Some(_) => Err(format!(
                    "compare {other:?}: the tolerance must be a non-negative number, as in \"float:1e-6\""
                )),
                None => Err(format!(
                    "compare {other:?} is not one of \"exact\", \"trim\", \"tokens\", \"float:<tolerance>\""
                )),
            },
        }
    }

    /// Numeric tolerance this mode applies (0 outside `float`).
    fn tolerance(self) -> f64 {
        match self {
            Compare::Float(tol) => tol,
            _ => 0.0,
        }
    }

    /// `None` when `got` matches `expected`; otherwise a summary of the first
    /// difference.
    pub(crate) fn text(self, expected: &str, got: &str) -> Option<String> {
        match self {
            Compare::Exact => {
                if expected == got {
                    return None;
                }
                let e: Vec<&str> = expected.split('\n').collect();
                let g: Vec<&str> = got.split('\n').collect();
                Some(line_diff(&e, &g).unwrap_or_else(|| {
                    "outputs differ only in line endings or invisible characters".into()
                }))
            }
            Compare::Trim => line_diff(&trimmed_lines(expected), &trimmed_lines(got)),
            Compare::Tokens | Compare::Float(_) => {
                let e: Vec<&str> = expected.split_whitespace().collect();
                let g: Vec<&str> = got.split_whitespace().collect();
                token_diff(&e, &g, self.tolerance())
            }
        }
    }

    /// `None` when the returned JSON value matches the expected one: equal
    /// structure, numbers equal within the tolerance (`1 == 1.0`).
    pub(crate) fn json(self, expected: &Value, got: &Value) -> Option<String> {
        json_diff("$", expected, got, self.tolerance())
    }
}

fn trimmed_lines(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.split('\n').map(str::trim_end).collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

fn excerpt(text: &str) -> String {
    if text.chars().count() <= EXCERPT_CHARS {
        return format!("{text:?}");
    }
    let cut: String = text.chars().take(EXCERPT_CHARS).collect();
    format!("{cut:?}...")
}

fn line_diff(expected: &[&str], got: &[&str]) -> Option<String> {
    let first = (0..expected.len().max(got.len())).find(|&i| expected.get(i) != got.get(i))?;
    let side = |lines: &[&str]| match lines.get(first) {
        Some(line) => excerpt(line),
        None => "end of output".into(),
    };
    let mut summary = format!(
        "line {}: expected {}, got {}",
        first + 1,
        side(expected),
        side(got)
    );
    if expected.len() != got.len() {
        summary.push_str(&format!(
            " ({} lines expected, {} got)",
            expected.len(),
            got.len()
        ));
    }
    Some(summary)
}

fn numbers_match(a: f64, b: f64, tol: f64) -> bool {
    if a == b {
        return true;
    }
    let diff = (a - b).abs();
    diff <= tol || diff <= tol * a.abs().max(b.abs())
}

fn tokens_match(expected: &str, got: &str, tol: f64) -> bool {
    if expected == got {
        return true;
    }
    if tol == 0.0 {
        return false;
    }
    match (expected.parse::<f64>(), got.parse::<f64>()) {
        (Ok(a), Ok(b)) => numbers_match(a, b, tol),
        _ => false,
    }
}

fn token_diff(expected: &[&str], got: &[&str], tol: f64) -> Option<String> {
    let first =
        (0..expected.len().max(got.len())).find(|&i| match (expected.get(i), got.get(i)) {
            (Some(e), Some(g)) => !tokens_match(e, g, tol),
            _ => true,
        })?;
    let side = |tokens: &[&str]| match tokens.get(first) {
        Some(token) => excerpt(token),
        None => "end of output".into(),
    };
    let mut summary = format!(
        "token {}: expected {}, got {}",
        first + 1,
        side(expected),
        side(got)
    );
    if tol > 0.0 {
        summary.push_str(&format!(" (tolerance {tol:e})"));
    }
    if expected.len() != got.len() {
        summary.push_str(&format!(
            " ({} tokens expected, {} got)",
            expected.len(),
            got.len()
        ));
    }
    Some(summary)
}

fn short_json(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= EXCERPT_CHARS {
        return text;
    }
    let cut: String = text.chars().take(EXCERPT_CHARS).collect();
    format!("{cut}...")
}

fn json_diff(path: &str, expected: &Value, got: &Value, tol: f64) -> Option<String> {
    let differ = || {
        Some(format!(
            "at {path}: expected {}, got {}",
            short_json(expected),
            short_json(got)
        ))
    };
    match (expected, got) {
        (Value::Number(a), Value::Number(b)) => {
            let equal = match (a.as_i64(), b.as_i64(), a.as_u64(), b.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => match (a.as_f64(), b.as_f64()) {
                    (Some(x), Some(y)) => numbers_match(x, y, tol),
                    _ => false,
                },
            };
            if equal { None } else { differ() }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                if let Some(d) = json_diff(&format!("{path}[{i}]"), x, y, tol) {
                    return Some(d);
                }
            }
            if a.len() != b.len() {
                return Some(format!(
                    "at {path}: expected {} items, got {}",
                    a.len(),
                    b.len()
                ));
            }
            None
        }
        (Value::Object(a), Value::Object(b)) => {
            for (key, x) in a {
                let Some(y) = b.get(key) else {
                    return Some(format!("at {path}: key {key:?} is missing"));
                };
                if let Some(d) = json_diff(&format!("{path}.{key}"), x, y, tol) {
                    return Some(d);
                }
            }
            if let Some(extra) = b.keys().find(|k| !a.contains_key(*k)) {
                return Some(format!("at {path}: unexpected key {extra:?}"));
            }
            None
        }
        _ if expected == got => None,
        _ => differ(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn modes_parse_and_bad_ones_are_named() {
        assert_eq!(Compare::parse("exact"), Ok(Compare::Exact));
        assert_eq!(Compare::parse("float:1e-3"), Ok(Compare::Float(1e-3)));
        assert_eq!(Compare::parse("float"), Ok(Compare::Float(1e-6)));
        assert!(
            Compare::parse("float:-1")
                .unwrap_err()
                .contains("tolerance")
        );
        assert!(Compare::parse("fuzzy").unwrap_err().contains("\"fuzzy\""));
    }

    #[test]
    fn exact_trim_and_tokens_differ_in_whitespace() {
        let (expected, got) = ("1 2\n3\n", "1 2  \n3\n\n");
        assert!(Compare::Exact.text(expected, got).is_some());
        assert_eq!(Compare::Trim.text(expected, got), None);
        assert!(Compare::Trim.text("1 2\n3\n", "1  2\n3\n").is_some());
        assert_eq!(Compare::Tokens.text("1 2\n3\n", "1  2 3"), None);
        assert!(Compare::Tokens.text("1 2 3", "1 2").is_some());
    }

    #[test]
    fn diffs_name_the_first_difference() {
        assert_eq!(
            Compare::Exact.text("a\nb\n", "a\nc\n").unwrap(),
            "line 2: expected \"b\", got \"c\""
        );
        assert_eq!(
            Compare::Trim.text("a\nb\n", "a\n").unwrap(),
            "line 2: expected \"b\", got end of output (2 lines expected, 1 got)"
        );
        assert_eq!(
            Compare::Tokens.text("1 2 3", "1 5 3").unwrap(),
            "token 2: expected \"2\", got \"5\""
        );
    }

    #[test]
    fn floats_match_within_tolerance() {
        let float = Compare::Float(1e-6);
        assert_eq!(float.text("0.3333333", "0.33333331"), None);
        assert_eq!(float.text("1e9", "1000000000.5"), None);
        assert!(float.text("0.5", "0.5001").is_some());
        assert!(float.text("abc", "abd").is_some());
        assert!(Compare::Tokens.text("0.5", "0.50").is_some());
    }

    #[test]
    fn json_values_compare_structurally() {
        let exact = Compare::Exact;
        assert_eq!(exact.json(&json!([1, 2]), &json!([1.0, 2])), None);
        assert_eq!(
            exact
                .json(&json!({"a": [1, 2]}), &json!({"a": [1, 3]}))
                .unwrap(),
            "at $.a[1]: expected 2, got 3"
        );
        assert!(exact.json(&json!(0.1), &json!(0.1000001)).is_some());
        assert_eq!(
            Compare::Float(1e-6).json(&json!(0.1), &json!(0.1000001)),
            None
        );
        assert!(
            exact
                .json(&json!([1]), &json!([1, 2]))
                .unwrap()
                .contains("1 items")
        );
        assert!(exact.json(&json!("1"), &json!(1)).is_some());
        assert!(
            exact
                .json(&json!({"a": 1}), &json!({}))
                .unwrap()
                .contains("missing")
        );
    }
}
