//! JSON exactly as Go's `json.MarshalIndent(v, "", "  ")` writes it, so the Foobernetes file
//! stays byte-compatible with the original's.
//!
//! serde_json's pretty printer already matches Go's layout (two-space indent, `"key": value`,
//! `{}` and `[]` for empty containers, no trailing newline); field order and sorted map keys come
//! from the model's structs and `BTreeMap`s. What differs is string escaping: Go escapes `<`, `>`
//! and `&` (HTML safety) and U+2028/U+2029 as `\u00XX`/`\u20XX`, and the Go of the original
//! (before 1.22) wrote backspace and form feed as `\u0008` and `\u000c` rather than `\b`, `\f`.

use std::io;

use serde::Serialize;
use serde_json::ser::{CharEscape, Formatter, PrettyFormatter};

/// Serializes `value` the way the original's Go code did.
pub(crate) fn to_vec<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter::new());
    value.serialize(&mut ser)?;
    Ok(out)
}

struct GoFormatter {
    pretty: PrettyFormatter<'static>,
}

impl GoFormatter {
    fn new() -> Self {
        GoFormatter {
            pretty: PrettyFormatter::with_indent(b"  "),
        }
    }
}

impl Formatter for GoFormatter {
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.pretty.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.pretty.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.end_object_value(w)
    }

    fn write_string_fragment<W: ?Sized + io::Write>(&mut self, w: &mut W, fragment: &str) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let escape = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            w.write_all(&fragment.as_bytes()[start..i])?;
            w.write_all(escape.as_bytes())?;
            start = i + c.len_utf8();
        }
        w.write_all(&fragment.as_bytes()[start..])
    }

    fn write_char_escape<W: ?Sized + io::Write>(&mut self, w: &mut W, escape: CharEscape) -> io::Result<()> {
        match escape {
            CharEscape::Backspace => w.write_all(b"\\u0008"),
            CharEscape::FormFeed => w.write_all(b"\\u000c"),
            other => self.pretty.write_char_escape(w, other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn go(v: &serde_json::Value) -> String {
        String::from_utf8(to_vec(v).unwrap()).unwrap()
    }

    #[test]
    fn layout_matches_marshal_indent() {
        assert_eq!(
            go(&json!({"a": {}, "b": [], "c": null})),
            "{\n  \"a\": {},\n  \"b\": [],\n  \"c\": null\n}"
        );
        assert_eq!(go(&json!({"a": [1, "x"]})), "{\n  \"a\": [\n    1,\n    \"x\"\n  ]\n}");
    }

    #[test]
    fn strings_are_escaped_like_go() {
        assert_eq!(go(&json!("a<b>&c")), r#""a\u003cb\u003e\u0026c""#);
        assert_eq!(
            go(&json!("\u{8}\u{c}\n\r\t\u{1}\"\\")),
            r#""\u0008\u000c\n\r\t\u0001\"\\""#
        );
        assert_eq!(go(&json!("x\u{2028}y\u{2029}é/")), r#""x\u2028y\u2029é/""#);
        assert_eq!(go(&json!({"<k>": 1})), "{\n  \"\\u003ck\\u003e\": 1\n}");
    }
}
