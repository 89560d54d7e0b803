use std::os::unix::fs::PermissionsExt as _;

use serde_json::json;

use super::*;
use crate::test_support::map;

fn cx() -> OpContext<'static> {
    crate::test_support::cx(FILE)
}

fn mode_of(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn lifecycle_create_read_update_drift_delete() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/conf.txt");
    let p = FileProvider::new(None);
    let desired = map(json!({"path": s(&path), "content": "hello\n", "directory_mode": "0700"}));
    let created = p.create(&cx(), &desired).await.unwrap();
    assert_eq!(created.external_id, s(&path));
    assert_eq!(fs::read_to_string(&path).unwrap(), "hello\n");
    assert_eq!(mode_of(&path), 0o644);
    assert_eq!(mode_of(&dir.path().join("a")), 0o700);
    assert_eq!(mode_of(&dir.path().join("a/b")), 0o700);
    assert_eq!(created.actual["sha256"], json!(sha256_hex(b"hello\n")));
    assert_eq!(created.actual["mode"], json!("0644"));

    // No drift: read gives back every attribute the workflow set, as set.
    let read = p
        .read(&cx(), &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, created.actual);

    // Update in place: new content and mode.
    let desired = map(json!({"path": s(&path), "content": "bye", "mode": "0600"}));
    let updated = p.update(&cx(), &created.external_id, &desired, &read).await.unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), "bye");
    assert_eq!(mode_of(&path), 0o600);
    assert_eq!(updated["mode"], json!("0600"));
    assert_eq!(updated["sha256"], json!(sha256_hex(b"bye")));

    // Only the mode changed: chmod, same bytes.
    let desired = map(json!({"path": s(&path), "content": "bye", "mode": "640"}));
    let updated = p.update(&cx(), &created.external_id, &desired, &updated).await.unwrap();
    assert_eq!(mode_of(&path), 0o640);
    assert_eq!(updated["mode"], json!("640"), "the workflow's spelling is kept");
    let read = p
        .read(&cx(), &created.external_id, Some(&updated))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read["mode"], json!("640"));

    // Drift: content and mode changed out of band are what read returns.
    fs::write(&path, "tampered").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
    let read = p
        .read(&cx(), &created.external_id, Some(&updated))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read["content"], json!("tampered"));
    assert_eq!(read["mode"], json!("0666"));
    assert_eq!(read["sha256"], json!(sha256_hex(b"tampered")));

    // No temporary files are left beside it.
    let names: Vec<_> = fs::read_dir(dir.path().join("a/b"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["conf.txt"]);

    // Delete; then gone, and deleting again is fine.
    p.delete(&cx(), &created.external_id, &read).await.unwrap();
    assert!(!path.exists());
    assert_eq!(p.read(&cx(), &created.external_id, Some(&read)).await.unwrap(), None);
    p.delete(&cx(), &created.external_id, &read).await.unwrap();
}

#[test]
fn path_is_immutable_and_required_and_sensitive_content_is_secret() {
    let schema = &FileProvider::new(None).schemas()[0];
    let path = schema.attribute("path").unwrap();
    assert!(path.immutable && path.required);
    assert!(!schema.attribute("content").unwrap().immutable);
    assert!(schema.is_secret("sensitive_content"));
    assert!(schema.attribute("sha256").unwrap().computed);
    assert!(schema.attributes.iter().all(|a| !a.doc.is_empty()));
}

#[tokio::test]
async fn sensitive_content_reads_back_under_its_own_name_and_stays_out_of_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    let p = FileProvider::new(None);
    let desired = map(json!({"path": s(&path), "sensitive_content": "hunter2"}));
    let created = p.create(&cx(), &desired).await.unwrap();
    fs::write(&path, "hunter3").unwrap();
    let read = p
        .read(&cx(), &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read["sensitive_content"], json!("hunter3"));
    assert!(!read.contains_key("content"), "{read:?}");

    let both = map(json!({"path": s(&path), "content": "x", "sensitive_content": "hunter2"}));
    let err = p.create(&cx(), &both).await.unwrap_err().to_string();
    assert!(err.contains("exactly one") && !err.contains("hunter2"), "{err}");
    let none = map(json!({"path": s(&path)}));
    assert!(matches!(
        p.create(&cx(), &none).await,
        Err(ProviderError::InvalidValue { .. })
    ));
    let bad = map(json!({"path": s(&path), "sensitive_content": ["hunter2"]}));
    let err = p.create(&cx(), &bad).await.unwrap_err().to_string();
    assert!(!err.contains("hunter2"), "{err}");
}

#[tokio::test]
async fn source_is_copied_and_reads_null_when_no_longer_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    fs::write(&src, [0u8, 159, 146, 150]).unwrap();
    let path = dir.path().join("copy.bin");
    let p = FileProvider::new(None);
    let desired = map(json!({"path": s(&path), "source": s(&src)}));
    let created = p.create(&cx(), &desired).await.unwrap();
    assert_eq!(fs::read(&path).unwrap(), [0u8, 159, 146, 150]);
    let read = p
        .read(&cx(), &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read["source"], json!(s(&src)));
    fs::write(&src, "changed").unwrap();
    let read = p
        .read(&cx(), &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read["source"], Value::Null);
    p.update(&cx(), &created.external_id, &desired, &read).await.unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), "changed");

    let missing = map(json!({"path": s(&path), "source": s(&dir.path().join("nope"))}));
    assert!(matches!(p.create(&cx(), &missing).await, Err(ProviderError::Other(_))));
}

