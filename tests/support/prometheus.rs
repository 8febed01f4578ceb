//! A strict parser of the Prometheus text exposition format, for the tests that scrape
//! `/metrics`: HELP and TYPE at most once a family and before its samples, valid names, labels
//! and values. Include with `#[path = "support/prometheus.rs"] mod prometheus;`.
#![allow(dead_code)]

use std::collections::BTreeMap;

/// One metric family of a scrape.
#[derive(Debug, Default)]
pub struct Family {
    pub help: Option<String>,
    pub kind: Option<String>,
    pub samples: Vec<Sample>,
}

#[derive(Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `k="v",…}` (after the `{`): the labels and what follows the `}`.
fn parse_labels(mut s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((labels, rest));
        }
        let (key, rest) = s.split_once('=').ok_or("label without =")?;
        if !valid_name(key) || key.contains(':') {
            return Err(format!("bad label name {key:?}"));
        }
        let mut rest = rest
            .strip_prefix('"')
            .ok_or("label value not quoted")?
            .chars();
        let mut value = String::new();
        loop {
            match rest.next().ok_or("unterminated label value")? {
                '"' => break,
                '\\' => match rest.next().ok_or("dangling escape")? {
                    'n' => value.push('\n'),
                    c @ ('\\' | '"') => value.push(c),
                    c => return Err(format!("bad escape \\{c}")),
                },
                c => value.push(c),
            }
        }
        if labels.insert(key.to_string(), value).is_some() {
            return Err(format!("label {key} twice"));
        }
        s = rest.as_str().trim_start();
        s = s.strip_prefix(',').unwrap_or(s);
    }
}

/// Parses the Prometheus text format strictly enough to catch a broken exposition: HELP and
/// TYPE at most once a family and before its samples, valid names, labels and values.
pub fn parse_prometheus(text: &str) -> Result<BTreeMap<String, Family>, String> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let err = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let f = families.entry(name.to_string()).or_default();
            if !valid_name(name) || f.help.is_some() || !f.samples.is_empty() {
                return Err(err("bad or repeated HELP".into()));
            }
            f.help = Some(help.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| err("TYPE without a type".into()))?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(err(format!("unknown type {kind}")));
            }
            let f = families.entry(name.to_string()).or_default();
            if !valid_name(name) || f.kind.is_some() || !f.samples.is_empty() {
                return Err(err("bad or repeated TYPE".into()));
            }
            f.kind = Some(kind.to_string());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| err("sample without value".into()))?;
        let name = &line[..name_end];
        if !valid_name(name) {
            return Err(err(format!("bad metric name {name:?}")));
        }
        let (labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(l) => parse_labels(l).map_err(err)?,
            None => (BTreeMap::new(), &line[name_end..]),
        };
        let mut fields = rest.split_whitespace();
        let value = fields.next().ok_or_else(|| err("no value".into()))?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse::<f64>()
                .map_err(|e| err(format!("bad value {v}: {e}")))?,
        };
        if let Some(ts) = fields.next() {
            ts.parse::<i64>()
                .map_err(|e| err(format!("bad timestamp: {e}")))?;
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                let base = name.strip_suffix(suffix)?;
                families
                    .get(base)
                    .is_some_and(|f| matches!(f.kind.as_deref(), Some("histogram" | "summary")))
                    .then_some(base)
            })
            .or_else(|| {
                // A counter's `_total` sample under its base name's TYPE line.
                let base = name.strip_suffix("_total")?;
                families
                    .get(base)
                    .is_some_and(|f| f.kind.as_deref() == Some("counter"))
                    .then_some(base)
            })
            .unwrap_or(name);
        let f = families.entry(family.to_string()).or_default();
        if f.kind.is_none() {
            return Err(err("sample before its TYPE".into()));
        }
        f.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(families)
}

/// Every sample of a scrape, whatever its family.
pub fn samples(families: &BTreeMap<String, Family>) -> impl Iterator<Item = &Sample> {
    families.values().flat_map(|f| f.samples.iter())
}
