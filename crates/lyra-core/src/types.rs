//! The practical subset of Puppet's type system that workflows use: `String`, `Integer`,
//! `Float`, `Numeric`, `Boolean`, `Array[T]`, `Hash[K, V]`, `Struct[{..}]`, `Optional[T]`,
//! `Enum[..]`, `Variant[..]`, `Sensitive[T]`, `Any`. Literal values are coerced to the declared
//! type (the string `"8"` is an `Integer` 8), and failures say where and what was expected.

use std::fmt;

use crate::value::{Map, Value};

#[derive(Debug, Clone, PartialEq)]
pub enum Type {
    Any,
    String,
    Integer {
        min: Option<i64>,
        max: Option<i64>,
    },
    Float,
    Numeric,
    Boolean,
    Array(Box<Type>),
    Hash(Box<Type>, Box<Type>),
    Struct(Vec<StructField>),
    Optional(Box<Type>),
    Enum(Vec<String>),
    Variant(Vec<Type>),
    /// A value never shown in plans, logs or state output.
    Sensitive(Box<Type>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct StructField {
    pub name: String,
    pub ty: Type,
    pub optional: bool,
}

impl Type {
    pub const INTEGER: Type = Type::Integer { min: None, max: None };

    pub fn array(t: Type) -> Type {
        Type::Array(Box::new(t))
    }
    pub fn hash(k: Type, v: Type) -> Type {
        Type::Hash(Box::new(k), Box::new(v))
    }
    pub fn optional(t: Type) -> Type {
        Type::Optional(Box::new(t))
    }

    /// Whether values of this type are secret.
    pub fn is_sensitive(&self) -> bool {
        match self {
            Type::Sensitive(_) => true,
            Type::Optional(t) => t.is_sensitive(),
            _ => false,
        }
    }

    /// Parses a type expression such as `Hash[String, Array[Integer]]`.
    pub fn parse(src: &str) -> Result<Type, String> {
        let mut p = Parser { src, pos: 0, depth: 0 };
        let t = p.ty()?;
        p.ws();
        if p.pos < src.len() {
            return Err(format!(
                "unexpected '{}' at offset {} in type '{src}'",
                &src[p.pos..],
                p.pos
            ));
        }
        Ok(t)
    }

    /// Checks `value` against this type, converting where the meaning is unambiguous
    /// (numeric strings to numbers, `"true"` to `true`, scalars to strings).
    pub fn coerce(&self, value: &Value) -> Result<Value, TypeError> {
        self.coerce_at(value, &mut String::new())
    }

    fn coerce_at(&self, value: &Value, path: &mut String) -> Result<Value, TypeError> {
        let mismatch = |path: &String| TypeError {
            path: path.clone(),
            expected: self.to_string(),
            found: kind_of(value).to_owned(),
        };
        match (self, value) {
            (Type::Any, v) => Ok(v.clone()),
            // The error names the kind of value it got, never the secret itself, nor where
            // inside it the problem is (keys can be secret too).
            (Type::Sensitive(t), v) => {
                let outer = path.len();
                t.coerce_at(v, path).map_err(|e| TypeError {
                    path: e.path.get(..outer).unwrap_or_default().to_owned(),
                    found: format!("{} (the sensitive value is not shown)", kind_of(v)),
                    ..e
                })
            }
            (Type::Optional(_), Value::Null) => Ok(Value::Null),
            (Type::Optional(t), v) => t.coerce_at(v, path),
            (Type::String, Value::String(_)) => Ok(value.clone()),
            (Type::String, Value::Number(n)) => Ok(Value::String(n.to_string())),
            (Type::String, Value::Bool(b)) => Ok(Value::String(b.to_string())),
            (Type::Integer { min, max }, v) => {
                let i = match v {
                    Value::Number(n) => n.as_i64().or_else(|| {
                        n.as_f64()
                            .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                            .map(|f| f as i64)
                    }),
                    Value::String(s) => s.trim().parse::<i64>().ok(),
                    _ => None,
                }
                .ok_or_else(|| mismatch(path))?;
                if min.is_some_and(|m| i < m) || max.is_some_and(|m| i > m) {
                    return Err(TypeError {
                        path: path.clone(),
                        expected: self.to_string(),
                        found: i.to_string(),
                    });
                }
                Ok(Value::from(i))
            }
            (Type::Float | Type::Numeric, Value::Number(_)) => Ok(value.clone()),
            (Type::Float | Type::Numeric, Value::String(s)) => {
                let t = s.trim();
                if let Ok(i) = t.parse::<i64>() {
                    return Ok(if *self == Type::Float {
                        Value::from(i as f64)
                    } else {
                        Value::from(i)
                    });
                }
                t.parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
                    .ok_or_else(|| mismatch(path))
            }
            (Type::Boolean, Value::Bool(_)) => Ok(value.clone()),
            (Type::Boolean, Value::String(s)) => match s.as_str() {
                "true" => Ok(Value::Bool(true)),
                "false" => Ok(Value::Bool(false)),
                _ => Err(mismatch(path)),
            },
            (Type::Enum(items), Value::String(s)) if items.contains(s) => Ok(value.clone()),
            (Type::Array(t), Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    out.push(t.coerce_at(item, path)?);
                    path.truncate(len);
                }
                Ok(Value::Array(out))
            }
            (Type::Hash(k, v), Value::Object(m)) => {
                let mut out = Map::new();
                for (key, item) in m {
                    let len = path.len();
                    push_key(path, key);
                    k.coerce_at(&Value::String(key.clone()), path)?;
                    out.insert(key.clone(), v.coerce_at(item, path)?);
                    path.truncate(len);
                }
                Ok(Value::Object(out))
            }
            (Type::Struct(fields), Value::Object(m)) => {
                let mut out = Map::new();
                for f in fields {
                    let len = path.len();
                    push_key(path, &f.name);
                    match m.get(&f.name) {
                        Some(v) => {
                            out.insert(f.name.clone(), f.ty.coerce_at(v, path)?);
                        }
                        None if f.optional || matches!(f.ty, Type::Optional(_) | Type::Any) => {}
                        None => {
                            return Err(TypeError {
                                path: path.clone(),
                                expected: f.ty.to_string(),
                                found: "nothing (the key is missing)".to_owned(),
                            });
                        }
                    }
                    path.truncate(len);
                }
                if let Some(extra) = m.keys().find(|k| !fields.iter().any(|f| &f.name == *k)) {
                    let len = path.len();
                    push_key(path, extra);
                    let err = TypeError {
                        path: path.clone(),
                        expected: format!("one of the keys of {self}"),
                        found: format!("unknown key '{extra}'"),
                    };
                    path.truncate(len);
                    return Err(err);
                }
                Ok(Value::Object(out))
            }
            (Type::Variant(types), v) => {
                let len = path.len();
                // A failed alternative may leave its position in `path`.
                let found = types.iter().find_map(|t| {
                    let r = t.coerce_at(v, path).ok();
                    path.truncate(len);
                    r
                });
                found.ok_or_else(|| mismatch(path))
            }
            _ => Err(mismatch(path)),
        }
    }
}

fn push_key(path: &mut String, key: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
}

/// The Puppet-style name of a value's kind, for messages.
pub fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "Undef",
        Value::Bool(_) => "Boolean",
        Value::Number(n) if n.is_f64() => "Float",
        Value::Number(_) => "Integer",
        Value::String(_) => "String",
        Value::Array(_) => "Array",
        Value::Object(_) => "Hash",
    }
}

