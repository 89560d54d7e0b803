//! `Random::Password` and `Random::Id`: random values made once and kept in the engine's
//! state, shaped after Terraform's `random_password` and `random_id`.
//!
//! The value is drawn when the resource is created, from rand's thread generator (ChaCha12
//! seeded by the operating system: a CSPRNG), and lives only in the state: `read` returns it
//! as recorded, `lookup` is `Absent` (a create that was never recorded left nothing behind),
//! and `delete` forgets nothing but the record. Every setting is immutable, so changing one,
//! `keepers` included, draws a new value.
//!
//! A password holds `length` characters from the enabled classes (lower, upper, numeric,
//! special, the latter `override_special` when given), at least `min_*` of each class, in
//! random order. It is sensitive. An id is `byte_length` random bytes, spelled in hex, URL-safe
//! unpadded base64, standard base64 and decimal, each after `prefix`; the external id is the
//! URL-safe base64 without the prefix (as in Terraform).

use crate::invalid;
use async_trait::async_trait;
use base64::Engine as _;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::{Type, kind_of};
use lyra_core::value::{Map, Value};
use rand::RngExt as _;
use rand::seq::SliceRandom as _;

/// The canonical type names.
pub const PASSWORD: &str = "Random::Password";
pub const ID: &str = "Random::Id";

/// The longest password and the most bytes of an id: far more than anyone needs, and small
/// enough for a state record.
const MAX_LENGTH: i64 = 4096;

const LOWER: &str = "abcdefghijklmnopqrstuvwxyz";
const UPPER: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
const NUMERIC: &str = "0123456789";
/// Terraform's default special characters.
const SPECIAL: &str = "!@#$%&*()-_=+[]{}<>:?";

/// The provider of the `Random` types.
#[derive(Debug, Clone, Default)]
pub struct RandomProvider;

impl RandomProvider {
    pub fn new() -> Self {
        RandomProvider
    }
}

/// The integer in `attribute`, within `min..=max`; `None` when unset.
fn opt_int(m: &Map, attribute: &str, min: i64, max: i64) -> Result<Option<usize>, ProviderError> {
    match m.get(attribute) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .filter(|i| (min..=max).contains(i))
            .and_then(|i| usize::try_from(i).ok())
            .map(Some)
            .ok_or_else(|| invalid(attribute, format!("expects an integer from {min} to {max}, got {n}"))),
        Some(other) => Err(invalid(
            attribute,
            format!("expects an integer, got {}", kind_of(other)),
        )),
    }
}

fn flag(m: &Map, attribute: &str) -> Result<bool, ProviderError> {
    match m.get(attribute) {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(invalid(attribute, format!("expects a boolean, got {}", kind_of(other)))),
    }
}

/// A password for `desired`'s settings.
fn password(desired: &Map) -> Result<String, ProviderError> {
    let length = opt_int(desired, "length", 1, MAX_LENGTH)?.ok_or_else(|| invalid("length", "is required"))?;
    let special: String = match desired.get("override_special") {
        None | Some(Value::Null) => SPECIAL.to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(invalid(
                "override_special",
                format!("expects a string, got {}", kind_of(other)),
            ));
        }
    };
    let classes = [
        ("lower", "min_lower", LOWER.to_owned()),
        ("upper", "min_upper", UPPER.to_owned()),
        ("numeric", "min_numeric", NUMERIC.to_owned()),
        ("special", "min_special", special),
    ];
    let mut rng = rand::rng();
    let mut chars: Vec<char> = Vec::with_capacity(length);
    let mut pool: Vec<char> = Vec::new();
    for (enabled, min, set) in &classes {
        let on = flag(desired, enabled)?;
        let at_least = opt_int(desired, min, 0, MAX_LENGTH)?.unwrap_or(0);
        let set: Vec<char> = set.chars().collect();
        if at_least > 0 && (!on || set.is_empty()) {
            return Err(invalid(
                min,
                format!("asks for {enabled} characters, but {enabled} characters are off"),
            ));
        }
        if on {
            for _ in 0..at_least {
                chars.push(set[rng.random_range(0..set.len())]);
            }
            pool.extend(set);
        }
    }
    if chars.len() > length {
        return Err(invalid(
            "length",
            format!(
                "is {length}, less than the {} characters the min_* settings ask for",
                chars.len()
            ),
        ));
    }
    if pool.is_empty() {
        return Err(invalid(
            "length",
            "no character class is enabled (lower, upper, numeric, special)",
        ));
    }
    while chars.len() < length {
        chars.push(pool[rng.random_range(0..pool.len())]);
    }
    chars.shuffle(&mut rng);
    Ok(chars.into_iter().collect())
}

/// The decimal spelling of the big-endian unsigned integer `bytes`.
fn decimal(bytes: &[u8]) -> String {
    let mut digits: Vec<u8> = Vec::new();
    let mut n: Vec<u8> = bytes.to_vec();
    while n.iter().any(|b| *b != 0) {
        // Divide n by 10 in place, keeping the remainder: the next digit.
        let mut rem: u16 = 0;
        for b in &mut n {
            let cur = (rem << 8) | u16::from(*b);
            *b = u8::try_from(cur / 10).unwrap_or(0);
            rem = cur % 10;
        }
        digits.push(b'0' + u8::try_from(rem).unwrap_or(0));
    }
    if digits.is_empty() {
        return "0".to_owned();
    }
    digits.reverse();
    String::from_utf8(digits).unwrap_or_default()
}