#[tokio::test]
async fn lookup_finds_the_file_by_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let p = FileProvider::new(None);
    let desired = map(json!({"path": s(&path), "content": "v1"}));
    assert!(matches!(p.lookup(&cx(), &desired).await.unwrap(), Lookup::Absent));
    // A create whose result was lost.
    p.create(&cx(), &desired).await.unwrap();
    let Lookup::Found(found) = p.lookup(&cx(), &desired).await.unwrap() else {
        panic!("not found")
    };
    assert_eq!(found.external_id, s(&path));
    assert_eq!(found.actual["content"], json!("v1"));
    // Other content: found as it is, so the engine updates it.
    fs::write(&path, "other").unwrap();
    let Lookup::Found(found) = p.lookup(&cx(), &desired).await.unwrap() else {
        panic!("not found")
    };
    assert_eq!(found.actual["content"], json!("other"));
}

#[tokio::test]
async fn the_files_root_confines_paths() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let p = FileProvider::new(Some(root.path().to_owned()));

    let created = p
        .create(&cx(), &map(json!({"path": "sub/dir/f.txt", "content": "in"})))
        .await
        .unwrap();
    assert_eq!(fs::read_to_string(root.path().join("sub/dir/f.txt")).unwrap(), "in");
    assert_eq!(created.external_id, "sub/dir/f.txt");
    assert!(
        p.read(&cx(), "sub/dir/f.txt", Some(&created.actual))
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(p.read(&cx(), "missing/f.txt", None).await.unwrap(), None);

    let abs = s(&outside.path().join("x"));
    for (path, needle) in [(abs.as_str(), "absolute"), ("../x", "'..'"), ("sub/../../x", "'..'")] {
        let err = p
            .create(&cx(), &map(json!({"path": path, "content": "x"})))
            .await
            .unwrap_err();
        match &err {
            ProviderError::InvalidValue { attribute, message } => {
                assert_eq!(attribute, "path");
                assert!(message.contains(needle), "{message}");
            }
            other => panic!("{path}: {other:?}"),
        }
    }
    assert!(!outside.path().join("x").exists());

    // A link that leads out, as a directory on the way or as the file itself.
    std::os::unix::fs::symlink(outside.path(), root.path().join("out")).unwrap();
    let err = p
        .create(&cx(), &map(json!({"path": "out/new/f", "content": "x"})))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(!outside.path().join("new").exists(), "no directory made outside");
    fs::write(outside.path().join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link")).unwrap();
    let err = p.read(&cx(), "link", None).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "path"),
        "{err:?}"
    );
    let err = p
        .create(
            &cx(),
            &map(json!({"path": "f2", "source": s(&outside.path().join("secret"))})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "source"),
        "{err:?}"
    );
    // A link that stays inside is fine.
    std::os::unix::fs::symlink(root.path().join("sub"), root.path().join("inside")).unwrap();
    p.create(&cx(), &map(json!({"path": "inside/g", "content": "ok"})))
        .await
        .unwrap();
    assert_eq!(fs::read_to_string(root.path().join("sub/g")).unwrap(), "ok");
}

#[tokio::test]
async fn bad_modes_are_invalid_values() {
    let dir = tempfile::tempdir().unwrap();
    let p = FileProvider::new(None);
    for mode in ["rw-r--r--", "0999", "77777"] {
        let err = p
            .create(
                &cx(),
                &map(json!({"path": s(&dir.path().join("m")), "content": "", "mode": mode})),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "mode"),
            "{err:?}"
        );
    }
    assert!(!dir.path().join("m").exists());
}

#[test]
fn templates_render_placeholders_and_escapes() {
    let vars = map(json!({"user": "app", "port": 5432, "on": true}));
    assert_eq!(
        render("user=${user} port=${ port } on=${on} cost=$$5 lone=$x", &vars).unwrap(),
        "user=app port=5432 on=true cost=$5 lone=$x"
    );
    let e = render("pw=${password}", &vars).unwrap_err().to_string();
    assert!(e.contains("'${password}' has no value in vars"), "{e}");
    assert!(
        render("a=${user", &vars)
            .unwrap_err()
            .to_string()
            .contains("not closed")
    );
}

#[tokio::test]
async fn a_template_is_rendered_and_a_changed_file_reads_as_a_null_template() {
    let dir = tempfile::tempdir().unwrap();
    let p = FileProvider::new(None);
    let path = dir.path().join("app.ini");
    let desired = map(json!({
        "path": s(&path),
        "template": "[db]\nuser = ${user}\npassword = ${password}\n",
        "vars": {"user": "app", "password": "s3cr3t-pw"},
    }));
    let created = p.create(&cx(), &desired).await.unwrap();
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        "[db]\nuser = app\npassword = s3cr3t-pw\n"
    );
    let read = p
        .read(&cx(), &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read["template"], desired["template"], "no drift");
    assert_eq!(read["vars"], desired["vars"]);
    assert!(
        !read.contains_key("content"),
        "the rendered text (with its secret) is not read back"
    );

    fs::write(&path, "tampered").unwrap();
    let read = p
        .read(&cx(), &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read["template"], Value::Null, "drift shows as a changed template");
    p.update(&cx(), &created.external_id, &desired, &read).await.unwrap();
    assert!(fs::read_to_string(&path).unwrap().contains("user = app"));

    let both = map(json!({"path": s(&path), "template": "x", "content": "y"}));
    let e = p.create(&cx(), &both).await.unwrap_err().to_string();
    assert!(
        e.contains("exactly one of content, sensitive_content, source and template"),
        "{e}"
    );
}
