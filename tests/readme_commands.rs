//! Every `mushroom-backup` command the README and the pages of `docs/` show parses with the
//! real binary, so a wrong subcommand or flag cannot stay in them (`ctl register --store-dir`
//! did, for `--dir`).
//!
//! The commands are the lines of its code blocks that start with `mb ` or `$mb ` (what the
//! README names the binary) and its inline code spans that start with `mb ` or
//! `mushroom-backup `. Each is split as a shell would (quotes kept together, a `#` comment,
//! a redirection and what follows dropped; `[`, `]`, `|` of an optional or alternative
//! group and `…` placeholders ignored), then walked as clap walks it: a word that names a
//! subcommand in the current level's `--help` descends into it; a `--flag` (or `--flag=v`)
//! must be one of the current level's options (a flag of a parent level is not accepted after
//! a subcommand, as clap does not unless it is global), and one that takes a value takes the
//! next word. Whatever else is a positional argument. The listings come from the binary's
//! own `--help`, so the test follows the CLI as it changes.

mod support;

use std::collections::HashMap;
use std::process::Command;

/// One level of the CLI: its subcommands, and its options with whether each takes a value.
struct Level {
    subcommands: Vec<String>,
    options: HashMap<String, bool>,
}

/// The level at `path` (e.g. `["ctl", "register"]`), from `mushroom-backup PATH --help`;
/// `None` when there is no such subcommand.
fn level(path: &[String]) -> Option<Level> {
    let out = Command::new(support::binary::BIN)
        .args(path)
        .arg("--help")
        .output()
        .expect("run mushroom-backup --help");
    if !out.status.success() {
        return None;
    }
    let help = String::from_utf8(out.stdout).expect("UTF-8 help");
    let mut level = Level {
        subcommands: Vec::new(),
        options: HashMap::new(),
    };
    let mut in_commands = false;
    for line in help.lines() {
        if !line.starts_with(' ') {
            in_commands = line.starts_with("Commands:");
            continue;
        }
        let trimmed = line.trim_start();
        if in_commands {
            if let Some(name) = trimmed.split_whitespace().next() {
                level.subcommands.push(name.to_string());
            }
            continue;
        }
        // `  -s, --server <SERVER>  …` or `      --json  …`
        let spec = trimmed
            .strip_prefix('-')
            .and_then(|_| trimmed.split("  ").next())
            .unwrap_or("");
        for part in spec.split(", ") {
            let mut words = part.split_whitespace();
            if let Some(flag) = words.next().filter(|f| f.starts_with("--")) {
                let takes_value = words.next().is_some_and(|w| w.starts_with('<'));
                level.options.insert(flag.to_string(), takes_value);
            }
        }
    }
    Some(level)
}

/// The words of one command line as a shell splits them, up to a comment or a redirection.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, '#') if !in_word => break,
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    let end = out
        .iter()
        .position(|w| w.starts_with('>') || w.starts_with("2>") || w == "&&" || w == ";")
        .unwrap_or(out.len());
    out.truncate(end);
    out.into_iter()
        .map(|w| w.replace(['[', ']'], ""))
        .filter(|w| !w.is_empty() && w != "|" && !w.contains('…'))
        .collect()
}

/// Every command of the README, with the line it is on: `(line, words after the binary)`.
fn readme_commands(readme: &str) -> Vec<(usize, Vec<String>)> {
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut prose = String::new();
    let mut prose_lines = Vec::new();
    for (i, line) in readme.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            let line_words = words(line);
            if let Some(first) = line_words.first()
                && (first == "mb" || first == "$mb")
            {
                commands.push((i + 1, line_words[1..].to_vec()));
            }
        } else {
            prose_lines.extend(std::iter::repeat_n(i + 1, line.len() + 1));
            prose.push_str(line);
            prose.push('\n');
        }
    }
    // Inline spans may run over a line break.
    for (at, span) in prose
        .match_indices('`')
        .collect::<Vec<_>>()
        .chunks(2)
        .filter_map(|pair| {
            let [(open, _), (close, _)] = pair else {
                return None;
            };
            Some((*open, &prose[open + 1..*close]))
        })
    {
        let span = span.replace('\n', " ");
        for binary in ["mb ", "mushroom-backup "] {
            if let Some(rest) = span.strip_prefix(binary) {
                commands.push((prose_lines[at], words(rest)));
            }
        }
    }
    commands
}

/// What is wrong with `command` (the words after the binary), or `None`.
fn check(command: &[String], levels: &mut HashMap<Vec<String>, Option<Level>>) -> Option<String> {
    let mut path: Vec<String> = Vec::new();
    let mut words = command.iter();
    let mut positionals = 0;
    while let Some(word) = words.next() {
        let here = levels
            .entry(path.clone())
            .or_insert_with(|| level(&path))
            .as_ref()
            .expect("a level that was descended into exists");
        if let Some(flag) = word.strip_prefix("--") {
            let (name, inline_value) = match flag.split_once('=') {
                Some((name, _)) => (name, true),
                None => (flag, false),
            };
            let name = format!("--{name}");
            match here.options.get(&name) {
                None => {
                    return Some(format!(
                        "`{}` has no option {name}",
                        ["mushroom-backup"]
                            .into_iter()
                            .chain(path.iter().map(String::as_str))
                            .collect::<Vec<_>>()
                            .join(" ")
                    ));
                }
                Some(true) if !inline_value => {
                    words.next();
                }
                Some(_) => {}
            }
        } else if positionals == 0 && here.subcommands.iter().any(|s| s == word) {
            path.push(word.clone());
        } else if path.is_empty() {
            return Some(format!("mushroom-backup has no subcommand {word:?}"));
        } else {
            positionals += 1;
        }
    }
    if path.is_empty() {
        return Some("no subcommand".to_string());
    }
    None
}

