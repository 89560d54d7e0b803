//! Colour: plans are coloured on terminals only. Tests cannot own a terminal, so they force
//! colour with CLICOLOR_FORCE=1 (what a terminal would get) and check that NO_COLOR and
//! --no-color win over it, and that pipes and JSON never carry escape codes.

use integration_tests::Lyra;

const PAIR: &str = "\
steps:
  one:
    returns: {x: output}
    resource: Null::Resource
    value:
      input: a
  two:
    resource: Null::Resource
    value:
      input: $x
";

const ESC: char = '\u{1b}';

#[test]
fn plans_are_coloured_only_where_colour_is_wanted() {
    let lyra = Lyra::new();
    lyra.write_workflow("pair", PAIR);

    let piped = lyra.ok(&["plan", "pair"]);
    assert!(
        piped.stdout.contains("  + one (Null::Resource) will be created"),
        "{piped}"
    );
    assert!(!piped.stdout.contains(ESC), "a pipe gets no colour: {piped}");

    let forced = Lyra::new().with_env("CLICOLOR_FORCE", "1");
    forced.write_workflow("pair", PAIR);
    let coloured = forced.ok(&["plan", "pair"]);
    assert!(
        coloured
            .stdout
            .contains("\u{1b}[32m+\u{1b}[0m one (Null::Resource) will be created"),
        "{coloured}"
    );
    let json = forced.ok(&["plan", "pair", "-o", "json"]);
    assert!(!json.stdout.contains(ESC), "JSON is never coloured: {json}");
    json.json();
    // The colours are all there is to strip: the text is the same.
    let stripped: String = coloured
        .stdout
        .split(ESC)
        .enumerate()
        .map(|(i, part)| {
            if i == 0 {
                part
            } else {
                part.split_once('m').map_or(part, |(_, rest)| rest)
            }
        })
        .collect();
    assert_eq!(stripped, piped.stdout);

    let no_flag = forced.ok(&["plan", "pair", "--no-color"]);
    assert!(!no_flag.stdout.contains(ESC), "--no-color wins: {no_flag}");
    assert_eq!(no_flag.stdout, piped.stdout);
    let no_env = Lyra::new().with_env("CLICOLOR_FORCE", "1").with_env("NO_COLOR", "1");
    no_env.write_workflow("pair", PAIR);
    let plain = no_env.ok(&["plan", "pair"]);
    assert!(!plain.stdout.contains(ESC), "NO_COLOR wins: {plain}");
}

#[test]
fn text_the_user_wrote_is_never_stripped() {
    // `lyra fmt -` prints the user's own YAML: an escape character in a quoted scalar stays.
    let lyra = Lyra::new().with_env("CLICOLOR_FORCE", "1");
    let input = "a: \"x\u{1b}[31my\"\n";
    let mut cmd = lyra.command(&["fmt", "-"]);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn lyra");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), input.as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("lyra fmt");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8(out.stdout).expect("utf-8"), input);
}
