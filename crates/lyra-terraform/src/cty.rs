//! Terraform's value model (cty) as it crosses the wire: types as JSON (`"string"`,
//! `["list","number"]`, `["object",{...}]`), values as msgpack, and both mapped to Lyra's.
//!
//! On the wire an object carries every attribute of its type (an unset one as nil), a value of
//! the dynamic type carries its own type (`[type JSON, value]`), and a value not known yet is
//! a msgpack extension. Lyra values are JSON; this module converts between the two with the
//! schema's type in hand.

use std::collections::BTreeMap;

use lyra_core::types::{StructField, Type};
use rmpv::Value as Mp;
use serde_json::Value;

/// A cty type.
#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
    String,
    Number,
    Bool,
    /// Any type: the value says which.
    Dynamic,
    List(Box<Ty>),
    Set(Box<Ty>),
    Map(Box<Ty>),
    /// Attributes in name order (cty's order).
    Object(BTreeMap<String, Ty>),
    Tuple(Vec<Ty>),
}

/// The msgpack extension cty writes for a value not known until apply (any extension decodes
/// as unknown).
#[cfg(test)]
const UNKNOWN_EXT: i8 = 0;

impl Ty {
    /// Parses a type from its JSON form.
    pub fn from_json(v: &Value) -> Result<Ty, String> {
        match v {
            Value::String(s) => match s.as_str() {
                "string" => Ok(Ty::String),
                "number" => Ok(Ty::Number),
                "bool" => Ok(Ty::Bool),
                "dynamic" => Ok(Ty::Dynamic),
                other => Err(format!("unknown type {other:?}")),
            },
            Value::Array(parts) => {
                let (Some(Value::String(kind)), Some(arg)) = (parts.first(), parts.get(1)) else {
                    return Err(format!("not a type: {v}"));
                };
                match kind.as_str() {
                    "list" => Ok(Ty::List(Box::new(Ty::from_json(arg)?))),
                    "set" => Ok(Ty::Set(Box::new(Ty::from_json(arg)?))),
                    "map" => Ok(Ty::Map(Box::new(Ty::from_json(arg)?))),
                    "object" => {
                        let Value::Object(attrs) = arg else {
                            return Err(format!("not an object type: {v}"));
                        };
                        let attrs = attrs
                            .iter()
                            .map(|(k, t)| Ok((k.clone(), Ty::from_json(t)?)))
                            .collect::<Result<_, String>>()?;
                        Ok(Ty::Object(attrs))
                    }
                    "tuple" => {
                        let Value::Array(elems) = arg else {
                            return Err(format!("not a tuple type: {v}"));
                        };
                        Ok(Ty::Tuple(elems.iter().map(Ty::from_json).collect::<Result<_, _>>()?))
                    }
                    other => Err(format!("unknown type kind {other:?}")),
                }
            }
            _ => Err(format!("not a type: {v}")),
        }
    }

    /// Parses a type from the bytes of a schema attribute's `type`.
    pub fn from_bytes(b: &[u8]) -> Result<Ty, String> {
        let v: Value = serde_json::from_slice(b).map_err(|e| format!("type is not JSON: {e}"))?;
        Ty::from_json(&v)
    }

    /// The type's JSON form.
    pub fn to_json(&self) -> Value {
        match self {
            Ty::String => "string".into(),
            Ty::Number => "number".into(),
            Ty::Bool => "bool".into(),
            Ty::Dynamic => "dynamic".into(),
            Ty::List(t) => serde_json::json!(["list", t.to_json()]),
            Ty::Set(t) => serde_json::json!(["set", t.to_json()]),
            Ty::Map(t) => serde_json::json!(["map", t.to_json()]),
            Ty::Object(attrs) => {
                let m: serde_json::Map<String, Value> = attrs.iter().map(|(k, t)| (k.clone(), t.to_json())).collect();
                serde_json::json!(["object", m])
            }
            Ty::Tuple(ts) => serde_json::json!(["tuple", ts.iter().map(Ty::to_json).collect::<Vec<_>>()]),
        }
    }

    /// The Lyra type workflows write values of this type as.
    pub fn to_lyra(&self) -> Type {
        match self {
            Ty::String => Type::String,
            Ty::Number => Type::Numeric,
            Ty::Bool => Type::Boolean,
            Ty::Dynamic => Type::Any,
            Ty::Tuple(_) => Type::array(Type::Any),
            Ty::List(t) | Ty::Set(t) => Type::array(t.to_lyra()),
            Ty::Map(t) => Type::hash(Type::String, t.to_lyra()),
            // Terraform leaves any attribute of an object value unset (null).
            Ty::Object(attrs) => Type::Struct(
                attrs
                    .iter()
                    .map(|(k, t)| StructField {
                        name: k.clone(),
                        ty: t.to_lyra(),
                        optional: true,
                    })
                    .collect(),
            ),
        }
    }

