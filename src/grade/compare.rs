//! How a case's output is compared with what was expected, and the one-line
//! diff summary a wrong answer carries.

use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use serde_json::value::RawValue;

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

    /// Numeric tolerance this mode applies: `None` outside `float`, where
    /// numbers are text like any other (`float:0` compares them by value).
    fn tolerance(self) -> Option<f64> {
        match self {
            Compare::Float(tol) => Some(tol),
            _ => None,
        }
    }

    /// `None` when `got` matches `expected`; otherwise a summary of the first
    /// difference. When nothing was printed it says so (`got no output`), in
    /// every mode: the line or token counts, a tolerance or an empty line
    /// quoted would say less.
    pub(crate) fn text(self, expected: &str, got: &str) -> Option<String> {
        let nothing = got.is_empty();
        match self {
            Compare::Exact => {
                if expected == got {
                    return None;
                }
                // Lines with their breaks: a missing last break is a
                // difference in the last line, and "2\n" is one line.
                let e: Vec<&str> = expected.split_inclusive('\n').collect();
                let g: Vec<&str> = got.split_inclusive('\n').collect();
                Some(line_diff(&e, &g, nothing).unwrap_or_else(|| {
                    "outputs differ only in line endings or invisible characters".into()
                }))
            }
            Compare::Trim => line_diff(&trimmed_lines(expected), &trimmed_lines(got), nothing),
            Compare::Tokens | Compare::Float(_) => {
                let e: Vec<&str> = expected.split_whitespace().collect();
                let g: Vec<&str> = got.split_whitespace().collect();
                token_diff(&e, &g, self.tolerance(), nothing)
            }
        }
    }

    /// `None` when the returned JSON value matches the expected one: equal
    /// structure, numbers equal by value (`1 == 1.0`; two integers exactly,
    /// whatever their size), floats within the tolerance.
    pub(crate) fn json(self, expected: &Json, got: &Json) -> Option<String> {
        json_diff("$", expected, got, self.tolerance())
    }
}

