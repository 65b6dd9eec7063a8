//! The Prometheus text exposition format, version 0.0.4: a writer, and a strict parser that
//! tests use to check what the writer (and the servers) produce.
//!
//! A scrape is rendered on demand: the server gathers its figures and writes each metric
//! family once, `# HELP` and `# TYPE` first, then its samples. Label values are escaped
//! (backslash, double quote, line feed), and so is help text (backslash, line feed).
//! Histograms are written as cumulative `_bucket` samples with an `le` label, the `+Inf` bucket
//! last and equal to `_count`, then `_sum` (in seconds) and `_count`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::histogram::{HistogramSnapshot, LATENCY_BUCKET_BOUNDS_SECONDS};

/// The `Content-Type` of a scrape's response.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The type of a metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    /// Only goes up (restarts at zero when the process does).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations counted in cumulative buckets, with their sum and count.
    Histogram,
}

impl MetricType {
    /// The name `# TYPE` gives it.
    pub fn name(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
        }
    }
}

/// A sample value, written in the format's number syntax.
pub trait SampleValue {
    /// Appends the value.
    fn write_value(&self, out: &mut String);
}

macro_rules! integer_sample_value {
    ($($type:ty),*) => {$(
        impl SampleValue for $type {
            fn write_value(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
integer_sample_value!(u8, u16, u32, u64, usize, i32, i64);

impl SampleValue for bool {
    fn write_value(&self, out: &mut String) {
        out.push(if *self { '1' } else { '0' });
    }
}

impl SampleValue for f64 {
    fn write_value(&self, out: &mut String) {
        if self.is_nan() {
            out.push_str("NaN");
        } else if self.is_infinite() {
            out.push_str(if *self > 0.0 { "+Inf" } else { "-Inf" });
        } else {
            let _ = write!(out, "{self}");
        }
    }
}

/// A scrape's text, written family by family.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
    /// Families written so far: a name written twice is a bug in the caller.
    families: BTreeSet<String>,
}

impl Exposition {
    /// An empty scrape.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts the family `name` (its `# HELP` and `# TYPE` lines); its samples follow.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid metric name or was written before: both are programming
    /// errors (the names are constants), which the tests of every scrape catch.
    pub fn family(&mut self, name: &str, help: &str, kind: MetricType) -> Family<'_> {
        assert!(is_metric_name(name), "invalid metric name {name:?}");
        assert!(self.families.insert(name.to_string()), "metric family {name} written twice");
        self.text.push_str("# HELP ");
        self.text.push_str(name);
        self.text.push(' ');
        escape_help(help, &mut self.text);
        self.text.push_str("\n# TYPE ");
        self.text.push_str(name);
        self.text.push(' ');
        self.text.push_str(kind.name());
        self.text.push('\n');
        Family { exposition: self, name: name.to_string(), kind }
    }

    /// A counter family with one unlabelled sample.
    pub fn counter(&mut self, name: &str, help: &str, value: impl SampleValue) {
        self.family(name, help, MetricType::Counter).sample(&[], value);
    }

    /// A gauge family with one unlabelled sample.
    pub fn gauge(&mut self, name: &str, help: &str, value: impl SampleValue) {
        self.family(name, help, MetricType::Gauge).sample(&[], value);
    }

    /// The text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The finished text.
    pub fn into_text(self) -> String {
        self.text
    }
}

/// The samples of one family.
#[derive(Debug)]
pub struct Family<'a> {
    exposition: &'a mut Exposition,
    name: String,
    kind: MetricType,
}

impl Family<'_> {
    /// One sample of a counter or gauge.
    ///
    /// # Panics
    ///
    /// On a histogram family (use [`Family::histogram`]) or an invalid label name.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl SampleValue) -> &mut Self {
        assert!(self.kind != MetricType::Histogram, "{}: a histogram takes snapshots", self.name);
        let out = &mut self.exposition.text;
        out.push_str(&self.name);
        write_labels(out, labels, None);
        out.push(' ');
        value.write_value(out);
        out.push('\n');
        self
    }

    /// One histogram: its cumulative buckets in seconds, `_sum` and `_count`.
    ///
    /// # Panics
    ///
    /// On a family that is not a histogram, or an invalid label name (or one named `le`).
    pub fn histogram(
        &mut self,
        labels: &[(&str, &str)],
        snapshot: &HistogramSnapshot,
    ) -> &mut Self {
        assert!(self.kind == MetricType::Histogram, "{} is not a histogram", self.name);
        assert!(labels.iter().all(|(name, _)| *name != "le"), "`le` is the bucket label");
        let out = &mut self.exposition.text;
        let mut cumulative = 0u64;
        let bounds = LATENCY_BUCKET_BOUNDS_SECONDS.iter().copied().chain(["+Inf"]);
        for (bucket, bound) in snapshot.buckets.iter().zip(bounds) {
            cumulative = cumulative.wrapping_add(*bucket);
            out.push_str(&self.name);
            out.push_str("_bucket");
            write_labels(out, labels, Some(bound));
            let _ = writeln!(out, " {cumulative}");
        }
        out.push_str(&self.name);
        out.push_str("_sum");
        write_labels(out, labels, None);
        out.push(' ');
        snapshot.sum_seconds().write_value(out);
        out.push('\n');
        out.push_str(&self.name);
        out.push_str("_count");
        write_labels(out, labels, None);
        let _ = writeln!(out, " {cumulative}");
        self
    }
}

