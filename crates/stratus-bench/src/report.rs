//! Result rows: a readable table and one JSON object per line.

use hdrhistogram::Histogram;

/// Latency percentiles of a histogram recorded in nanoseconds, in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Percentiles {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
}

impl Percentiles {
    /// Reads the percentiles of `histogram` (values in nanoseconds).
    pub fn of(histogram: &Histogram<u64>) -> Percentiles {
        let micros = |quantile: f64| histogram.value_at_quantile(quantile) as f64 / 1_000.0;
        Percentiles { p50_us: micros(0.50), p99_us: micros(0.99), p999_us: micros(0.999) }
    }
}

/// A JSON value for a result row.
#[derive(Clone, Debug)]
pub enum Field {
    /// A string.
    Text(String),
    /// A number (written with at most three decimals).
    Number(f64),
    /// true or false.
    Boolean(bool),
    /// No value: a measurement that could not be taken in this run (its reference is absent).
    Null,
}

impl Field {
    /// A number, or null when absent.
    pub fn optional_number(value: Option<f64>) -> Field {
        value.map_or(Field::Null, Field::Number)
    }

    fn to_json(&self) -> serde_json::Value {
        match self {
            Field::Text(text) => serde_json::Value::String(text.clone()),
            Field::Number(number) if number.fract() == 0.0 && number.abs() < 1e15 => {
                serde_json::Value::from(*number as i64)
            }
            // Three decimals: a benchmark's figures carry no more, and rows stay readable.
            // JSON has no NaN or infinity: those become null.
            Field::Number(number) => serde_json::Number::from_f64((number * 1e3).round() / 1e3)
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
            Field::Boolean(value) => serde_json::Value::Bool(*value),
            Field::Null => serde_json::Value::Null,
        }
    }
}

/// Prints one result as a JSON object on its own line.
pub fn print_json(fields: &[(&str, Field)]) {
    println!("{}", json_object(fields));
}

/// One result as a flat JSON object, its fields in the order given. Names and texts are
/// escaped by serde_json, so any text (a multi-line error message, say) stays one valid line.
pub fn json_object(fields: &[(&str, Field)]) -> String {
    let body: Vec<String> = fields
        .iter()
        .map(|(name, value)| {
            let name = serde_json::Value::String((*name).to_string());
            format!("{name}:{}", value.to_json())
        })
        .collect();
    format!("{{{}}}", body.join(","))
}

/// A new latency histogram in nanoseconds (1 ns .. 60 s, 3 significant digits).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_written_as_json() {
        let line = json_object(&[
            ("bench", Field::Text("say \"hi\"".into())),
            ("count", Field::Number(3.0)),
            ("flag", Field::Boolean(true)),
            ("rate", Field::Number(1.23456)),
            ("absent", Field::optional_number(None)),
            ("present", Field::optional_number(Some(2.0))),
            ("not_a_number", Field::Number(f64::NAN)),
        ]);
        assert_eq!(
            line,
            r#"{"bench":"say \"hi\"","count":3,"flag":true,"rate":1.235,"absent":null,"present":2,"not_a_number":null}"#
        );
    }

    #[test]
    fn any_text_makes_one_line_of_valid_json() {
        let message = "line one\nline \"two\"\t\\ and a control \u{1} character";
        let line = json_object(&[("skipped", Field::Text(message.into()))]);
        assert!(!line.contains('\n'), "{line}");
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["skipped"], message);
    }
}