/// The diff of output that is not UTF-8 text, valid up to byte
/// `valid_up_to`: where its first undecodable byte is.
pub(crate) fn not_utf8(output: &[u8], valid_up_to: usize) -> String {
    let before = std::str::from_utf8(&output[..valid_up_to]).unwrap_or_default();
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .unwrap_or_default()
        .chars()
        .count()
        + 1;
    format!(
        "line {line}, column {column}: got the byte {:#04x}, which is not UTF-8 text",
        output[valid_up_to]
    )
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

/// Characters an excerpt shows after the first difference, at least.
const AFTER_CHARS: usize = 20;
/// Characters an excerpt shows before the first difference, when it does
/// not start at the beginning.
const BEFORE_CHARS: usize = 60;

/// Excerpts of two texts that differ, each quoted by `quote`, and the
/// character (from 0) where they first differ when an excerpt from their
/// start would not show it: the excerpts then start a little before it,
/// `...` marking each cut. `None` with the excerpts from the start.
fn excerpts(
    expected: &str,
    got: &str,
    quote: impl Fn(&str) -> String,
) -> (String, String, Option<usize>) {
    let at = expected
        .chars()
        .zip(got.chars())
        .take_while(|(e, g)| e == g)
        .count();
    let far = at + AFTER_CHARS > EXCERPT_CHARS;
    let start = if far {
        at.saturating_sub(BEFORE_CHARS)
    } else {
        0
    };
    let side = |text: &str| {
        let mut rest = text.chars().skip(start);
        let cut: String = rest.by_ref().take(EXCERPT_CHARS).collect();
        let lead = if start > 0 { "..." } else { "" };
        let trail = if rest.next().is_some() { "..." } else { "" };
        format!("{lead}{}{trail}", quote(&cut))
    };
    (side(expected), side(got), far.then_some(at))
}

/// Where a line or token first differs (`, column 301`) when its excerpts
/// start past its beginning.
fn at_char(word: &str, far: Option<usize>) -> String {
    far.map(|at| format!(", {word} {}", at + 1))
        .unwrap_or_default()
}

/// Excerpts of the line or token each side has at a difference (or "end
/// of output"), and where in it they first differ (see [`excerpts`]).
fn sides(expected: Option<&&str>, got: Option<&&str>) -> (String, String, Option<usize>) {
    let debug = |text: &str| format!("{text:?}");
    match (expected, got) {
        (Some(e), Some(g)) => excerpts(e, g, debug),
        (e, g) => {
            let side = |text: Option<&&str>| text.map_or("end of output".into(), |t| excerpt(t));
            (side(e), side(g), None)
        }
    }
}

/// The first line that differs; `nothing`: the output was empty. A line
/// may end with its break (exact mode), which is quoted only when it is
/// the difference: `line 2: expected "b\n", got "b"`.
fn line_diff(expected: &[&str], got: &[&str], nothing: bool) -> Option<String> {
    let first = (0..expected.len().max(got.len())).find(|&i| expected.get(i) != got.get(i))?;
    fn bare(line: Option<&str>) -> Option<&str> {
        line.map(|l| l.strip_suffix('\n').unwrap_or(l))
    }
    let (mut e, mut g) = (expected.get(first).copied(), got.get(first).copied());
    if bare(e) != bare(g) {
        (e, g) = (bare(e), bare(g));
    }
    if nothing {
        return Some(no_output("line", first, e.as_ref()));
    }
    let (e, g, far) = sides(e.as_ref(), g.as_ref());
    let mut summary = format!(
        "line {}{}: expected {e}, got {g}",
        first + 1,
        at_char("column", far)
    );
    if expected.len() != got.len() {
        summary.push_str(&format!(
            " ({} expected, {} got)",
            counted(expected.len(), "line"),
            got.len()
        ));
    }
    Some(summary)
}

/// `1 line`, `2 lines`.
fn counted(n: usize, unit: &str) -> String {
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

/// The diff of empty output, from the first `unit` (line, token) that
/// differs, at index `first`: `line 1: expected "42", got no output`.
fn no_output(unit: &str, first: usize, expected: Option<&&str>) -> String {
    let (e, _, _) = sides(expected, None);
    format!("{unit} {}: expected {e}, got no output", first + 1)
}

/// Two numbers are equal within the tolerance, absolutely or relatively to
/// the larger. An infinity equals only the same infinity (relatively to it,
/// any difference is within the tolerance), and NaN only NaN: a program
/// that prints `nan` where `nan` is expected is right, one that prints it
/// where a number is expected is not.
fn numbers_match(a: f64, b: f64, tol: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a == b {
        return true;
    }
    if a.is_infinite() || b.is_infinite() {
        return false;
    }
    let diff = (a - b).abs();
    diff <= tol || diff <= tol * a.abs().max(b.abs())
}

fn tokens_match(expected: &str, got: &str, tol: Option<f64>) -> bool {
    if expected == got {
        return true;
    }
    let Some(tol) = tol else {
        return false;
    };
    match (expected.parse::<f64>(), got.parse::<f64>()) {
        // A number past the largest double reads as an infinity; only its
        // text (unequal here) tells it from another, or from an infinity.
        (Ok(a), Ok(b)) if overflowed(expected, a) || overflowed(got, b) => false,
        // By value means exactly at a tolerance of 0: an integer is not the
        // double nearest it (`2**53 + 1` is no double).
        (Ok(_), Ok(_))
            if tol == 0.0
                && (decimal_integer(expected).is_some() || decimal_integer(got).is_some()) =>
        {
            let json = |token: &str| decimal_integer(token).unwrap_or_else(|| token.to_string());
            json_numbers_match(&json(expected), &json(got), Some(0.0))
        }
        (Ok(a), Ok(b)) => numbers_match(a, b, tol),
        _ => false,
    }
}

/// A token that is a decimal integer (`-12`, `+007`), as JSON writes it
/// (`-12`, `7`).
fn decimal_integer(token: &str) -> Option<String> {
    let (sign, digits) = match token.strip_prefix('-') {
        Some(digits) => ("-", digits),
        None => ("", token.strip_prefix('+').unwrap_or(token)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(match digits.trim_start_matches('0') {
        "" => "0".to_string(),
        digits => format!("{sign}{digits}"),
    })
}

/// `token`, read as `value`, is a finite number too large for a double
/// (`1e400`), not a spelt infinity (`inf`, `-Infinity`).
fn overflowed(token: &str, value: f64) -> bool {
    let word = token.trim_start_matches(['+', '-']);
    value.is_infinite()
        && !word.eq_ignore_ascii_case("inf")
        && !word.eq_ignore_ascii_case("infinity")
}

/// The first token that differs; `nothing`: the output was empty.
fn token_diff(expected: &[&str], got: &[&str], tol: Option<f64>, nothing: bool) -> Option<String> {
    let first =
        (0..expected.len().max(got.len())).find(|&i| match (expected.get(i), got.get(i)) {
            (Some(e), Some(g)) => !tokens_match(e, g, tol),
            _ => true,
        })?;
    if nothing {
        return Some(no_output("token", first, expected.get(first)));
    }
    let (e, g, far) = sides(expected.get(first), got.get(first));
    let mut summary = format!(
        "token {}{}: expected {e}, got {g}",
        first + 1,
        at_char("character", far)
    );
    // At a tolerance of 0 numbers must be equal, which says itself.
    if let Some(tol) = tol.filter(|&tol| tol > 0.0) {
        summary.push_str(&format!(" (tolerance {})", crate::limits::readable(tol)));
    }
    if expected.len() != got.len() {
        summary.push_str(&format!(
            " ({} expected, {} got)",
            counted(expected.len(), "token"),
            got.len()
        ));
    }
    Some(summary)
}

/// A JSON value whose numbers keep their text, compared as the grading
/// modes say (`Value`'s equality compares two numbers' text as written,
/// `1.0` unlike `1`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    /// The number as written (JSON's grammar: no `+`, no leading zeros).
    Number(String),
    String(String),
    Array(Vec<Json>),
    /// Members in their order; a repeated key keeps its last value.
    Object(Vec<(String, Json)>),
}

/// Deepest nesting of arrays and objects [`Json::parse`] takes: serde_json's
/// own limit for a `Value`. Each level is parsed on its own (and its text
/// read again), so the limit also bounds the recursion of the parse, of
/// the comparison and of the drop, and the parse's cost to this many times
/// the text's length.
pub(crate) const MAX_JSON_DEPTH: usize = 128;

impl Json {
    /// Parse one JSON value. Each container's members are taken as raw text
    /// and parsed in turn, so serde_json checks the grammar while no number
    /// passes through a float; nesting past [`MAX_JSON_DEPTH`] is refused.
    pub(crate) fn parse(text: &str) -> Result<Json, serde_json::Error> {
        Json::parse_within(text, MAX_JSON_DEPTH)
    }

    /// [`Json::parse`] with `levels` more arrays or objects allowed.
    fn parse_within(text: &str, levels: usize) -> Result<Json, serde_json::Error> {
        let text = text.trim_ascii();
        if matches!(text.as_bytes().first(), Some(b'[' | b'{')) && levels == 0 {
            return Err(<serde_json::Error as serde::de::Error>::custom(format!(
                "nested deeper than {MAX_JSON_DEPTH} arrays or objects"
            )));
        }
        let levels = levels.saturating_sub(1);
        Ok(match text.as_bytes().first() {
            Some(b'[') => Json::Array(
                serde_json::from_str::<Vec<&RawValue>>(text)?
                    .into_iter()
                    .map(|item| Json::parse_within(item.get(), levels))
                    .collect::<Result<_, _>>()?,
            ),
            Some(b'{') => {
                let members = serde_json::from_str::<Members>(text)?.0;
                let mut object: Vec<(String, Json)> = Vec::with_capacity(members.len());
                let mut at = HashMap::with_capacity(members.len());
                for (key, raw) in members {
                    let value = Json::parse_within(raw.get(), levels)?;
                    match at.get(&key) {
                        Some(&i) => object[i] = (key, value),
                        None => {
                            at.insert(key.clone(), object.len());
                            object.push((key, value));
                        }
                    }
                }
                Json::Object(object)
            }
            Some(b'"') => Json::String(serde_json::from_str(text)?),
            Some(b'-' | b'0'..=b'9') => {
                // Checks the grammar; the value stays text.
                serde_json::from_str::<&RawValue>(text)?;
                Json::Number(text.to_string())
            }
            _ => match serde_json::from_str::<Option<bool>>(text)? {
                None => Json::Null,
                Some(b) => Json::Bool(b),
            },
        })
    }

    /// Compact JSON text, cut once it is over `max` characters (`...`
    /// marks the cut).
    fn excerpt(&self, max: usize) -> String {
        let mut out = String::new();
        self.write(&mut out, max);
        if out.chars().count() > max {
            let cut: String = out.chars().take(max).collect();
            return format!("{cut}...");
        }
        out
    }

    /// Compact JSON text of the whole value.
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, usize::MAX);
        out
    }

    /// Append the compact text, stopping once `out` is over `max` bytes.
    fn write(&self, out: &mut String, max: usize) {
        if out.len() > max {
            return;
        }
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(n),
            Json::String(s) => out.push_str(&quoted(s)),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out, max);
                }
                out.push(']');
            }
            Json::Object(members) => {
                out.push('{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&quoted(key));
                    out.push(':');
                    value.write(out, max);
                }
                out.push('}');
            }
        }
    }
}

