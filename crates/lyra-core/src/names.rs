//! What may name a deployment: the key of its state, shown in every message and history row,
//! and typed on command lines. One rule for every way a name arrives (`--name`, the
//! deployment arguments of `delete`, `state …` and `history`, names derived from a workflow
//! or a Kubernetes object), so a name one command accepts every other can find.

/// The longest deployment name, in bytes. The longest derived one, `k8s/<namespace>/<name>`,
/// is 4 + 63 + 1 + 253 = 321.
pub const MAX_DEPLOYMENT_NAME: usize = 512;

/// Whether `name` can name a deployment. Any printable text, except: empty, over
/// [`MAX_DEPLOYMENT_NAME`] bytes, control characters (a newline would forge lines of output),
/// spaces at either end, `\`, and `/` other than between non-empty segments that are not `.`
/// or `..` (`k8s/default/web` is fine; `/web`, `a//b`, `a/../b` are path tricks). `Err` says
/// why.
pub fn check_deployment_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".to_owned());
    }
    if name.len() > MAX_DEPLOYMENT_NAME {
        return Err(format!(
            "the name is {} bytes long; at most {MAX_DEPLOYMENT_NAME} are allowed",
            name.len()
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(format!("control character {c:?} is not allowed"));
    }
    if name.trim() != name {
        return Err("the name starts or ends with a space".to_owned());
    }
    if name.contains('\\') {
        return Err("'\\' is not allowed".to_owned());
    }
    for segment in name.split('/') {
        match segment {
            "" => {
                return Err("'/' only separates parts of a name (no leading, trailing or double '/')".to_owned());
            }
            "." | ".." => return Err(format!("'{segment}' is not allowed as a part between '/'")),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_names() {
        let longest_k8s = format!("k8s/{}/{}", "n".repeat(63), "o".repeat(253));
        for ok in [
            "web",
            "foober_iter",
            "team::web-v2",
            "k8s/default/web",
            "staging.eu",
            "Prod 2",
            "é",
            &longest_k8s,
            &"x".repeat(MAX_DEPLOYMENT_NAME),
        ] {
            assert_eq!(check_deployment_name(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("a\nb", "control character '\\n'"),
            ("a\u{7f}", "control character"),
            ("a\u{1b}[31m", "control character"),
            (" a", "space"),
            ("/etc/passwd", "'/' only separates"),
            ("a/", "'/' only separates"),
            ("a//b", "'/' only separates"),
            ("a/../b", "'..' is not allowed"),
            ("./a", "'.' is not allowed"),
            ("a\\b", "'\\'"),
        ] {
            let err = check_deployment_name(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        let err = check_deployment_name(&"x".repeat(MAX_DEPLOYMENT_NAME + 1)).unwrap_err();
        assert!(err.contains("513 bytes"), "{err}");
    }
}