/// A random id for `desired`'s settings: the external id and the actual state.
fn id(desired: &Map) -> Result<(String, Map), ProviderError> {
    let n = opt_int(desired, "byte_length", 1, MAX_LENGTH)?.ok_or_else(|| invalid("byte_length", "is required"))?;
    let prefix = match desired.get("prefix") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s.as_str(),
        Some(other) => return Err(invalid("prefix", format!("expects a string, got {}", kind_of(other)))),
    };
    let mut bytes = vec![0u8; n];
    rand::rng().fill(bytes.as_mut_slice());
    let b64_url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes);
    let mut actual = desired.clone();
    for (k, v) in [
        ("hex", hex::encode(&bytes)),
        ("b64_url", b64_url.clone()),
        ("b64_std", base64::engine::general_purpose::STANDARD.encode(&bytes)),
        ("dec", decimal(&bytes)),
    ] {
        actual.insert(k.to_owned(), Value::String(format!("{prefix}{v}")));
    }
    Ok((b64_url, actual))
}

fn keepers() -> AttributeSchema {
    AttributeSchema::new("keepers", Type::Any)
        .immutable()
        .doc("Any value; a change draws a new value.")
}

#[async_trait]
impl Provider for RandomProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        let int = |min| Type::Integer {
            min: Some(min),
            max: Some(MAX_LENGTH),
        };
        let class = |name: &str, what: &str| {
            AttributeSchema::new(name, Type::optional(Type::Boolean))
                .immutable()
                .doc(&format!("Whether the password may hold {what} (default true)."))
        };
        let min = |name: &str, what: &str| {
            AttributeSchema::new(name, Type::optional(int(0)))
                .immutable()
                .doc(&format!("The fewest {what} the password holds (default 0)."))
        };
        let computed = |name: &str, doc: &str| AttributeSchema::new(name, Type::String).computed().doc(doc);
        vec![
            ResourceSchema::new(
                PASSWORD,
                vec![
                    AttributeSchema::new("length", int(1))
                        .required()
                        .immutable()
                        .doc("How many characters the password has."),
                    class("special", "special characters"),
                    class("upper", "upper-case letters"),
                    class("lower", "lower-case letters"),
                    class("numeric", "digits"),
                    AttributeSchema::new("override_special", Type::optional(Type::String))
                        .immutable()
                        .doc("The special characters to use instead of !@#$%&*()-_=+[]{}<>:?"),
                    min("min_special", "special characters"),
                    min("min_upper", "upper-case letters"),
                    min("min_lower", "lower-case letters"),
                    min("min_numeric", "digits"),
                    keepers(),
                    AttributeSchema::new("result", Type::Sensitive(Box::new(Type::String)))
                        .computed()
                        .sensitive()
                        .doc("The password, drawn once and kept in the state."),
                ],
            )
            .local()
            .read_is_record()
            .doc("A random password, drawn once and kept in the state (like Terraform's random_password)."),
            ResourceSchema::new(
                ID,
                vec![
                    AttributeSchema::new("byte_length", int(1))
                        .required()
                        .immutable()
                        .doc("How many random bytes the id has."),
                    AttributeSchema::new("prefix", Type::optional(Type::String))
                        .immutable()
                        .doc("Text put before each spelling of the id."),
                    keepers(),
                    computed("hex", "The id in hex, after the prefix."),
                    computed(
                        "b64_url",
                        "The id in URL-safe base64 without padding, after the prefix.",
                    ),
                    computed("b64_std", "The id in standard base64, after the prefix."),
                    computed("dec", "The id as a decimal number, after the prefix."),
                ],
            )
            .local()
            .read_is_record()
            .doc("Random bytes, drawn once and kept in the state (like Terraform's random_id)."),
        ]
    }

    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        if cx.type_name.eq_ignore_ascii_case(ID) {
            let (external_id, actual) = id(desired)?;
            return Ok(Created { external_id, actual });
        }
        let mut actual = desired.clone();
        actual.insert("result".to_owned(), Value::String(password(desired)?));
        Ok(Created {
            external_id: crate::random_hex_id("password"),
            actual,
        })
    }

    async fn read(
        &self,
        _cx: &OpContext<'_>,
        _external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        Ok(prior.cloned())
    }

    /// Every setting is immutable, so nothing changes in place: the value drawn is kept.
    async fn update(
        &self,
        cx: &OpContext<'_>,
        _external_id: &str,
        desired: &Map,
        prior: &Map,
    ) -> Result<Map, ProviderError> {
        let computed: &[&str] = if cx.type_name.eq_ignore_ascii_case(ID) {
            &["hex", "b64_url", "b64_std", "dec"]
        } else {
            &["result"]
        };
        let mut actual = desired.clone();
        for k in computed {
            if let Some(v) = prior.get(*k) {
                actual.insert((*k).to_owned(), v.clone());
            }
        }
        Ok(actual)
    }

    async fn delete(&self, _cx: &OpContext<'_>, _external_id: &str, _prior: &Map) -> Result<(), ProviderError> {
        Ok(())
    }

    /// Always `Absent`: the value lives only in the state, so a create that was never
    /// recorded left nothing to find.
    async fn lookup(&self, _cx: &OpContext<'_>, _desired: &Map) -> Result<Lookup, ProviderError> {
        Ok(Lookup::Absent)
    }
}

#[cfg(test)]
mod tests;
