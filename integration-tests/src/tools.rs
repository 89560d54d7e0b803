//! The test tools `.ci/tools` installs outside the checkout (helm 3 and 4 from npm,
//! kubernetes-validate, yamllint, grpcio and grpcio-tools from PyPI): found in `$LYRA_TOOLS/bin`, default
//! `~/.cache/lyra-ci/bin`. A missing tool skips the test with a message, except under
//! `CI=true`, where it fails it.

use std::path::PathBuf;

/// Where `.ci/tools` puts the tools.
pub fn tools_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LYRA_TOOLS") {
        return PathBuf::from(dir).join("bin");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("lyra-ci").join("bin")
}

/// The tool `name` (`helm3`, `helm4`, `kubernetes-validate`, `yamllint`, `python-grpc`: a
/// Python with grpcio and grpcio-tools), or `None` after
/// saying why the test `test` is skipped.
pub fn tool_or_skip(test: &str, name: &str) -> Option<PathBuf> {
    let path = tools_dir().join(name);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        !crate::in_ci(),
        "CI=true but {} is missing: run .ci/tools (or set LYRA_TOOLS)",
        path.display()
    );
    eprintln!("{test}: skipped: {} is missing (run .ci/tools)", path.display());
    None
}

/// Every tool in `names`, or `None` when one is missing (see [`tool_or_skip`]).
pub fn tools_or_skip<const N: usize>(test: &str, names: [&str; N]) -> Option<[PathBuf; N]> {
    let mut found = Vec::with_capacity(N);
    for name in names {
        found.push(tool_or_skip(test, name)?);
    }
    found.try_into().ok()
}