/// `text` as a JSON string.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("a string is JSON")
}

/// An object's members in their order, values as raw text.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Members<'a>, M::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'a RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// A JSON number's text is an integer (no fraction, no exponent).
fn is_integer(number: &str) -> bool {
    !number.contains(['.', 'e', 'E'])
}

/// An integer's text with `-0` as `0`.
fn integer_text(number: &str) -> &str {
    if number == "-0" { "0" } else { number }
}

/// Two JSON numbers are equal: two integers exactly, whatever their size
/// and in every mode; an integer and a float in exact modes and at a
/// tolerance of 0 only when the float is that very integer (`1 == 1.0`, but
/// `2**53 + 1 != 2.0**53`); otherwise as floats, within the tolerance.
fn json_numbers_match(a: &str, b: &str, tol: Option<f64>) -> bool {
    let exact = tol.is_none_or(|tol| tol == 0.0);
    let float = |text: &str| text.parse::<f64>().unwrap_or(f64::NAN);
    let is_the_integer = |int: &str, float: f64| {
        float.is_finite()
            && float.fract() == 0.0
            && integer_text(&format!("{float:.0}")) == integer_text(int)
    };
    match (is_integer(a), is_integer(b)) {
        (true, true) => integer_text(a) == integer_text(b),
        (true, false) if exact => is_the_integer(a, float(b)),
        (false, true) if exact => is_the_integer(b, float(a)),
        _ => {
            let (x, y) = (float(a), float(b));
            // JSON has no infinities: a number that reads as one overflowed
            // a double, and only its text tells it from another.
            if x.is_infinite() || y.is_infinite() {
                return a == b;
            }
            numbers_match(x, y, tol.unwrap_or(0.0))
        }
    }
}