fn write_labels(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (name, value) in labels.iter().copied().chain(le.map(|bound| ("le", bound))) {
        assert!(is_label_name(name), "invalid label name {name:?}");
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(name);
        out.push_str("=\"");
        escape_label_value(value, out);
        out.push('"');
    }
    out.push('}');
}

/// Appends `value` escaped for a label value: `\` → `\\`, `"` → `\"`, line feed → `\n`.
pub fn escape_label_value(value: &str, out: &mut String) {
    for character in value.chars() {
        match character {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            other => out.push(other),
        }
    }
}

/// Appends `help` escaped for a `# HELP` line: `\` → `\\`, line feed → `\n`.
pub fn escape_help(help: &str, out: &mut String) {
    for character in help.chars() {
        match character {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            other => out.push(other),
        }
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
pub fn is_metric_name(name: &str) -> bool {
    let mut characters = name.chars();
    characters
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_' || first == ':')
        && characters.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__` (reserved).
pub fn is_label_name(name: &str) -> bool {
    let mut characters = name.chars();
    !name.starts_with("__")
        && characters.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && characters.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// One sample of a parsed scrape.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The sample's name (for histograms, with its `_bucket`, `_sum` or `_count` suffix).
    pub name: String,
    /// Its labels, unescaped, in order.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(label, _)| label == name).map(|(_, value)| value.as_str())
    }
}

/// A parsed scrape.
#[derive(Clone, Debug, Default)]
pub struct ParsedExposition {
    /// Each family's type, by name.
    pub types: BTreeMap<String, MetricType>,
    /// Each family's help text, unescaped.
    pub help: BTreeMap<String, String>,
    /// Every sample, in order.
    pub samples: Vec<Sample>,
}

impl ParsedExposition {
    /// The samples named `name` whose labels include all of `labels`.
    pub fn find<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |sample| {
            sample.name == name
                && labels.iter().all(|(label, value)| sample.label(label) == Some(*value))
        })
    }

    /// The value of the one sample named `name` with `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64, String> {
        let found: Vec<&Sample> = self.find(name, labels).collect();
        match found.as_slice() {
            [sample] => Ok(sample.value),
            [] => Err(format!("no sample {name} {labels:?}")),
            _ => Err(format!("{} samples {name} {labels:?}", found.len())),
        }
    }
}

/// Parses a scrape strictly: every line is a comment, `# HELP`, `# TYPE` or a sample; every
/// family is declared (`# TYPE`) once, before its samples, and its samples are contiguous; no
/// two samples share name and labels; label values use only the three escapes; histograms
/// have nondecreasing cumulative buckets with a `+Inf` bucket equal to `_count`, and a `_sum`.
pub fn parse(text: &str) -> Result<ParsedExposition, String> {
    let mut parsed = ParsedExposition::default();
    let mut finished_families: BTreeSet<String> = BTreeSet::new();
    let mut current_family: Option<String> = None;
    let mut seen: BTreeSet<(String, Vec<(String, String)>)> = BTreeSet::new();
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the text does not end with a line feed".to_string());
    }
    for (number, line) in text.lines().enumerate() {
        let at = |message: String| format!("line {}: {message}: {line:?}", number + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    if !is_metric_name(name) {
                        return Err(at("invalid metric name".to_string()));
                    }
                    let kind = match kind {
                        "counter" => MetricType::Counter,
                        "gauge" => MetricType::Gauge,
                        "histogram" => MetricType::Histogram,
                        other => return Err(at(format!("unsupported type {other}"))),
                    };
                    if parsed.types.insert(name.to_string(), kind).is_some() {
                        return Err(at(format!("{name} declared twice")));
                    }
                    if let Some(previous) = current_family.replace(name.to_string()) {
                        finished_families.insert(previous);
                    }
                }
                (Some("HELP"), Some(name), help) => {
                    let help = unescape(help.unwrap_or(""), false).map_err(at)?;
                    if parsed.help.insert(name.to_string(), help).is_some() {
                        return Err(at(format!("help of {name} given twice")));
                    }
                }
                _ => {} // a plain comment
            }
            continue;
        }
        let sample = parse_sample(line).map_err(at)?;
        let family = family_of(&sample.name, &parsed.types)
            .ok_or_else(|| at("sample of an undeclared family".to_string()))?;
        if finished_families.contains(&family) || current_family.as_deref() != Some(&family) {
            return Err(at(format!("sample of {family} outside its family's block")));
        }
        if !seen.insert((sample.name.clone(), sample.labels.clone())) {
            return Err(at("duplicate sample".to_string()));
        }
        parsed.samples.push(sample);
    }
    check_histograms(&parsed)?;
    Ok(parsed)
}

