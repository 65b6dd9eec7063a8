//! A small JSON writer for the status page's data (no serde: a handful of objects and arrays
//! of numbers and strings do not need it).

use std::fmt::Write as _;

/// Writes one JSON value, keeping track of where commas go.
///
/// Misuse (a key outside an object, a value where a key is due, unbalanced ends) is a bug in
/// the caller and panics in debug builds; the tests of every document written catch it.
#[derive(Debug, Default)]
pub struct JsonWriter {
    text: String,
    /// For each open object or array: whether it has a member yet, and whether it is an
    /// object.
    open: Vec<(bool, bool)>,
    /// A key was just written: the next value is its value (no comma).
    after_key: bool,
}

impl JsonWriter {
    /// An empty document.
    pub fn new() -> JsonWriter {
        JsonWriter::default()
    }

    fn before_value(&mut self) {
        if self.after_key {
            self.after_key = false;
            return;
        }
        if let Some((has_member, is_object)) = self.open.last_mut() {
            debug_assert!(!*is_object, "a value in an object needs a key");
            if *has_member {
                self.text.push(',');
            }
            *has_member = true;
        }
    }

    /// `{`
    pub fn begin_object(&mut self) -> &mut Self {
        self.before_value();
        self.text.push('{');
        self.open.push((false, true));
        self
    }

    /// `}`
    pub fn end_object(&mut self) -> &mut Self {
        debug_assert!(matches!(self.open.pop(), Some((_, true))), "no object to end");
        self.text.push('}');
        self
    }

    /// `[`
    pub fn begin_array(&mut self) -> &mut Self {
        self.before_value();
        self.text.push('[');
        self.open.push((false, false));
        self
    }

    /// `]`
    pub fn end_array(&mut self) -> &mut Self {
        debug_assert!(matches!(self.open.pop(), Some((_, false))), "no array to end");
        self.text.push(']');
        self
    }

    /// A member's key; its value comes next.
    pub fn key(&mut self, key: &str) -> &mut Self {
        let Some((has_member, is_object)) = self.open.last_mut() else {
            debug_assert!(false, "a key outside an object");
            return self;
        };
        debug_assert!(*is_object && !self.after_key, "a key where a value is due");
        if *has_member {
            self.text.push(',');
        }
        *has_member = true;
        escape_string(key, &mut self.text);
        self.text.push(':');
        self.after_key = true;
        self
    }

    /// A string.
    pub fn string(&mut self, value: &str) -> &mut Self {
        self.before_value();
        escape_string(value, &mut self.text);
        self
    }

    /// An unsigned integer. (JavaScript reads integers above 2^53 inexactly; counters do not
    /// get there, and hash-range bounds are written as strings.)
    pub fn unsigned(&mut self, value: u64) -> &mut Self {
        self.before_value();
        let _ = write!(self.text, "{value}");
        self
    }

    /// A number; NaN and infinities, which JSON cannot carry, are written as null.
    pub fn number(&mut self, value: f64) -> &mut Self {
        self.before_value();
        if value.is_finite() {
            let _ = write!(self.text, "{value}");
        } else {
            self.text.push_str("null");
        }
        self
    }

    /// `true` or `false`.
    pub fn boolean(&mut self, value: bool) -> &mut Self {
        self.before_value();
        self.text.push_str(if value { "true" } else { "false" });
        self
    }

    /// `null`.
    pub fn null(&mut self) -> &mut Self {
        self.before_value();
        self.text.push_str("null");
        self
    }

    /// A string, or null.
    pub fn optional_string(&mut self, value: Option<&str>) -> &mut Self {
        match value {
            Some(value) => self.string(value),
            None => self.null(),
        }
    }

    /// The document.
    pub fn finish(self) -> String {
        debug_assert!(self.open.is_empty() && !self.after_key, "unfinished document");
        self.text
    }
}

/// Appends `value` as a JSON string: quotes, backslashes and control characters escaped, and
/// `<`, `>` and `&` too, so the text is also safe inside an HTML script element.
pub fn escape_string(value: &str, out: &mut String) {
    out.push('"');
    for character in value.chars() {
        match character {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(character));
            }
            control if u32::from(control) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(control));
            }
            other => out.push(other),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_and_arrays_get_their_commas() {
        let mut json = JsonWriter::new();
        json.begin_object();
        json.key("servers").begin_array();
        for id in 1..=2 {
            json.begin_object().key("id").unsigned(id).key("up").boolean(id == 1).end_object();
        }
        json.end_array();
        json.key("ratio").number(0.25).key("bad").number(f64::NAN).key("none").null();
        json.key("empty").begin_array().end_array();
        json.key("maybe").optional_string(Some("x"));
        json.end_object();
        assert_eq!(
            json.finish(),
            r#"{"servers":[{"id":1,"up":true},{"id":2,"up":false}],"ratio":0.25,"bad":null,"none":null,"empty":[],"maybe":"x"}"#
        );
    }

    #[test]
    fn strings_are_escaped() {
        let mut json = JsonWriter::new();
        json.string("quote\" backslash\\ line\n tab\t bell\u{7} </script> & é");
        assert_eq!(
            json.finish(),
            r#""quote\" backslash\\ line\n tab\t bell\u0007 \u003c/script\u003e \u0026 é""#
        );
    }
}
