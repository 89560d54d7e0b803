use serde_json::json;

use super::*;
use crate::test_support::map;

fn pw() -> OpContext<'static> {
    crate::test_support::cx(PASSWORD)
}

fn id_cx() -> OpContext<'static> {
    crate::test_support::cx(ID)
}

fn result(m: &Map) -> String {
    m["result"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_password_is_kept_on_read_and_update_and_differs_between_creates() {
    let p = RandomProvider::new();
    let desired = map(json!({"length": 24, "keepers": {"v": 1}}));
    let created = p.create(&pw(), &desired).await.unwrap();
    let value = result(&created.actual);
    assert_eq!(value.chars().count(), 24);
    assert_eq!(created.actual["keepers"], json!({"v": 1}));
    let read = p
        .read(&pw(), &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, created.actual);
    let updated = p.update(&pw(), &created.external_id, &desired, &read).await.unwrap();
    assert_eq!(result(&updated), value);
    let again = p.create(&pw(), &desired).await.unwrap();
    assert_ne!(result(&again.actual), value);
    assert_ne!(again.external_id, created.external_id);

    p.delete(&pw(), &created.external_id, &read).await.unwrap();
    p.delete(&pw(), &created.external_id, &read).await.unwrap();
    assert_eq!(p.read(&pw(), &created.external_id, None).await.unwrap(), None);
    assert!(matches!(p.lookup(&pw(), &desired).await.unwrap(), Lookup::Absent));
}

#[tokio::test]
async fn passwords_respect_classes_and_minimums() {
    let p = RandomProvider::new();
    for _ in 0..20 {
        let desired =
            map(json!({"length": 12, "min_upper": 3, "min_numeric": 4, "min_special": 2, "override_special": "#%"}));
        let v = result(&p.create(&pw(), &desired).await.unwrap().actual);
        assert_eq!(v.len(), 12);
        assert!(v.chars().filter(char::is_ascii_uppercase).count() >= 3, "{v}");
        assert!(v.chars().filter(char::is_ascii_digit).count() >= 4, "{v}");
        assert!(v.chars().filter(|c| "#%".contains(*c)).count() >= 2, "{v}");
        assert!(v.chars().all(|c| c.is_ascii_alphanumeric() || "#%".contains(c)), "{v}");

        let digits = map(json!({"length": 30, "special": false, "upper": false, "lower": false}));
        let v = result(&p.create(&pw(), &digits).await.unwrap().actual);
        assert!(v.len() == 30 && v.chars().all(|c| c.is_ascii_digit()), "{v}");

        let no_special = map(json!({"length": 64, "special": false}));
        let v = result(&p.create(&pw(), &no_special).await.unwrap().actual);
        assert!(v.chars().all(|c| c.is_ascii_alphanumeric()), "{v}");
    }
    // Over many characters every enabled class shows up (a missed class would be a bug).
    let v = result(&p.create(&pw(), &map(json!({"length": 400}))).await.unwrap().actual);
    for set in [LOWER, UPPER, NUMERIC, SPECIAL] {
        assert!(v.chars().any(|c| set.contains(c)), "{set} in {v}");
    }
}

#[tokio::test]
async fn impossible_passwords_are_invalid_values() {
    let p = RandomProvider::new();
    for (desired, attribute) in [
        (json!({"length": 3, "min_upper": 2, "min_lower": 2}), "length"),
        (json!({"length": 8, "upper": false, "min_upper": 1}), "min_upper"),
        (
            json!({"length": 8, "lower": false, "upper": false, "numeric": false, "special": false}),
            "length",
        ),
        (json!({"length": 0}), "length"),
        (json!({"length": 100_000}), "length"),
        (json!({"length": "many"}), "length"),
        (json!({}), "length"),
        (json!({"length": 8, "special": "yes"}), "special"),
        (
            json!({"length": 8, "override_special": "", "min_special": 1}),
            "min_special",
        ),
    ] {
        let err = p.create(&pw(), &map(desired.clone())).await.unwrap_err();
        assert!(
            matches!(&err, ProviderError::InvalidValue { attribute: a, .. } if a == attribute),
            "{desired}: {err:?}"
        );
    }
}

#[test]
fn every_setting_is_immutable_and_the_result_secret() {
    let schemas = RandomProvider::new().schemas();
    for schema in &schemas {
        for a in &schema.attributes {
            assert!(a.computed || a.immutable, "{}.{}", schema.name, a.name);
            assert!(!a.doc.is_empty());
        }
    }
    assert!(schemas[0].is_secret("result"));
    assert!(!schemas[1].is_secret("hex"));
}

#[tokio::test]
async fn an_id_has_its_bytes_in_every_spelling_and_is_kept() {
    let p = RandomProvider::new();
    let desired = map(json!({"byte_length": 8, "prefix": "app-"}));
    let created = p.create(&id_cx(), &desired).await.unwrap();
    let a = &created.actual;
    let hex = a["hex"].as_str().unwrap().strip_prefix("app-").unwrap();
    let bytes = hex::decode(hex).unwrap();
    assert_eq!(bytes.len(), 8);
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    assert_eq!(created.external_id, b64.encode(&bytes));
    assert_eq!(a["b64_url"], json!(format!("app-{}", b64.encode(&bytes))));
    assert_eq!(
        a["b64_std"],
        json!(format!(
            "app-{}",
            base64::engine::general_purpose::STANDARD.encode(&bytes)
        ))
    );
    let n = u64::from_be_bytes(bytes.clone().try_into().unwrap());
    assert_eq!(a["dec"], json!(format!("app-{n}")));

    let read = p.read(&id_cx(), &created.external_id, Some(a)).await.unwrap().unwrap();
    assert_eq!(&read, a);
    assert_eq!(&p.update(&id_cx(), &created.external_id, &desired, a).await.unwrap(), a);
    let again = p.create(&id_cx(), &desired).await.unwrap();
    assert_ne!(again.actual["hex"], a["hex"]);
    assert!(matches!(p.lookup(&id_cx(), &desired).await.unwrap(), Lookup::Absent));
    let err = p.create(&id_cx(), &map(json!({"byte_length": 0}))).await.unwrap_err();
    assert!(matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "byte_length"));
}

#[test]
fn decimal_spells_big_integers() {
    assert_eq!(decimal(&[]), "0");
    assert_eq!(decimal(&[0, 0]), "0");
    assert_eq!(decimal(&[1, 0]), "256");
    assert_eq!(decimal(&[0xff; 8]), u64::MAX.to_string());
    // 2^128 - 1
    assert_eq!(decimal(&[0xff; 16]), u128::MAX.to_string());
}
