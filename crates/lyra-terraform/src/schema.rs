//! A Terraform schema block as a Lyra resource schema, and the values Terraform's planning
//! needs built from a Lyra resource's desired state.

use std::collections::BTreeMap;

use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::Type;
use serde_json::{Map, Value};

use crate::cty::Ty;
use crate::proto::tfplugin::schema::{Attribute, Block, Object, nested_block, object};

/// `Tf` and the provider's name in CamelCase: `null` is `TfNull`, `google-beta` `TfGoogleBeta`.
pub fn lyra_namespace(provider: &str) -> String {
    format!("Tf{}", camel(provider))
}

/// The Lyra name of resource type `tf_type` of provider `provider`: `null_resource` of `null`
/// is `TfNull::Resource`; a type without the provider's prefix keeps all its words.
pub fn lyra_type_name(provider: &str, tf_type: &str) -> String {
    let prefix = format!("{}_", provider.replace('-', "_"));
    let rest = tf_type
        .strip_prefix(&prefix)
        .filter(|r| !r.is_empty())
        .unwrap_or(tf_type);
    format!("{}::{}", lyra_namespace(provider), camel(rest))
}

fn camel(s: &str) -> String {
    s.split(['_', '-'])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// One block of a schema (a resource's or the provider's configuration), ready for use.
#[derive(Debug, Clone)]
pub(crate) struct BlockInfo {
    /// The whole value's type: an object of the attributes and nested blocks.
    pub ty: Ty,
    pub attributes: Vec<AttrInfo>,
    pub blocks: Vec<BlockNest>,
}

#[derive(Debug, Clone)]
pub(crate) struct AttrInfo {
    pub name: String,
    pub ty: Ty,
    pub required: bool,
    pub optional: bool,
    pub computed: bool,
    pub sensitive: bool,
    pub description: String,
}

#[derive(Debug, Clone)]
pub(crate) struct BlockNest {
    pub name: String,
    pub nesting: nested_block::NestingMode,
    pub block: BlockInfo,
    pub min_items: i64,
    pub description: String,
}

impl BlockInfo {
    pub fn from_proto(b: &Block) -> Result<BlockInfo, String> {
        let mut types = BTreeMap::new();
        let mut attributes = Vec::new();
        for a in &b.attributes {
            let ty = attribute_type(a)?;
            types.insert(a.name.clone(), ty.clone());
            attributes.push(AttrInfo {
                name: a.name.clone(),
                ty,
                required: a.required,
                optional: a.optional,
                computed: a.computed,
                sensitive: a.sensitive,
                description: a.description.clone(),
            });
        }
        let mut blocks = Vec::new();
        for nb in &b.block_types {
            let inner = BlockInfo::from_proto(nb.block.as_ref().unwrap_or(&Block::default()))?;
            let nesting = nb.nesting();
            types.insert(nb.type_name.clone(), nest_type(nesting, inner.ty.clone()));
            blocks.push(BlockNest {
                name: nb.type_name.clone(),
                nesting,
                min_items: nb.min_items,
                description: nb.block.as_ref().map(|b| b.description.clone()).unwrap_or_default(),
                block: inner,
            });
        }
        Ok(BlockInfo {
            ty: Ty::Object(types),
            attributes,
            blocks,
        })
    }

    /// The Lyra attributes of this block.
    pub fn lyra_attributes(&self) -> Vec<AttributeSchema> {
        let mut out = Vec::new();
        for a in &self.attributes {
            let mut s = AttributeSchema::new(&a.name, a.ty.to_lyra()).doc(&a.description);
            if a.required {
                s = s.required();
            } else if a.computed && a.optional {
                s = s.provided();
            } else if a.computed {
                s = s.computed();
            }
            if a.sensitive {
                s = s.sensitive();
            }
            out.push(s);
        }
        for b in &self.blocks {
            let item = b.block.ty.to_lyra();
            let ty = match b.nesting {
                nested_block::NestingMode::List | nested_block::NestingMode::Set => Type::array(item),
                nested_block::NestingMode::Map => Type::hash(Type::String, item),
                _ => item,
            };
            let mut s = AttributeSchema::new(&b.name, ty).doc(&b.description);
            if b.min_items > 0 {
                s = s.required();
            }
            out.push(s);
        }
        out
    }

    /// The configuration value Terraform would build from `desired`: every attribute of the
    /// block (those not set are null, computed-only ones always), and nested list, set and
    /// map blocks that are not set empty rather than null (Terraform's blocks are never null
    /// unless single).
    pub fn config(&self, desired: &Map<String, Value>) -> Value {
        let mut out = Map::new();
        for a in &self.attributes {
            let v = if a.computed && !a.optional {
                Value::Null
            } else {
                desired.get(&a.name).cloned().unwrap_or(Value::Null)
            };
            out.insert(a.name.clone(), v);
        }
        for b in &self.blocks {
            let v = desired.get(&b.name).cloned().unwrap_or(Value::Null);
            out.insert(b.name.clone(), b.config(v));
        }
        Value::Object(out)
    }

    /// Terraform's proposed new state: the configuration, with what the configuration leaves
    /// unset of computed attributes taken from the prior state.
    pub fn proposed(&self, prior: Option<&Map<String, Value>>, config: &Value) -> Value {
        let Value::Object(config) = config else {
            return config.clone();
        };
        let mut out = config.clone();
        for a in &self.attributes {
            if a.computed && config.get(&a.name).is_none_or(Value::is_null) {
                let v = prior.and_then(|p| p.get(&a.name)).cloned().unwrap_or(Value::Null);
                out.insert(a.name.clone(), v);
            }
        }
        Value::Object(out)
    }
}

impl BlockNest {
    fn config(&self, v: Value) -> Value {
        use nested_block::NestingMode as N;
        match (self.nesting, v) {
            (N::List | N::Set, Value::Null) => Value::Array(Vec::new()),
            (N::List | N::Set, Value::Array(items)) => Value::Array(items.into_iter().map(|i| self.item(i)).collect()),
            // One item where a list is expected: Terraform's `MaxItems: 1` blocks, written as
            // the item itself.
            (N::List | N::Set, item @ Value::Object(_)) => Value::Array(vec![self.item(item)]),
            (N::Map, Value::Null) => Value::Object(Map::new()),
            (N::Map, Value::Object(m)) => Value::Object(m.into_iter().map(|(k, i)| (k, self.item(i))).collect()),
            (_, Value::Null) => Value::Null,
            (_, item) => self.item(item),
        }
    }

    fn item(&self, v: Value) -> Value {
        match v {
            Value::Object(m) => self.block.config(&m),
            other => other,
        }
    }
}

fn nest_type(nesting: nested_block::NestingMode, item: Ty) -> Ty {
    use nested_block::NestingMode as N;
    match nesting {
        N::List => Ty::List(Box::new(item)),
        N::Set => Ty::Set(Box::new(item)),
        N::Map => Ty::Map(Box::new(item)),
        _ => item,
    }
}

fn attribute_type(a: &Attribute) -> Result<Ty, String> {
    if let Some(nested) = &a.nested_type {
        return object_type(nested).map_err(|e| format!("attribute {}: {e}", a.name));
    }
    Ty::from_bytes(&a.r#type).map_err(|e| format!("attribute {}: {e}", a.name))
}

/// A protocol-6 nested attribute's type.
fn object_type(o: &Object) -> Result<Ty, String> {
    let attrs = o
        .attributes
        .iter()
        .map(|a| Ok((a.name.clone(), attribute_type(a)?)))
        .collect::<Result<BTreeMap<_, _>, String>>()?;
    let item = Ty::Object(attrs);
    Ok(match o.nesting() {
        object::NestingMode::List => Ty::List(Box::new(item)),
        object::NestingMode::Set => Ty::Set(Box::new(item)),
        object::NestingMode::Map => Ty::Map(Box::new(item)),
        _ => item,
    })
}

/// A resource type of a provider, under its Lyra name.
#[derive(Debug, Clone)]
pub(crate) struct TypeInfo {
    pub tf_name: String,
    pub version: i64,
    pub block: BlockInfo,
    pub schema: ResourceSchema,
}

impl TypeInfo {
    pub fn new(provider: &str, tf_name: &str, version: i64, block: &Block) -> Result<TypeInfo, String> {
        let info = BlockInfo::from_proto(block).map_err(|e| format!("{tf_name}: {e}"))?;
        let name = lyra_type_name(provider, tf_name);
        let doc = if block.description.is_empty() {
            format!("Terraform's {tf_name}, of the {provider} provider.")
        } else {
            block.description.clone()
        };
        let schema = ResourceSchema::new(&name, info.lyra_attributes()).doc(&doc);
        Ok(TypeInfo {
            tf_name: tf_name.to_owned(),
            version,
            block: info,
            schema,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::tfplugin::schema::NestedBlock;
    use serde_json::json;

    #[test]
    fn names_are_camel_case_under_tf_and_the_provider() {
        assert_eq!(lyra_type_name("null", "null_resource"), "TfNull::Resource");
        assert_eq!(lyra_type_name("aws", "aws_s3_bucket"), "TfAws::S3Bucket");
        assert_eq!(
            lyra_type_name("google-beta", "google_beta_thing"),
            "TfGoogleBeta::Thing"
        );
        assert_eq!(lyra_type_name("time", "time"), "TfTime::Time");
        assert_eq!(lyra_type_name("x", "other_kind"), "TfX::OtherKind");
    }

    fn attr(name: &str, ty: &str, f: impl FnOnce(&mut Attribute)) -> Attribute {
        let mut a = Attribute {
            name: name.to_owned(),
            r#type: ty.as_bytes().to_vec(),
            ..Default::default()
        };
        f(&mut a);
        a
    }

    fn block() -> Block {
        Block {
            attributes: vec![
                attr("id", "\"string\"", |a| a.computed = true),
                attr("name", "\"string\"", |a| a.required = true),
                attr("zone", "\"string\"", |a| {
                    a.optional = true;
                    a.computed = true;
                }),
                attr("password", "\"string\"", |a| {
                    a.optional = true;
                    a.sensitive = true;
                }),
                attr("tags", "[\"map\",\"string\"]", |a| a.optional = true),
            ],
            block_types: vec![NestedBlock {
                type_name: "rule".to_owned(),
                nesting: nested_block::NestingMode::List as i32,
                block: Some(Block {
                    attributes: vec![attr("port", "\"number\"", |a| a.required = true)],
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn attributes_keep_their_flags() {
        let t = TypeInfo::new("x", "x_thing", 1, &block()).unwrap();
        assert_eq!(t.schema.name, "TfX::Thing");
        let a = |n: &str| t.schema.attribute(n).unwrap().clone();
        assert!(a("id").computed);
        assert!(a("name").required);
        assert!(a("zone").provided && !a("zone").computed);
        assert!(a("password").sensitive);
        assert_eq!(a("tags").ty, Type::hash(Type::String, Type::String));
        assert!(matches!(a("rule").ty, Type::Array(_)));
    }

    #[test]
    fn config_and_proposed_state_follow_terraform() {
        let t = TypeInfo::new("x", "x_thing", 1, &block()).unwrap();
        let desired = json!({"name": "a", "id": "ignored", "rule": {"port": 80}});
        let config = t.block.config(desired.as_object().unwrap());
        assert_eq!(
            config,
            json!({"id": null, "name": "a", "zone": null, "password": null, "tags": null, "rule": [{"port": 80}]})
        );
        let prior = json!({"id": "i-1", "zone": "z1", "name": "old"});
        let proposed = t.block.proposed(prior.as_object(), &config);
        assert_eq!(proposed["id"], "i-1");
        assert_eq!(proposed["zone"], "z1");
        assert_eq!(proposed["name"], "a");
        let none = t.block.config(&Map::new());
        assert_eq!(none["rule"], json!([]));
        // The value encodes with the block's type.
        crate::cty::encode(&proposed, &t.block.ty).unwrap();
    }
}
