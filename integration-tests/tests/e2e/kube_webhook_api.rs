//! The emulator's validating admission webhooks and request audit, through raw HTTP: a TLS
//! webhook of the test's own (`integration_tests::webhook`) answers the reviews it sends.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use integration_tests::webhook::{Hook, response};
use kube_emulator::BlockingKubeEmulator;
use serde_json::{Value, json};

/// One HTTP exchange with the emulator: status code, `Warning` headers, body.
fn call(
    emu: &BlockingKubeEmulator,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &Value,
) -> (u16, Vec<String>, Value) {
    let host = emu.url().strip_prefix("http://").unwrap();
    let mut stream = TcpStream::connect(host).unwrap();
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let ct = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{auth}Content-Type: {ct}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    let warnings = head
        .lines()
        .filter_map(|l| l.strip_prefix("warning: "))
        .map(str::to_owned)
        .collect();
    (code, warnings, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn configure(emu: &BlockingKubeEmulator, name: &str, hooks: Value) {
    let path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
    let body = json!({"metadata": {"name": name}, "webhooks": hooks});
    let (code, _, out) = call(emu, "POST", path, None, &body);
    assert_eq!(code, 201, "{out}");
}

fn hook(name: &str, hook: &Hook, resources: &[&str], operations: &[&str], extra: Value) -> Value {
    let mut h = json!({
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "clientConfig": {"service": {"namespace": "default", "name": "hook", "path": "/validate"},
            "caBundle": hook.ca_bundle()},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": operations, "resources": resources}],
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        h[k] = v.clone();
    }
    h
}

/// The Service and Endpoints that route `hook.default.svc:443` to the local server.
fn route(emu: &BlockingKubeEmulator, port: u16) {
    let svc =
        json!({"metadata": {"name": "hook"}, "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}});
    assert_eq!(
        call(emu, "POST", "/api/v1/namespaces/default/services", None, &svc).0,
        201
    );
    let ep = json!({"metadata": {"name": "hook"}, "subsets": [{"addresses": [{"ip": "127.0.0.1"}],
        "ports": [{"name": "https", "port": port}]}]});
    assert_eq!(
        call(emu, "POST", "/api/v1/namespaces/default/endpoints", None, &ep).0,
        201
    );
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";

#[test]
fn a_validating_webhook_reviews_creates_updates_and_deletes() {
    let emu = BlockingKubeEmulator::start().unwrap();
    let server = Hook::start("hook.default.svc", |review| {
        let req = &review["request"];
        if req["object"]["data"]["bad"].is_string() {
            response(
                review,
                false,
                json!({"status": {"code": 403, "message": "bad is not allowed"}}),
            )
        } else {
            response(review, true, json!({"warnings": ["reviewed"]}))
        }
    });
    route(&emu, server.port);
    configure(
        &emu,
        "cms",
        json!([hook("cms.example.com", &server, &["configmaps"], &["*"], json!({}))]),
    );

    let denied = json!({"metadata": {"name": "denied"}, "data": {"bad": "1"}});
    let (code, _, out) = call(&emu, "POST", CMS, Some("alice"), &denied);
    assert_eq!(code, 403, "{out}");
    assert_eq!(
        out["message"],
        "admission webhook \"cms.example.com\" denied the request: bad is not allowed"
    );
    assert_eq!(call(&emu, "GET", &format!("{CMS}/denied"), None, &Value::Null).0, 404);

    let body = json!({"metadata": {"generateName": "ok-"}, "data": {"a": "1"}});
    let (code, warnings, created) = call(&emu, "POST", CMS, Some("alice"), &body);
    assert_eq!(code, 201, "{created}");
    assert_eq!(warnings, ["299 - \"reviewed\""]);
    let name = created["metadata"]["name"].as_str().unwrap().to_owned();
    let review = server.reviews().last().unwrap()["request"].clone();
    assert_eq!(review["operation"], "CREATE");
    assert_eq!(review["name"], name, "the webhook saw the generated name");
    assert_eq!(review["namespace"], "default");
    assert_eq!(review["userInfo"]["username"], "alice");
    assert_eq!(
        review["kind"],
        json!({"group": "", "version": "v1", "kind": "ConfigMap"})
    );
    assert_eq!(
        review["resource"],
        json!({"group": "", "version": "v1", "resource": "configmaps"})
    );
    assert_eq!(review["options"]["kind"], "CreateOptions");
    assert!(review["oldObject"].is_null());

    let patch = json!({"data": {"bad": "now"}});
    let (code, _, out) = call(&emu, "PATCH", &format!("{CMS}/{name}"), None, &patch);
    assert_eq!(code, 403, "{out}");
    let review = server.reviews().last().unwrap()["request"].clone();
    assert_eq!(review["operation"], "UPDATE");
    assert_eq!(review["userInfo"]["username"], "admin");
    assert_eq!(review["oldObject"]["data"], json!({"a": "1"}));
    assert_eq!(review["object"]["data"], json!({"a": "1", "bad": "now"}));

    let (code, _, _) = call(&emu, "DELETE", &format!("{CMS}/{name}"), None, &Value::Null);
    assert_eq!(code, 200);
    let review = server.reviews().last().unwrap()["request"].clone();
    assert_eq!(review["operation"], "DELETE");
    assert!(review["object"].is_null());
    assert_eq!(review["oldObject"]["metadata"]["name"], name);
    assert_eq!(review["options"]["kind"], "DeleteOptions");

    // The webhook configurations themselves are never reviewed.
    let before = server.reviews().len();
    let path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/cms";
    assert_eq!(call(&emu, "DELETE", path, None, &Value::Null).0, 200);
    assert_eq!(server.reviews().len(), before);
}

#[test]
fn failed_calls_fail_closed_or_open_as_their_policy_says() {
    let emu = BlockingKubeEmulator::start().unwrap();
    let slow = Hook::start("hook.default.svc", |review| {
        std::thread::sleep(Duration::from_secs(3));
        response(review, true, json!({}))
    });
    // A port nothing listens on.
    let down = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    route(&emu, down);
    configure(
        &emu,
        "down",
        json!([hook("down.example.com", &slow, &["configmaps"], &["CREATE"], json!({}))]),
    );
    let (code, _, out) = call(&emu, "POST", CMS, None, &json!({"metadata": {"name": "a"}}));
    assert_eq!(code, 500, "{out}");
    assert_eq!(out["reason"], "InternalError");
    let message = out["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "Internal error occurred: failed calling webhook \"down.example.com\": failed to call webhook: \
             Post \"https://hook.default.svc:443/validate?timeout=10s\": "
        ),
        "{message}"
    );
    assert!(message.contains("onnection refused"), "{message}");
    assert_eq!(call(&emu, "GET", &format!("{CMS}/a"), None, &Value::Null).0, 404);

    // The slow server behind the same Service, and a one-second timeout.
    let path = "/api/v1/namespaces/default/endpoints/hook";
    let ep =
        json!({"subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"name": "https", "port": slow.port}]}]});
    assert_eq!(call(&emu, "PATCH", path, None, &ep).0, 200);
    let hooks = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/down";
    let timeout = json!({"webhooks": [hook("down.example.com", &slow, &["configmaps"], &["CREATE"], json!({"timeoutSeconds": 1}))]});
    assert_eq!(call(&emu, "PATCH", hooks, None, &timeout).0, 200);
    let started = Instant::now();
    let (code, _, out) = call(&emu, "POST", CMS, None, &json!({"metadata": {"name": "b"}}));
    assert_eq!(code, 500, "{out}");
    assert!(
        started.elapsed() < Duration::from_millis(2900),
        "{:?}",
        started.elapsed()
    );
    assert!(
        out["message"]
            .as_str()
            .unwrap()
            .contains("?timeout=1s\": context deadline exceeded"),
        "{out}"
    );

    // Under Ignore the write goes through.
    let ignore = json!({"webhooks": [hook("down.example.com", &slow, &["configmaps"], &["CREATE"],
        json!({"timeoutSeconds": 1, "failurePolicy": "Ignore"}))]});
    assert_eq!(call(&emu, "PATCH", hooks, None, &ignore).0, 200);
    assert_eq!(
        call(&emu, "POST", CMS, None, &json!({"metadata": {"name": "c"}})).0,
        201
    );

    // A CA that did not sign the server's certificate: TLS fails.
    let other = Hook::start("hook.default.svc", |r| response(r, true, json!({})));
    let wrong_ca = json!({"webhooks": [hook("down.example.com", &other, &["configmaps"], &["CREATE"], json!({}))]});
    assert_eq!(call(&emu, "PATCH", hooks, None, &wrong_ca).0, 200);
    let (code, _, out) = call(&emu, "POST", CMS, None, &json!({"metadata": {"name": "d"}}));
    assert_eq!(code, 500, "{out}");
    assert!(out["message"].as_str().unwrap().contains("certificate"), "{out}");
}

#[test]
fn every_request_is_recorded_for_its_user() {
    let emu = BlockingKubeEmulator::start().unwrap();
    let sa = "system:serviceaccount:lyra-system:lyra";
    call(&emu, "GET", "/api/v1", Some(sa), &Value::Null);
    call(&emu, "POST", CMS, Some(sa), &json!({"metadata": {"name": "a"}}));
    call(
        &emu,
        "GET",
        &format!("{CMS}?watch=true&timeoutSeconds=1"),
        Some(sa),
        &Value::Null,
    );
    call(
        &emu,
        "PATCH",
        &format!("{CMS}/a"),
        Some(sa),
        &json!({"data": {"k": "v"}}),
    );
    call(
        &emu,
        "GET",
        "/api/v1/namespaces/lyra-system/secrets/missing",
        Some(sa),
        &Value::Null,
    );
    call(&emu, "DELETE", CMS, None, &Value::Null);
    let mine: Vec<(String, String, String, String, u16)> = emu
        .requests_by(sa)
        .into_iter()
        .filter(|r| r.is_resource_request())
        .map(|r| (r.verb, r.resource, r.namespace, r.name, r.code))
        .collect();
    let t = |v: &str, r: &str, ns: &str, n: &str, c: u16| (v.into(), r.into(), ns.into(), n.into(), c);
    assert_eq!(
        mine,
        [
            t("create", "configmaps", "default", "", 201),
            t("watch", "configmaps", "default", "", 200),
            t("patch", "configmaps", "default", "a", 200),
            t("get", "secrets", "lyra-system", "missing", 404),
        ]
    );
    let discovery = &emu.requests_by(sa)[0];
    assert!(!discovery.is_resource_request());
    assert_eq!(discovery.path, "/api/v1");
    let admin = emu.requests_by(kube_emulator::ANONYMOUS_ADMIN);
    assert_eq!(admin.last().unwrap().verb, "deletecollection");
    emu.clear_requests();
    assert!(emu.requests().is_empty());
}
