//! Just enough Kubernetes protobuf to read what kubectl's generator commands
//! (`kubectl create namespace|configmap|secret|serviceaccount`) POST and what helm's release
//! storage sends (Secrets, and the `DeleteOptions` of their DELETE): they use the typed
//! client, which sends only `application/vnd.kubernetes.protobuf` and does not fall back to
//! JSON on 415. Everything else kubectl, helm and kube-rs send is JSON. Responses are always
//! JSON (those clients accept that).

use base64::Engine as _;
use serde_json::{Map, Value, json};

/// The four magic bytes before every Kubernetes protobuf body.
const MAGIC: &[u8] = b"k8s\0";

#[derive(Clone, Copy)]
enum Ty {
    Str,
    Bool,
    Int,
    Msg(&'static [Field]),
    MapStr,
    MapBytes,
}

struct Field {
    num: u64,
    name: &'static str,
    ty: Ty,
    repeated: bool,
}

const fn f(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        repeated: false,
    }
}

const fn rep(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        repeated: true,
    }
}

const OWNER_REFERENCE: &[Field] = &[
    f(1, "kind", Ty::Str),
    f(3, "name", Ty::Str),
    f(4, "uid", Ty::Str),
    f(5, "apiVersion", Ty::Str),
    f(6, "controller", Ty::Bool),
    f(7, "blockOwnerDeletion", Ty::Bool),
];

// Server-owned fields (uid, timestamps, managedFields) are not read: the server sets them.
// The resourceVersion is: it is an update's precondition (helm's PUT of a release Secret).
const OBJECT_META: &[Field] = &[
    f(1, "name", Ty::Str),
    f(2, "generateName", Ty::Str),
    f(3, "namespace", Ty::Str),
    f(6, "resourceVersion", Ty::Str),
    f(11, "labels", Ty::MapStr),
    f(12, "annotations", Ty::MapStr),
    rep(13, "ownerReferences", Ty::Msg(OWNER_REFERENCE)),
    rep(14, "finalizers", Ty::Str),
];

const CONFIG_MAP: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "data", Ty::MapStr),
    f(3, "binaryData", Ty::MapBytes),
    f(4, "immutable", Ty::Bool),
];

const SECRET: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "data", Ty::MapBytes),
    f(3, "type", Ty::Str),
    f(4, "stringData", Ty::MapStr),
    f(5, "immutable", Ty::Bool),
];

const NAMESPACE_SPEC: &[Field] = &[rep(1, "finalizers", Ty::Str)];

const NAMESPACE: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(NAMESPACE_SPEC)),
];

const OBJECT_REFERENCE: &[Field] = &[
    f(1, "kind", Ty::Str),
    f(2, "namespace", Ty::Str),
    f(3, "name", Ty::Str),
    f(4, "uid", Ty::Str),
    f(5, "apiVersion", Ty::Str),
];

const LOCAL_OBJECT_REFERENCE: &[Field] = &[f(1, "name", Ty::Str)];

const SERVICE_ACCOUNT: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    rep(2, "secrets", Ty::Msg(OBJECT_REFERENCE)),
    rep(3, "imagePullSecrets", Ty::Msg(LOCAL_OBJECT_REFERENCE)),
    f(4, "automountServiceAccountToken", Ty::Bool),
];

const PRECONDITIONS: &[Field] = &[f(1, "uid", Ty::Str), f(2, "resourceVersion", Ty::Str)];

/// What helm's typed client sends with a DELETE of its release Secrets.
const DELETE_OPTIONS: &[Field] = &[
    f(1, "gracePeriodSeconds", Ty::Int),
    f(2, "preconditions", Ty::Msg(PRECONDITIONS)),
    f(3, "orphanDependents", Ty::Bool),
    f(4, "propagationPolicy", Ty::Str),
    rep(5, "dryRun", Ty::Str),
];

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = usize::try_from(self.varint()?).map_err(|_| "length overflow")?;
        let end = self
            .pos
            .checked_add(len)
            .filter(|e| *e <= self.buf.len())
            .ok_or("truncated field")?;
        let b = &self.buf[self.pos..end];
        self.pos = end;
        Ok(b)
    }

    fn skip(&mut self, wire: u64) -> Result<(), String> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.advance(8),
            2 => self.bytes().map(drop),
            5 => self.advance(4),
            w => Err(format!("unsupported wire type {w}")),
        }
    }

    fn advance(&mut self, n: usize) -> Result<(), String> {
        if self.pos + n > self.buf.len() {
            return Err("truncated field".into());
        }
        self.pos += n;
        Ok(())
    }

    /// `(field number, wire type)` pairs until the end.
    fn next_field(&mut self) -> Result<Option<(u64, u64)>, String> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let tag = self.varint()?;
        Ok(Some((tag >> 3, tag & 7)))
    }
}