/// A value that does not fit its type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}expects {expected}, got {found}", if path.is_empty() { String::new() } else { format!("'{path}' ") })]
pub struct TypeError {
    /// Where inside the value (`config.name`, `ids[2]`); empty for the value itself.
    pub path: String,
    pub expected: String,
    pub found: String,
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T: fmt::Display>(f: &mut fmt::Formatter<'_>, items: &[T]) -> fmt::Result {
            for (i, t) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{t}")?;
            }
            Ok(())
        }
        match self {
            Type::Any => f.write_str("Any"),
            Type::String => f.write_str("String"),
            Type::Integer { min: None, max: None } => f.write_str("Integer"),
            Type::Integer { min, max } => write!(
                f,
                "Integer[{}, {}]",
                min.map_or("default".to_owned(), |m| m.to_string()),
                max.map_or("default".to_owned(), |m| m.to_string())
            ),
            Type::Float => f.write_str("Float"),
            Type::Numeric => f.write_str("Numeric"),
            Type::Boolean => f.write_str("Boolean"),
            Type::Array(t) => write!(f, "Array[{t}]"),
            Type::Hash(k, v) => write!(f, "Hash[{k}, {v}]"),
            Type::Struct(fields) => {
                f.write_str("Struct[{")?;
                for (i, fl) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    if fl.optional {
                        write!(f, "Optional[{}] => {}", fl.name, fl.ty)?;
                    } else {
                        write!(f, "{} => {}", fl.name, fl.ty)?;
                    }
                }
                f.write_str("}]")
            }
            Type::Optional(t) => write!(f, "Optional[{t}]"),
            Type::Enum(items) => {
                f.write_str("Enum[")?;
                let quoted: Vec<String> = items.iter().map(|s| format!("'{s}'")).collect();
                list(f, &quoted)?;
                f.write_str("]")
            }
            Type::Variant(types) => {
                f.write_str("Variant[")?;
                list(f, types)?;
                f.write_str("]")
            }
            Type::Sensitive(t) => write!(f, "Sensitive[{t}]"),
        }
    }
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    /// How many types enclose the one being parsed: the parser recurses, so this is bounded.
    depth: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while let Some(c) = self.src[self.pos..].chars().next().filter(|c| c.is_whitespace()) {
            self.pos += c.len_utf8();
        }
    }

    fn eat(&mut self, tok: &str) -> bool {
        self.ws();
        if self.src[self.pos..].starts_with(tok) {
            self.pos += tok.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, tok: &str) -> Result<(), String> {
        if self.eat(tok) {
            Ok(())
        } else {
            Err(format!(
                "expected '{tok}' at offset {} in type '{}'",
                self.pos, self.src
            ))
        }
    }

    fn ident(&mut self) -> Result<String, String> {
        self.ws();
        let start = self.pos;
        let rest = &self.src[self.pos..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        if len == 0 {
            return Err(format!("expected a type name at offset {start} in type '{}'", self.src));
        }
        self.pos += len;
        Ok(rest[..len].to_owned())
    }

    fn string_or_ident(&mut self) -> Result<String, String> {
        self.ws();
        let rest = &self.src[self.pos..];
        if let Some(q) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') {
            let end = rest[1..]
                .find(q)
                .ok_or_else(|| format!("unterminated string in type '{}'", self.src))?;
            self.pos += end + 2;
            Ok(rest[1..=end].to_owned())
        } else {
            self.ident()
        }
    }

    fn int_or_default(&mut self) -> Result<Option<i64>, String> {
        self.ws();
        let rest = &self.src[self.pos..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or(rest.len());
        let tok = &rest[..len];
        self.pos += len;
        if tok == "default" {
            return Ok(None);
        }
        tok.parse::<i64>()
            .map(Some)
            .map_err(|_| format!("expected an integer, got '{tok}' in type '{}'", self.src))
    }

    fn ty(&mut self) -> Result<Type, String> {
        if self.depth >= crate::value::MAX_DEPTH {
            return Err(format!(
                "the type nests more than {} levels (the limit) at offset {}",
                crate::value::MAX_DEPTH,
                self.pos
            ));
        }
        self.depth += 1;
        let t = self.ty_inner();
        self.depth -= 1;
        t
    }

    fn ty_inner(&mut self) -> Result<Type, String> {
        let name = self.ident()?;
        let params = self.eat("[");
        let t = match (name.as_str(), params) {
            ("Any" | "Data" | "RichData" | "Scalar", false) => Type::Any,
            ("String", false) => Type::String,
            ("Integer", false) => Type::INTEGER,
            ("Integer", true) => {
                let min = self.int_or_default()?;
                let max = if self.eat(",") { self.int_or_default()? } else { None };
                self.expect("]")?;
                return Ok(Type::Integer { min, max });
            }
            ("Float", false) => Type::Float,
            ("Numeric", false) => Type::Numeric,
            ("Boolean", false) => Type::Boolean,
            ("Array", false) => Type::array(Type::Any),
            ("Array", true) => Type::array(self.ty()?),
            ("Hash", false) => Type::hash(Type::Any, Type::Any),
            ("Hash", true) => {
                let k = self.ty()?;
                self.expect(",")?;
                Type::hash(k, self.ty()?)
            }
            ("Optional", true) => Type::optional(self.ty()?),
            ("Sensitive", false) => Type::Sensitive(Box::new(Type::Any)),
            ("Sensitive", true) => Type::Sensitive(Box::new(self.ty()?)),
            ("Enum", true) => {
                let mut items = vec![self.string_or_ident()?];
                while self.eat(",") {
                    items.push(self.string_or_ident()?);
                }
                Type::Enum(items)
            }
            ("Variant", true) => {
                let mut items = vec![self.ty()?];
                while self.eat(",") {
                    items.push(self.ty()?);
                }
                Type::Variant(items)
            }
            ("Struct", true) => {
                self.expect("{")?;
                let mut fields = Vec::new();
                if !self.eat("}") {
                    loop {
                        let (name, optional) = if self.eat("Optional[") {
                            let n = self.string_or_ident()?;
                            self.expect("]")?;
                            (n, true)
                        } else {
                            (self.string_or_ident()?, false)
                        };
                        if !self.eat("=>") {
                            self.expect(":")?;
                        }
                        fields.push(StructField {
                            name,
                            ty: self.ty()?,
                            optional,
                        });
                        if !self.eat(",") {
                            break;
                        }
                        // Allow a trailing comma.
                        if self.eat("}") {
                            self.pos -= 1;
                            break;
                        }
                    }
                    self.expect("}")?;
                }
                Type::Struct(fields)
            }
            (other, true) => return Err(format!("type '{other}' takes no parameters here, or is unknown")),
            (other, false) => return Err(format!("unknown type '{other}'")),
        };
        if params {
            self.expect("]")?;
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_and_prints_round_trip() {
        for src in [
            "Hash[String, String]",
            "Array[Optional[Integer]]",
            "Struct[{name => String, Optional[port] => Integer}]",
            "Enum['a', 'b']",
            "Variant[String, Integer]",
            "Integer[0, 10]",
            "Sensitive[String]",
        ] {
            let t = Type::parse(src).unwrap();
            assert_eq!(Type::parse(&t.to_string()).unwrap(), t, "{src}");
        }
        assert_eq!(
            Type::parse("Hash[String,String]").unwrap(),
            Type::hash(Type::String, Type::String)
        );
    }

    #[test]
    fn rejects_bad_types() {
        assert!(Type::parse("Strin").is_err());
        assert!(Type::parse("Hash[String").is_err());
        assert!(Type::parse("Array[String]]").is_err());
        // Whitespace of more than one byte is skipped whole.
        assert_eq!(
            Type::parse("Array[\u{3000}String\u{3000}]").unwrap(),
            Type::array(Type::String)
        );
    }

    #[test]
    fn nesting_is_limited_not_a_stack_overflow() {
        let nest = |n: usize| format!("{}String{}", "Array[".repeat(n), "]".repeat(n));
        let at_limit = Type::parse(&nest(crate::value::MAX_DEPTH - 1)).unwrap();
        assert_eq!(Type::parse(&at_limit.to_string()).unwrap(), at_limit);
        for n in [crate::value::MAX_DEPTH, 100_000] {
            let err = Type::parse(&nest(n)).unwrap_err();
            assert!(err.contains("nests more than 64 levels"), "{err}");
            assert!(err.len() < 200, "the message does not repeat the type: {err}");
        }
    }

    #[test]
    fn sensitive_errors_show_neither_the_value_nor_its_keys() {
        let t = Type::parse("Struct[{login => Sensitive[Hash[String, Integer]]}]").unwrap();
        let err = t.coerce(&json!({"login": {"admin-name": "pa55word"}})).unwrap_err();
        let text = err.to_string();
        assert!(!text.contains("admin-name") && !text.contains("pa55word"), "{text}");
        assert_eq!(err.path, "login");
        let err = Type::parse("Sensitive[Integer[1, 10]]")
            .unwrap()
            .coerce(&json!(4242))
            .unwrap_err();
        assert!(!err.to_string().contains("4242"), "{err}");
    }

    #[test]
    fn coerces_literals() {
        assert_eq!(Type::INTEGER.coerce(&json!("8")).unwrap(), json!(8));
        assert_eq!(Type::Boolean.coerce(&json!("true")).unwrap(), json!(true));
        assert_eq!(Type::String.coerce(&json!(3)).unwrap(), json!("3"));
        let err = Type::array(Type::INTEGER).coerce(&json!([1, "x"])).unwrap_err();
        assert_eq!(err.to_string(), "'[1]' expects Integer, got String");
        let t = Type::parse("Struct[{a => Integer}]").unwrap();
        assert!(t.coerce(&json!({"a": 1, "b": 2})).is_err());
        assert!(t.coerce(&json!({})).is_err());
        let range = Type::parse("Integer[1, 3]").unwrap();
        assert!(range.coerce(&json!(4)).is_err());
        assert!(Type::optional(Type::String).coerce(&json!(null)).is_ok());
        assert!(Type::String.coerce(&json!(null)).is_err());
    }
}