    /// The type a JSON value has, for a value of the dynamic type.
    fn of(v: &Value) -> Ty {
        match v {
            Value::Null => Ty::Dynamic,
            Value::Bool(_) => Ty::Bool,
            Value::Number(_) => Ty::Number,
            Value::String(_) => Ty::String,
            Value::Array(items) => Ty::Tuple(items.iter().map(Ty::of).collect()),
            Value::Object(m) => Ty::Object(m.iter().map(|(k, v)| (k.clone(), Ty::of(v))).collect()),
        }
    }
}

/// A value that does not fit its type, and where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ValueError {
    pub path: String,
    pub message: String,
}

fn err(path: &str, message: impl Into<String>) -> ValueError {
    ValueError {
        path: if path.is_empty() {
            "value".to_owned()
        } else {
            path.to_owned()
        },
        message: message.into(),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Encodes a JSON value of type `ty` as cty msgpack. Scalars convert as Terraform converts
/// them (a number or bool where a string is expected becomes its text; a numeric string where
/// a number is expected becomes the number).
pub fn encode(v: &Value, ty: &Ty) -> Result<Vec<u8>, ValueError> {
    let mut out = Vec::new();
    let mp = to_mp(v, ty, "")?;
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &mp);
    Ok(out)
}

/// The msgpack encoding of a null value (of any type).
pub fn null() -> Vec<u8> {
    vec![0xc0]
}

fn to_mp(v: &Value, ty: &Ty, path: &str) -> Result<Mp, ValueError> {
    if v.is_null() {
        return Ok(Mp::Nil);
    }
    Ok(match ty {
        Ty::String => match v {
            Value::String(s) => Mp::from(s.as_str()),
            Value::Number(n) => Mp::from(n.to_string()),
            Value::Bool(b) => Mp::from(b.to_string()),
            _ => {
                return Err(err(
                    path,
                    format!("expected a string, got {}", lyra_core::types::kind_of(v)),
                ));
            }
        },
        Ty::Number => match v {
            Value::Number(n) => number(n),
            Value::String(s) => match s.parse::<serde_json::Number>() {
                Ok(n) => number(&n),
                Err(_) => return Err(err(path, format!("expected a number, got {s:?}"))),
            },
            _ => {
                return Err(err(
                    path,
                    format!("expected a number, got {}", lyra_core::types::kind_of(v)),
                ));
            }
        },
        Ty::Bool => match v {
            Value::Bool(b) => Mp::Boolean(*b),
            Value::String(s) if s == "true" || s == "false" => Mp::Boolean(s == "true"),
            _ => {
                return Err(err(
                    path,
                    format!("expected a boolean, got {}", lyra_core::types::kind_of(v)),
                ));
            }
        },
        Ty::List(t) | Ty::Set(t) => {
            let Value::Array(items) = v else {
                return Err(err(
                    path,
                    format!("expected an array, got {}", lyra_core::types::kind_of(v)),
                ));
            };
            Mp::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, x)| to_mp(x, t, &format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            )
        }
        Ty::Tuple(ts) => {
            let Value::Array(items) = v else {
                return Err(err(
                    path,
                    format!("expected an array, got {}", lyra_core::types::kind_of(v)),
                ));
            };
            if items.len() != ts.len() {
                return Err(err(
                    path,
                    format!("expected {} elements, got {}", ts.len(), items.len()),
                ));
            }
            Mp::Array(
                items
                    .iter()
                    .zip(ts)
                    .enumerate()
                    .map(|(i, (x, t))| to_mp(x, t, &format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            )
        }
        Ty::Map(t) => {
            let Value::Object(m) = v else {
                return Err(err(
                    path,
                    format!("expected a hash, got {}", lyra_core::types::kind_of(v)),
                ));
            };
            Mp::Map(
                m.iter()
                    .map(|(k, x)| Ok((Mp::from(k.as_str()), to_mp(x, t, &join(path, k))?)))
                    .collect::<Result<_, ValueError>>()?,
            )
        }
        Ty::Object(attrs) => {
            let Value::Object(m) = v else {
                return Err(err(
                    path,
                    format!("expected a hash, got {}", lyra_core::types::kind_of(v)),
                ));
            };
            object(m, attrs, path)?
        }
        Ty::Dynamic => {
            let actual = Ty::of(v);
            let type_json = serde_json::to_vec(&actual.to_json()).unwrap_or_default();
            Mp::Array(vec![Mp::Binary(type_json), to_mp(v, &actual, path)?])
        }
    })
}

/// An object with every attribute of its type: those `m` lacks are null.
fn object(m: &serde_json::Map<String, Value>, attrs: &BTreeMap<String, Ty>, path: &str) -> Result<Mp, ValueError> {
    Ok(Mp::Map(
        attrs
            .iter()
            .map(|(k, t)| {
                let v = m.get(k).map_or(Ok(Mp::Nil), |x| to_mp(x, t, &join(path, k)))?;
                Ok((Mp::from(k.as_str()), v))
            })
            .collect::<Result<_, ValueError>>()?,
    ))
}

fn number(n: &serde_json::Number) -> Mp {
    if let Some(i) = n.as_i64() {
        Mp::from(i)
    } else if let Some(u) = n.as_u64() {
        Mp::from(u)
    } else {
        Mp::F64(n.as_f64().unwrap_or(0.0))
    }
}

/// What decoding found besides the value.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// Some part was not known yet (decoded as null).
    pub unknown: bool,
}

/// Decodes cty msgpack of type `ty` to JSON. A value not known yet decodes as null, and
/// `Decoded::unknown` says so.
pub fn decode(bytes: &[u8], ty: &Ty) -> Result<(Value, Decoded), ValueError> {
    let mp = rmpv::decode::read_value(&mut &bytes[..]).map_err(|e| err("", format!("not msgpack: {e}")))?;
    let mut d = Decoded::default();
    let v = from_mp(&mp, ty, "", &mut d)?;
    Ok((v, d))
}

fn from_mp(v: &Mp, ty: &Ty, path: &str, d: &mut Decoded) -> Result<Value, ValueError> {
    match v {
        Mp::Nil => return Ok(Value::Null),
        Mp::Ext(_, _) => {
            d.unknown = true;
            return Ok(Value::Null);
        }
        _ => {}
    }
    Ok(match ty {
        Ty::String => match v {
            Mp::String(s) => Value::String(s.as_str().unwrap_or_default().to_owned()),
            _ => return Err(err(path, format!("expected a string, got {v}"))),
        },
        Ty::Number => match v {
            Mp::Integer(i) => i
                .as_i64()
                .map(Value::from)
                .or_else(|| i.as_u64().map(Value::from))
                .unwrap_or(Value::Null),
            Mp::F64(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Mp::F32(f) => serde_json::Number::from_f64(f64::from(*f)).map_or(Value::Null, Value::Number),
            // Numbers too large for msgpack's types travel as their text.
            Mp::String(s) => s
                .as_str()
                .and_then(|s| s.parse::<serde_json::Number>().ok())
                .map(Value::Number)
                .ok_or_else(|| err(path, "a number that does not parse"))?,
            _ => return Err(err(path, format!("expected a number, got {v}"))),
        },
        Ty::Bool => match v {
            Mp::Boolean(b) => Value::Bool(*b),
            _ => return Err(err(path, format!("expected a boolean, got {v}"))),
        },
        Ty::List(t) | Ty::Set(t) => match v {
            Mp::Array(items) => Value::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, x)| from_mp(x, t, &format!("{path}[{i}]"), d))
                    .collect::<Result<_, _>>()?,
            ),
            _ => return Err(err(path, format!("expected an array, got {v}"))),
        },
        Ty::Tuple(ts) => match v {
            Mp::Array(items) => Value::Array(
                items
                    .iter()
                    .zip(ts)
                    .enumerate()
                    .map(|(i, (x, t))| from_mp(x, t, &format!("{path}[{i}]"), d))
                    .collect::<Result<_, _>>()?,
            ),
            _ => return Err(err(path, format!("expected an array, got {v}"))),
        },
        Ty::Map(t) => match v {
            Mp::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, x)| {
                        let k = k.as_str().ok_or_else(|| err(path, "a map key that is not a string"))?;
                        Ok((k.to_owned(), from_mp(x, t, &join(path, k), d)?))
                    })
                    .collect::<Result<_, ValueError>>()?,
            ),
            _ => return Err(err(path, format!("expected a map, got {v}"))),
        },
        Ty::Object(attrs) => match v {
            Mp::Map(entries) => {
                let mut out = serde_json::Map::new();
                for (k, x) in entries {
                    let k = k
                        .as_str()
                        .ok_or_else(|| err(path, "an attribute name that is not a string"))?;
                    let t = attrs.get(k).unwrap_or(&Ty::Dynamic);
                    out.insert(k.to_owned(), from_mp(x, t, &join(path, k), d)?);
                }
                Value::Object(out)
            }
            _ => return Err(err(path, format!("expected an object, got {v}"))),
        },
        Ty::Dynamic => match v {
            Mp::Array(pair) if pair.len() == 2 => {
                let type_bytes = match &pair[0] {
                    Mp::Binary(b) => b.as_slice(),
                    Mp::String(s) => s.as_bytes(),
                    _ => return Err(err(path, "a dynamic value without its type")),
                };
                let t = Ty::from_bytes(type_bytes).map_err(|m| err(path, m))?;
                from_mp(&pair[1], &t, path, d)?
            }
            _ => return Err(err(path, format!("a dynamic value that is not [type, value]: {v}"))),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(attrs: &[(&str, Ty)]) -> Ty {
        Ty::Object(attrs.iter().map(|(k, t)| ((*k).to_owned(), t.clone())).collect())
    }

    #[test]
    fn types_parse_from_their_json_and_back() {
        let src = json!(["object", {"id": "string", "tags": ["map", "string"], "ports": ["list", "number"], "on": "bool", "x": "dynamic", "t": ["tuple", ["string", "bool"]], "s": ["set", ["object", {"a": "number"}]]}]);
        let ty = Ty::from_json(&src).unwrap();
        assert_eq!(ty.to_json(), src);
        assert!(Ty::from_json(&json!("strin")).is_err());
        assert!(Ty::from_json(&json!(["list"])).is_err());
    }

    #[test]
    fn an_object_carries_every_attribute_and_round_trips() {
        let ty = obj(&[
            ("id", Ty::String),
            ("triggers", Ty::Map(Box::new(Ty::String))),
            ("n", Ty::Number),
        ]);
        let bytes = encode(&json!({"triggers": {"a": "1"}, "n": 2.5}), &ty).unwrap();
        let (back, d) = decode(&bytes, &ty).unwrap();
        assert_eq!(back, json!({"id": null, "n": 2.5, "triggers": {"a": "1"}}));
        assert!(!d.unknown);
        // Keys in cty's order (sorted), every attribute present.
        let mp = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let keys: Vec<_> = mp
            .as_map()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(keys, ["id", "n", "triggers"]);
    }

    #[test]
    fn scalars_convert_as_terraform_converts_them() {
        let ty = Ty::Map(Box::new(Ty::String));
        let (back, _) = decode(&encode(&json!({"a": 1, "b": true}), &ty).unwrap(), &ty).unwrap();
        assert_eq!(back, json!({"a": "1", "b": "true"}));
        let (n, _) = decode(&encode(&json!("42"), &Ty::Number).unwrap(), &Ty::Number).unwrap();
        assert_eq!(n, json!(42));
        let e = encode(&json!({"a": [1]}), &ty).unwrap_err();
        assert_eq!(e.path, "a");
        assert!(encode(&json!("x"), &Ty::Number).is_err());
    }

    #[test]
    fn dynamic_values_carry_their_type() {
        let v = json!({"a": [1, "x"], "b": null});
        let bytes = encode(&v, &Ty::Dynamic).unwrap();
        let (back, _) = decode(&bytes, &Ty::Dynamic).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn unknown_values_decode_as_null_and_are_reported() {
        let ty = obj(&[("id", Ty::String), ("name", Ty::String)]);
        let mp = Mp::Map(vec![
            (Mp::from("id"), Mp::Ext(UNKNOWN_EXT, vec![0])),
            (Mp::from("name"), Mp::from("a")),
        ]);
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &mp).unwrap();
        let (v, d) = decode(&bytes, &ty).unwrap();
        assert_eq!(v, json!({"id": null, "name": "a"}));
        assert!(d.unknown);
    }

    #[test]
    fn big_numbers_travel_as_text() {
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &Mp::from("12345678901234567890123")).unwrap();
        let (v, _) = decode(&bytes, &Ty::Number).unwrap();
        assert!(v.is_number());
    }

    #[test]
    fn lyra_types_follow_the_cty_types() {
        assert_eq!(
            Ty::Map(Box::new(Ty::String)).to_lyra().to_string(),
            Type::hash(Type::String, Type::String).to_string()
        );
        assert_eq!(Ty::List(Box::new(Ty::Number)).to_lyra(), Type::array(Type::Numeric));
        assert_eq!(Ty::Dynamic.to_lyra(), Type::Any);
    }
}
