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

/// A JSON value for a result row (no dependency on a JSON crate for flat objects).
#[derive(Clone, Debug)]
pub enum Field {
    /// A string.
    Text(String),
    /// A number.
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
}

/// Prints one result as a JSON object on its own line.
pub fn print_json(fields: &[(&str, Field)]) {
    println!("{}", json_object(fields));
}

/// One result as a flat JSON object.
pub fn json_object(fields: &[(&str, Field)]) -> String {
    let body: Vec<String> = fields
        .iter()
        .map(|(name, value)| match value {
            Field::Text(text) => {
                format!("\"{name}\":\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
            }
            Field::Number(number) if number.fract() == 0.0 && number.abs() < 1e15 => {
                format!("\"{name}\":{}", *number as i64)
            }
            Field::Number(number) if number.is_finite() => format!("\"{name}\":{number:.3}"),
            Field::Boolean(value) => format!("\"{name}\":{value}"),
            // JSON has no NaN or infinity.
            Field::Number(_) | Field::Null => format!("\"{name}\":null"),
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
}