/// The family a sample belongs to: its own name, or for a histogram's series the name
/// without `_bucket`, `_sum` or `_count`.
fn family_of(name: &str, types: &BTreeMap<String, MetricType>) -> Option<String> {
    if types.contains_key(name) && types[name] != MetricType::Histogram {
        return Some(name.to_string());
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        (types.get(base) == Some(&MetricType::Histogram)).then(|| base.to_string())
    })
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or_else(|| "no value".to_string())?;
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return Err("invalid metric name".to_string());
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inside) = rest.strip_prefix('{') {
        rest = inside;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let equals = rest.find('=').ok_or_else(|| "label without a value".to_string())?;
            let label = &rest[..equals];
            if !is_label_name(label) {
                return Err(format!("invalid label name {label:?}"));
            }
            if labels.iter().any(|(other, _)| other == label) {
                return Err(format!("label {label} given twice"));
            }
            let quoted = rest[equals + 1..]
                .strip_prefix('"')
                .ok_or_else(|| "label value not quoted".to_string())?;
            let (value, after) = split_quoted(quoted)?;
            labels.push((label.to_string(), unescape(value, true)?));
            rest = after.strip_prefix(',').unwrap_or(after);
            if !after.starts_with(',') && !after.starts_with('}') {
                return Err("labels not separated by commas".to_string());
            }
        }
    }
    let value_text =
        rest.strip_prefix(' ').ok_or_else(|| "no space before the value".to_string())?;
    // An optional timestamp may follow; this project writes none, so none is accepted.
    let value = parse_value(value_text)?;
    Ok(Sample { name: name.to_string(), labels, value })
}

/// Splits a quoted label value at its closing quote (not an escaped one).
fn split_quoted(text: &str) -> Result<(&str, &str), String> {
    let mut escaped = false;
    for (index, character) in text.char_indices() {
        match character {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Ok((&text[..index], &text[index + 1..])),
            _ => {}
        }
    }
    Err("unterminated label value".to_string())
}

fn unescape(text: &str, quotes: bool) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut characters = text.chars();
    while let Some(character) = characters.next() {
        if character == '\n' {
            return Err("a raw line feed".to_string());
        }
        if character == '"' && quotes {
            return Err("an unescaped double quote".to_string());
        }
        if character != '\\' {
            out.push(character);
            continue;
        }
        match characters.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('"') if quotes => out.push('"'),
            other => return Err(format!("invalid escape \\{}", other.unwrap_or(' '))),
        }
    }
    Ok(out)
}

fn parse_value(text: &str) -> Result<f64, String> {
    match text {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ if text.contains(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c))) => {
            Err(format!("not a number: {text:?}"))
        }
        _ => text.parse().map_err(|_| format!("not a number: {text:?}")),
    }
}