fn text(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "invalid UTF-8 in a string field".to_string())
}

fn map_entry(b: &[u8], bytes_value: bool) -> Result<(String, Value), String> {
    let mut r = Reader { buf: b, pos: 0 };
    let (mut key, mut value) = (String::new(), Value::String(String::new()));
    while let Some((num, wire)) = r.next_field()? {
        match (num, wire) {
            (1, 2) => key = text(r.bytes()?)?,
            (2, 2) if bytes_value => value = json!(base64::engine::general_purpose::STANDARD.encode(r.bytes()?)),
            (2, 2) => value = json!(text(r.bytes()?)?),
            (_, w) => r.skip(w)?,
        }
    }
    Ok((key, value))
}

fn message(b: &[u8], fields: &[Field]) -> Result<Value, String> {
    let mut r = Reader { buf: b, pos: 0 };
    let mut out = Map::new();
    while let Some((num, wire)) = r.next_field()? {
        let Some(field) = fields.iter().find(|f| f.num == num) else {
            r.skip(wire)?;
            continue;
        };
        let value = match (field.ty, wire) {
            (Ty::Str, 2) => json!(text(r.bytes()?)?),
            (Ty::Bool, 0) => json!(r.varint()? != 0),
            // int64 as a two's complement varint.
            (Ty::Int, 0) => json!(r.varint()? as i64),
            (Ty::Msg(inner), 2) => message(r.bytes()?, inner)?,
            (Ty::MapStr | Ty::MapBytes, 2) => {
                let (k, v) = map_entry(r.bytes()?, matches!(field.ty, Ty::MapBytes))?;
                out.entry(field.name).or_insert_with(|| json!({}))[k] = v;
                continue;
            }
            (_, w) => {
                r.skip(w)?;
                continue;
            }
        };
        if field.repeated {
            if let Value::Array(a) = out.entry(field.name).or_insert_with(|| json!([])) {
                a.push(value);
            }
        } else if value != json!("") {
            // Generated Go code writes empty strings too; JSON would omit them.
            out.insert(field.name.to_string(), value);
        }
    }
    Ok(Value::Object(out))
}

/// Decodes a protobuf-encoded built-in object into its JSON form.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let payload = body.strip_prefix(MAGIC).ok_or("not a Kubernetes protobuf body")?;
    let mut r = Reader { buf: payload, pos: 0 };
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    while let Some((num, wire)) = r.next_field()? {
        match (num, wire) {
            (1, 2) => {
                let type_meta = message(r.bytes()?, &[f(1, "apiVersion", Ty::Str), f(2, "kind", Ty::Str)])?;
                api_version = type_meta["apiVersion"].as_str().unwrap_or_default().to_string();
                kind = type_meta["kind"].as_str().unwrap_or_default().to_string();
            }
            (2, 2) => raw = r.bytes()?,
            (_, w) => r.skip(w)?,
        }
    }
    let fields = match (api_version.as_str(), kind.as_str()) {
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        // Options are encoded at `meta.k8s.io/v1` or at the group-version of the request.
        (_, "DeleteOptions") => DELETE_OPTIONS,
        _ => {
            return Err(format!(
                "protobuf bodies of {api_version} {kind} are not supported; send JSON"
            ));
        }
    };
    let mut obj = message(raw, fields)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![((num << 3) | 2) as u8, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn decodes_a_config_map() {
        let meta = [
            field(1, b"settings"),
            field(2, b""),
            field(11, &[field(1, b"app"), field(2, b"lyra")].concat()),
        ]
        .concat();
        let data = field(2, &[field(1, b"a"), field(2, b"1")].concat());
        let raw = [field(1, &meta), data].concat();
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &raw)].concat();
        let obj = decode(&body).unwrap();
        assert_eq!(
            obj,
            json!({"metadata": {"name": "settings", "labels": {"app": "lyra"}}, "data": {"a": "1"},
                "apiVersion": "v1", "kind": "ConfigMap"})
        );
    }

    #[test]
    fn decodes_helms_delete_options() {
        let preconditions = field(2, &field(1, b"u-1"));
        let raw = [preconditions, field(4, b"Background"), vec![(1 << 3), 5]].concat();
        let type_meta = [field(1, b"meta.k8s.io/v1"), field(2, b"DeleteOptions")].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &raw)].concat();
        let obj = decode(&body).unwrap();
        assert_eq!(obj["propagationPolicy"], "Background");
        assert_eq!(obj["preconditions"]["uid"], "u-1");
        assert_eq!(obj["gracePeriodSeconds"], 5);
    }
}