fn json_diff(path: &str, expected: &Json, got: &Json, tol: Option<f64>) -> Option<String> {
    let differ = || {
        // A long string or number is quoted around its first difference.
        let far = match (expected, got) {
            (Json::String(e), Json::String(g)) => Some(excerpts(e, g, quoted)),
            (Json::Number(e), Json::Number(g)) => Some(excerpts(e, g, str::to_string)),
            _ => None,
        };
        Some(match far {
            Some((e, g, far @ Some(_))) => {
                format!(
                    "at {path}{}: expected {e}, got {g}",
                    at_char("character", far)
                )
            }
            _ => format!(
                "at {path}: expected {}, got {}",
                expected.excerpt(EXCERPT_CHARS),
                got.excerpt(EXCERPT_CHARS)
            ),
        })
    };
    match (expected, got) {
        (Json::Number(a), Json::Number(b)) => {
            if json_numbers_match(a, b, tol) {
                None
            } else {
                differ()
            }
        }
        (Json::Array(a), Json::Array(b)) => {
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
        (Json::Object(a), Json::Object(b)) => {
            let got: HashMap<&str, &Json> = b.iter().map(|(k, v)| (k.as_str(), v)).collect();
            for (key, x) in a {
                let Some(y) = got.get(key.as_str()) else {
                    return Some(format!("at {path}: key {key:?} is missing"));
                };
                if let Some(d) = json_diff(&format!("{path}.{key}"), x, y, tol) {
                    return Some(d);
                }
            }
            let wanted: HashSet<&str> = a.iter().map(|(k, _)| k.as_str()).collect();
            if let Some((extra, _)) = b.iter().find(|(k, _)| !wanted.contains(k.as_str())) {
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

    #[test]
    fn json_numbers_past_a_double_compare_as_written() {
        assert!(json_numbers_match("1e400", "1e400", Some(1e-6)));
        assert!(!json_numbers_match("1e400", "1e401", Some(1e-6)));
        assert!(!json_numbers_match("-1e400", "1e400", None));
        assert!(!json_numbers_match(
            &format!("1{}", "0".repeat(400)),
            "1e401",
            Some(1e-6)
        ));
        assert!(json_numbers_match("1.0000001", "1.0", Some(1e-6)));
    }

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
    fn empty_output_is_no_output_in_every_mode() {
        for mode in [
            Compare::Exact,
            Compare::Trim,
            Compare::Tokens,
            Compare::Float(1e-6),
        ] {
            let unit = if matches!(mode, Compare::Exact | Compare::Trim) {
                "line"
            } else {
                "token"
            };
            assert_eq!(
                mode.text("42\n", "").unwrap(),
                format!("{unit} 1: expected \"42\", got no output"),
                "{mode:?}"
            );
        }
        // Exact mode's first line may be empty.
        assert_eq!(
            Compare::Exact.text("\n42\n", "").unwrap(),
            "line 1: expected \"\", got no output"
        );
        // Output of whitespace alone is output: its end is where it differs.
        assert_eq!(
            Compare::Tokens.text("42", "\n").unwrap(),
            "token 1: expected \"42\", got end of output (1 token expected, 0 got)"
        );
    }

    #[test]
    fn exact_lines_end_with_their_breaks() {
        // A missing last break is the last line's difference, quoted.
        assert_eq!(
            Compare::Exact.text("a\nb\n", "a\nb").unwrap(),
            "line 2: expected \"b\\n\", got \"b\""
        );
        assert_eq!(
            Compare::Exact.text("42", "42\n").unwrap(),
            "line 1: expected \"42\", got \"42\\n\""
        );
        // A break ends a line: "a\n" is one line, and one more is counted
        // as one.
        assert_eq!(
            Compare::Exact.text("a\n", "a\nb\n").unwrap(),
            "line 2: expected end of output, got \"b\" (1 line expected, 2 got)"
        );
        assert_eq!(
            Compare::Exact.text("a\nb\nc\n", "a\nx\nc\n").unwrap(),
            "line 2: expected \"b\", got \"x\""
        );
        // A carriage return is part of its line's text.
        assert_eq!(
            Compare::Exact.text("a\n", "a\r\n").unwrap(),
            "line 1: expected \"a\", got \"a\\r\""
        );
    }

    #[test]
    fn a_far_difference_is_quoted_around_it() {
        let (a, tail) = ("x".repeat(200), "x".repeat(60));
        assert_eq!(
            Compare::Exact
                .text(&format!("{a}1{a}\n"), &format!("{a}2{a}\n"))
                .unwrap(),
            format!(
                "line 1, column 201: expected ...\"{tail}1{}\"..., got ...\"{tail}2{}\"...",
                &a[..59],
                &a[..59]
            )
        );
        // One side ending where the other goes on.
        assert_eq!(
            Compare::Tokens.text(&a, &format!("{a}y")).unwrap(),
            format!("token 1, character 201: expected ...\"{tail}\", got ...\"{tail}y\"")
        );
        // Near the start, the excerpts start at the start.
        let near = Compare::Trim
            .text(&format!("{a}1"), &format!("2{a}"))
            .unwrap();
        assert!(near.starts_with("line 1: expected \"xxx"), "{near}");
        let n = |d: char| format!("{}{d}", "9".repeat(150));
        assert_eq!(
            json(Compare::Exact, &n('1'), &n('2')).unwrap(),
            format!(
                "at $, character 151: expected ...{}1, got ...{}2",
                &n('0')[..60],
                &n('0')[..60]
            )
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
        // float:0 compares numbers by value, exactly.
        assert_eq!(Compare::Float(0.0).text("1 1000 0.5", "1.0 1e3 0.50"), None);
        assert!(Compare::Float(0.0).text("1", "1.0000001").is_some());
        assert_eq!(Compare::Float(0.0).text("+007 -0 5", "7 0 5.0"), None);
        for (a, b) in [
            ("9007199254740993", "9007199254740992.0"),
            ("9007199254740993", "9007199254740992"),
        ] {
            assert!(json(Compare::Float(0.0), a, b).is_some(), "{a} {b}");
            assert!(Compare::Float(0.0).text(a, b).is_some(), "{a} {b}");
        }
        assert_eq!(
            json(
                Compare::Float(0.0),
                "9007199254740992",
                "9007199254740992.0"
            ),
            None
        );
    }

    #[test]
    fn a_diff_names_a_tolerance_as_written_and_none_of_0() {
        for (tol, said) in [
            (1e-6, " (tolerance 1e-6)"),
            (0.5, " (tolerance 0.5)"),
            (0.0, ""),
        ] {
            assert_eq!(
                Compare::Float(tol).text("2", "30").unwrap(),
                format!("token 1: expected \"2\", got \"30\"{said}")
            );
        }
    }

    /// The diff of two JSON texts under `mode`.
    fn json(mode: Compare, expected: &str, got: &str) -> Option<String> {
        mode.json(&Json::parse(expected).unwrap(), &Json::parse(got).unwrap())
    }

    #[test]
    fn infinities_equal_only_themselves_and_nan_only_nan() {
        let float = Compare::Float(1e-6);
        assert_eq!(float.text("inf -inf nan", "Infinity -inf NaN"), None);
        for (expected, got) in [
            ("inf", "5"),
            ("inf", "-inf"),
            ("0", "inf"),
            ("1e308", "inf"),
            ("nan", "0"),
            ("0", "nan"),
            ("nan", "inf"),
            ("1e308", "-1e308"),
        ] {
            let diff = float.text(expected, got);
            assert!(diff.is_some(), "{expected} vs {got}");
        }
        // Finite numbers at the edge of the range still compare relatively.
        assert_eq!(float.text("1.7e308", "1.7000001e308"), None);
        // Past it, a number equals only itself as written.
        assert_eq!(float.text("1e400 -1e999", "1e400 -1e999"), None);
        for (expected, got) in [("1e400", "1e500"), ("inf", "1e400"), ("-1e400", "-inf")] {
            assert!(float.text(expected, got).is_some(), "{expected} vs {got}");
        }
    }

    #[test]
    fn json_values_compare_structurally() {
        let exact = Compare::Exact;
        assert_eq!(json(exact, "[1, 2]", "[1.0, 2]"), None);
        assert_eq!(
            json(exact, r#"{"a": [1, 2]}"#, r#"{"a": [1, 3]}"#).unwrap(),
            "at $.a[1]: expected 2, got 3"
        );
        assert!(json(exact, "0.1", "0.1000001").is_some());
        assert_eq!(json(Compare::Float(1e-6), "0.1", "0.1000001"), None);
        assert!(json(exact, "[1]", "[1, 2]").unwrap().contains("1 items"));
        assert!(json(exact, r#""1""#, "1").is_some());
        assert!(
            json(exact, r#"{"a": 1}"#, "{}")
                .unwrap()
                .contains("missing")
        );
        assert_eq!(
            json(exact, r#"{"a": 1}"#, r#"{"a": 1, "b": [true, null]}"#).unwrap(),
            "at $: unexpected key \"b\""
        );
        // Values in a diff are shown compactly, whatever their spacing.
        assert_eq!(
            json(exact, "[[1,  \"x\"]]", r#"[{"k": false}]"#).unwrap(),
            r#"at $[0]: expected [1,"x"], got {"k":false}"#
        );
    }

    #[test]
    fn integers_compare_exactly_whatever_their_size() {
        let big = "100000000000000000000"; // 10**20, over u64
        for mode in [Compare::Exact, Compare::Float(1e-6)] {
            assert_eq!(json(mode, big, big), None);
            assert_eq!(
                json(mode, big, "100000000000000000001").unwrap(),
                "at $: expected 100000000000000000000, got 100000000000000000001"
            );
            assert_eq!(json(mode, "-0", "0"), None);
        }
        let huge = format!("1{}", "0".repeat(400));
        assert_eq!(json(Compare::Exact, &huge, &huge), None);
        assert!(json(Compare::Exact, &huge, &format!("{huge}1")).is_some());
        assert!(json(Compare::Float(1e-6), &huge, "1e308").is_some());
        // An integer equals a float that is that integer, and only exactly
        // outside float mode: 2**53 + 1 is no double.
        assert_eq!(json(Compare::Exact, big, "1e20"), None);
        assert!(json(Compare::Exact, "9007199254740993", "9007199254740992.0").is_some());
        assert_eq!(
            json(Compare::Exact, "9007199254740992", "9007199254740992.0"),
            None
        );
        assert_eq!(
            json(
                Compare::Float(1e-6),
                "9007199254740993",
                "9007199254740992.0"
            ),
            None
        );
        assert!(json(Compare::Exact, "3", "3.5").is_some());
    }

    #[test]
    fn parsed_json_keeps_numbers_and_member_order() {
        let value = Json::parse(r#" {"b": [1e400, -0, 123456789012345678901234567890], "a": "\u00e9", "b": {"x": null}} "#)
            .unwrap();
        assert_eq!(value.to_text(), r#"{"b":{"x":null},"a":"é"}"#);
        let value = Json::parse("[1e400, -0, 123456789012345678901234567890, true]").unwrap();
        assert_eq!(
            value.to_text(),
            "[1e400,-0,123456789012345678901234567890,true]"
        );
        for bad in ["[1,]", "01", "{\"a\" 1}", "nul", "1 2", ""] {
            assert!(Json::parse(bad).is_err(), "{bad:?}");
        }
        // As deep as serde_json's own limit, and no deeper (a nesting of
        // 100,000 would overflow the stack of a parse without one).
        let nested = |depth: usize| "[".repeat(depth) + &"]".repeat(depth);
        assert!(Json::parse(&nested(MAX_JSON_DEPTH)).is_ok());
        let objects = "{\"a\":".repeat(MAX_JSON_DEPTH) + "1" + &"}".repeat(MAX_JSON_DEPTH);
        assert!(Json::parse(&objects).is_ok());
        for deep in [nested(MAX_JSON_DEPTH + 1), nested(100_000)] {
            let err = Json::parse(&deep).unwrap_err().to_string();
            assert!(err.contains("nested deeper than 128"), "{err}");
        }
    }
}