/// Every histogram series (its labels but `le`) has cumulative buckets ending in `+Inf`, equal
/// to its `_count`, and a `_sum`.
fn check_histograms(parsed: &ParsedExposition) -> Result<(), String> {
    type Series = (String, Vec<(String, String)>);
    let mut buckets: BTreeMap<Series, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<Series, f64> = BTreeMap::new();
    let mut sums: BTreeSet<Series> = BTreeSet::new();
    for sample in &parsed.samples {
        let Some(family) = family_of(&sample.name, &parsed.types) else { continue };
        if parsed.types[&family] != MetricType::Histogram {
            continue;
        }
        let others: Vec<(String, String)> =
            sample.labels.iter().filter(|(name, _)| name != "le").cloned().collect();
        let series = (family.clone(), others);
        if sample.name.ends_with("_bucket") {
            let le = sample.label("le").ok_or_else(|| format!("{} without le", sample.name))?;
            let bound = parse_value(le)?;
            buckets.entry(series).or_default().push((bound, sample.value));
        } else if sample.name.ends_with("_count") {
            counts.insert(series, sample.value);
        } else {
            sums.insert(series);
        }
    }
    for (series, series_buckets) in &buckets {
        let name = &series.0;
        if !series_buckets.windows(2).all(|pair| pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1) {
            return Err(format!("{name} {:?}: buckets not increasing and cumulative", series.1));
        }
        let Some(&(last_bound, last_count)) = series_buckets.last() else { continue };
        if last_bound != f64::INFINITY {
            return Err(format!("{name} {:?}: no +Inf bucket", series.1));
        }
        if counts.get(series) != Some(&last_count) {
            return Err(format!("{name} {:?}: _count differs from the +Inf bucket", series.1));
        }
        if !sums.contains(series) {
            return Err(format!("{name} {:?}: no _sum", series.1));
        }
    }
    if let Some(series) = counts.keys().find(|series| !buckets.contains_key(series)) {
        return Err(format!("{} {:?}: _count without buckets", series.0, series.1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::{LatencyHistogram, LATENCY_BUCKETS};

    #[test]
    fn counters_and_gauges_have_help_type_and_samples() {
        let mut exposition = Exposition::new();
        exposition.counter("stratus_things_total", "Things done.", 42u64);
        exposition
            .family("stratus_level", "A level.", MetricType::Gauge)
            .sample(&[("kind", "a")], 1.5)
            .sample(&[("kind", "b")], f64::INFINITY)
            .sample(&[("kind", "c")], true);
        assert_eq!(
            exposition.text(),
            "# HELP stratus_things_total Things done.\n# TYPE stratus_things_total counter\n\
             stratus_things_total 42\n\
             # HELP stratus_level A level.\n# TYPE stratus_level gauge\n\
             stratus_level{kind=\"a\"} 1.5\nstratus_level{kind=\"b\"} +Inf\n\
             stratus_level{kind=\"c\"} 1\n"
        );
        let parsed = parse(exposition.text()).expect("parses");
        assert_eq!(parsed.value("stratus_level", &[("kind", "b")]), Ok(f64::INFINITY));
        assert_eq!(parsed.types["stratus_things_total"], MetricType::Counter);
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut exposition = Exposition::new();
        let nasty = "back\\slash \"quoted\"\nnext line {brace}, comma=é";
        exposition
            .family(
                "stratus_escape",
                "Help with \\ and\na line feed \"quotes stay\".",
                MetricType::Gauge,
            )
            .sample(&[("address", nasty)], 1u64);
        let text = exposition.into_text();
        assert!(text
            .contains("# HELP stratus_escape Help with \\\\ and\\na line feed \"quotes stay\".\n"));
        assert!(text.contains(
            "stratus_escape{address=\"back\\\\slash \\\"quoted\\\"\\nnext line {brace}, comma=é\"} 1\n"
        ));
        assert_eq!(text.lines().count(), 3, "no raw line feed inside a line");
        let parsed = parse(&text).expect("parses");
        assert_eq!(parsed.samples[0].label("address"), Some(nasty), "round trip");
        assert_eq!(parsed.help["stratus_escape"], "Help with \\ and\na line feed \"quotes stay\".");
    }

    #[test]
    fn histograms_are_cumulative_with_inf_sum_and_count() {
        let histogram = LatencyHistogram::new();
        histogram.record_nanos(4_000); // ≤ 5 µs
        histogram.record_nanos(5_000); // ≤ 5 µs (bounds are inclusive)
        histogram.record_nanos(700_000); // ≤ 1 ms
        histogram.record_nanos(20_000_000_000); // over 10 s: only +Inf
        let mut exposition = Exposition::new();
        exposition
            .family("stratus_latency_seconds", "Latency.", MetricType::Histogram)
            .histogram(&[("operation", "read")], &histogram.snapshot());
        let text = exposition.into_text();
        let bucket =
            |le: &str| format!("stratus_latency_seconds_bucket{{operation=\"read\",le=\"{le}\"}} ");
        assert!(text.contains(&format!("{}2\n", bucket("0.000005"))));
        assert!(text.contains(&format!("{}2\n", bucket("0.0005"))));
        assert!(text.contains(&format!("{}3\n", bucket("0.001"))));
        assert!(text.contains(&format!("{}3\n", bucket("10"))));
        assert!(text.contains(&format!("{}4\n", bucket("+Inf"))));
        assert!(text.contains("stratus_latency_seconds_sum{operation=\"read\"} 20.000709\n"));
        assert!(text.contains("stratus_latency_seconds_count{operation=\"read\"} 4\n"));
        let parsed = parse(&text).expect("parses");
        let buckets: Vec<&Sample> = parsed.find("stratus_latency_seconds_bucket", &[]).collect();
        assert_eq!(buckets.len(), LATENCY_BUCKETS);
        assert_eq!(buckets.last().and_then(|sample| sample.label("le")), Some("+Inf"));
        assert!(buckets.windows(2).all(|pair| pair[0].value <= pair[1].value));
    }

    #[test]
    fn an_empty_histogram_is_all_zeros() {
        let mut exposition = Exposition::new();
        exposition
            .family("stratus_idle_seconds", "Nothing yet.", MetricType::Histogram)
            .histogram(&[], &HistogramSnapshot::default());
        let parsed = parse(exposition.text()).expect("parses");
        assert_eq!(parsed.value("stratus_idle_seconds_bucket", &[("le", "+Inf")]), Ok(0.0));
        assert_eq!(parsed.value("stratus_idle_seconds_sum", &[]), Ok(0.0));
        assert_eq!(parsed.value("stratus_idle_seconds_count", &[]), Ok(0.0));
    }

    #[test]
    #[should_panic(expected = "written twice")]
    fn a_family_written_twice_is_a_bug() {
        let mut exposition = Exposition::new();
        exposition.counter("stratus_twice_total", "Once.", 1u64);
        exposition.counter("stratus_twice_total", "Twice.", 2u64);
    }

    #[test]
    #[should_panic(expected = "invalid label name")]
    fn invalid_label_names_are_bugs() {
        Exposition::new()
            .family("stratus_x", "X.", MetricType::Gauge)
            .sample(&[("bad-name", "v")], 1u64);
    }

    #[test]
    fn names_follow_the_format() {
        assert!(is_metric_name("stratus_master_requests_total"));
        assert!(is_metric_name("a:b_c9"));
        assert!(!is_metric_name("9lives"));
        assert!(!is_metric_name("has-dash"));
        assert!(!is_metric_name(""));
        assert!(is_label_name("operation"));
        assert!(!is_label_name("__reserved"));
        assert!(!is_label_name("with:colon"));
    }

    #[test]
    fn the_parser_refuses_what_the_format_does_not_allow() {
        let refused = [
            ("stratus_x 1\n", "undeclared"),
            ("# TYPE stratus_x gauge\nstratus_x{a=\"1\" 2\n", "unterminated labels"),
            ("# TYPE stratus_x gauge\nstratus_x{a=\"x\\q\"} 2\n", "bad escape"),
            ("# TYPE stratus_x gauge\nstratus_x{a=\"x\"y\"} 2\n", "raw quote"),
            ("# TYPE stratus_x gauge\nstratus_x{a=\"1\"} 2\nstratus_x{a=\"1\"} 3\n", "duplicate"),
            ("# TYPE stratus_x gauge\nstratus_x twelve\n", "not a number"),
            ("# TYPE stratus_x gauge\n# TYPE stratus_x gauge\n", "declared twice"),
            (
                "# TYPE stratus_x gauge\n# TYPE stratus_y gauge\nstratus_y 1\nstratus_x 1\n",
                "interleaved families",
            ),
            (
                "# TYPE stratus_h histogram\nstratus_h_bucket{le=\"1\"} 2\nstratus_h_bucket{le=\"+Inf\"} 1\nstratus_h_sum 1\nstratus_h_count 1\n",
                "not cumulative",
            ),
            (
                "# TYPE stratus_h histogram\nstratus_h_bucket{le=\"1\"} 2\nstratus_h_sum 1\nstratus_h_count 2\n",
                "no +Inf",
            ),
            (
                "# TYPE stratus_h histogram\nstratus_h_bucket{le=\"+Inf\"} 2\nstratus_h_sum 1\nstratus_h_count 3\n",
                "count differs",
            ),
            (
                "# TYPE stratus_h histogram\nstratus_h_bucket{le=\"+Inf\"} 2\nstratus_h_count 2\n",
                "no sum",
            ),
            ("# TYPE stratus_x gauge\nstratus_x 1", "no final line feed"),
        ];
        for (text, why) in refused {
            assert!(parse(text).is_err(), "{why}: {text:?} was accepted");
        }
    }
}