/// The README and every page of `docs/` and its folders (the design notes of `docs/design/`),
/// by their paths from the repository's root.
fn manual() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec!["README.md".to_string()];
    let mut docs = Vec::new();
    for folder in ["docs", "docs/design"] {
        docs.extend(
            std::fs::read_dir(root.join(folder))
                .unwrap_or_else(|e| panic!("read {folder}/: {e}"))
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".md"))
                .map(|n| format!("{folder}/{n}")),
        );
    }
    docs.sort();
    pages.extend(docs);
    pages
        .into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(root.join(&p)).unwrap_or_else(|e| panic!("{p}: {e}"));
            (p, text)
        })
        .collect()
}

#[test]
fn every_command_in_the_readme_parses() {
    let commands: Vec<(String, usize, Vec<String>)> = manual()
        .into_iter()
        .flat_map(|(page, text)| {
            readme_commands(&text)
                .into_iter()
                .map(move |(line, c)| (page.clone(), line, c))
        })
        .collect();
    assert!(
        commands.len() >= 40,
        "only {} commands found in the README and docs/",
        commands.len()
    );
    let mut levels = HashMap::new();
    let wrong: Vec<String> = commands
        .iter()
        .filter_map(|(page, line, command)| {
            check(command, &mut levels)
                .map(|why| format!("{page}:{line}: mb {}: {why}", command.join(" ")))
        })
        .collect();
    eprintln!(
        "{} commands checked against {} levels of the CLI",
        commands.len(),
        levels.len()
    );
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

/// The checker itself: it finds a wrong flag, a flag of a parent level after a subcommand, and
/// a wrong subcommand, and passes a right command with a flag's value that looks like a
/// subcommand.
#[test]
fn the_checker_finds_wrong_flags_and_subcommands() {
    let mut levels = HashMap::new();
    let parse = |s: &str| words(s);
    let mut check_line = |s: &str| check(&parse(s), &mut levels);
    assert_eq!(
        check_line("ctl --server http://x register --dir /d --destination s3://b/p"),
        None
    );
    assert_eq!(check_line("ls --from health"), None);
    let wrong = check_line("ctl --server http://x register --store-dir /d --destination u");
    assert!(
        wrong
            .as_deref()
            .is_some_and(|w| w.contains("ctl register` has no option --store-dir")),
        "{wrong:?}"
    );
    let parent = check_line("ctl register --server http://x --dir /d");
    assert!(
        parent.is_some(),
        "a parent's flag after the subcommand passed"
    );
    let sub = check_line("lss --from s3://b/p");
    assert!(
        sub.as_deref().is_some_and(|w| w.contains("no subcommand")),
        "{sub:?}"
    );
    assert_eq!(
        parse(r#"ctl pause ID --reason "disk swap" [--for 2h | --until T]  # note"#),
        [
            "ctl",
            "pause",
            "ID",
            "--reason",
            "disk swap",
            "--for",
            "2h",
            "--until",
            "T"
        ]
    );
    assert_eq!(
        parse("key new --age > restore.age"),
        ["key", "new", "--age"]
    );
}

/// Inline spans over a line break and code-block lines are both found, with their lines.
#[test]
fn commands_are_found_in_blocks_and_in_spans() {
    let text = "a `mb ctl drill ID\n[--at SEQ]` b\n```sh\n$mb ls --from x   # c\nnot mb\n```\n";
    let found = readme_commands(text);
    assert_eq!(
        found,
        [
            (4, vec!["ls".to_string(), "--from".into(), "x".into()]),
            (
                1,
                vec![
                    "ctl".to_string(),
                    "drill".into(),
                    "ID".into(),
                    "--at".into(),
                    "SEQ".into()
                ]
            ),
        ]
    );
}

/// The README is a manual's front page, not a lab notebook (issue 41): at most 300 lines; and
/// each cell of `docs/benchmarks.md` is a figure, not its history: at most 300 characters.
#[test]
fn the_readme_stays_short_and_the_benchmark_cells_stay_figures() {
    let pages = manual();
    let (_, readme) = pages.iter().find(|(p, _)| p == "README.md").unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines: move detail into docs/"
    );
    let (_, bench) = pages
        .iter()
        .find(|(p, _)| p == "docs/benchmarks.md")
        .expect("docs/benchmarks.md");
    let long: Vec<String> = bench
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("| "))
        .flat_map(|(n, l)| {
            l.trim_matches('|')
                .split(" | ")
                .filter(|c| c.chars().count() > 300)
                .map(move |c| {
                    format!(
                        "line {}: {} characters: {}…",
                        n + 1,
                        c.chars().count(),
                        c.chars().take(60).collect::<String>()
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        long.is_empty(),
        "cells over 300 characters:\n{}",
        long.join("\n")
    );
}
