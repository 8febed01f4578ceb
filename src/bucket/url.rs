//! Destination URLs: `file:///abs/path` and `s3://bucket/prefix[?endpoint=…&region=…&profile=…]`.
//!
//! An S3 destination may name its own S3 configuration in its query, since a second copy often
//! lives with another provider or in another region: `endpoint` (an `http://` or `https://`
//! URL with a host, no user, password, path, query or fragment), `region` (letters, digits and
//! `-`) and `profile` (a named profile of the AWS shared config and credentials files: the
//! credentials come from the usual chain, or from that profile; never from the URL). Each key
//! at most once, none blank; any other key is refused naming it, as is a query on `file://`.
//! Values may be percent-encoded. An endpoint is kept as the URL parser writes it (scheme and
//! host lower-cased, a default port and a trailing `/` dropped), so two spellings of one query
//! are one [`S3Settings`] with one [`S3Settings::query`]: one S3 client and one lease root
//! (`crate::lease::instance`). What the query leaves out comes from the environment
//! (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_PROFILE`, …) as before.
//!
//! The query is never part of the bucket name, the prefix or any key: `s3://b/p?region=x` and
//! `s3://b/p` are one prefix in one bucket (on two configurations). Errors name the URL with
//! its query left off plus the key at fault, so nothing in a refused query is echoed.
//!
//! # What a crash leaves
//! Nothing: parsing only.

use super::OpenError;

/// The S3 configuration a destination names in its query; all `None` when it names none
/// (then every setting comes from the environment). Part of the key S3 clients are shared by
/// ([`super::s3::Clients`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct S3Settings {
    /// `http(s)://host[:port]`, normalised (scheme and host lower-cased, a default port and a
    /// trailing `/` dropped): two spellings of one endpoint are one setting.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub profile: Option<String>,
}

impl S3Settings {
    /// The query that names these settings (`?endpoint=…&…`), or `""` when there are none.
    pub fn query(&self) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("endpoint", &self.endpoint),
            ("region", &self.region),
            ("profile", &self.profile),
        ] {
            if let Some(v) = v {
                q.append_pair(k, v);
            }
        }
        let q = q.finish();
        if q.is_empty() { q } else { format!("?{q}") }
    }
}

/// A destination URL, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationUrl {
    /// A local directory acting as a bucket (an absolute path).
    File(String),
    /// An S3 bucket, a prefix (no leading or trailing `/`; empty for the bucket's root) and
    /// the configuration the query names.
    S3 {
        bucket: String,
        prefix: String,
        settings: S3Settings,
    },
}

/// The longest value a query key may have.
const MAX_VALUE_BYTES: usize = 512;

/// `url` without its query (what errors and keys name).
pub fn without_query(url: &str) -> &str {
    url.split_once('?').map_or(url, |(u, _)| u)
}

/// The endpoint a destination's requests go to, as the throttle's endpoint scope names it
/// ([`super::throttle`]): the query's `endpoint` (`http://127.0.0.1:9000`), `s3` for an `s3://`
/// destination on its configuration's default endpoint, `file` for a local directory, and
/// `unknown` for what does not parse (it is refused when opened).
pub fn endpoint_of(url: &str) -> String {
    match parse(url) {
        Ok(DestinationUrl::File(_)) => "file".into(),
        Ok(DestinationUrl::S3 { settings, .. }) => settings.endpoint.unwrap_or_else(|| "s3".into()),
        Err(_) => "unknown".into(),
    }
}

/// Parses `url`; see the module docs for what is refused.
pub fn parse(url: &str) -> Result<DestinationUrl, OpenError> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let bad = |reason: String| OpenError::BadUrl {
        url: base.to_string(),
        reason,
    };
    if let Some(path) = base.strip_prefix("file://") {
        if query.is_some() {
            return Err(bad(
                "a file:// destination takes no query (endpoint, region and profile are for \
                 s3:// destinations)"
                    .into(),
            ));
        }
        if !path.starts_with('/') {
            return Err(bad(
                "a file:// destination needs an absolute path (file:///path)".into(),
            ));
        }
        return Ok(DestinationUrl::File(path.to_string()));
    }
    let Some(rest) = base.strip_prefix("s3://") else {
        return Err(bad(
            "the destination must start with file:// or s3://".into()
        ));
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket name after s3://".into()));
    }
    let settings = match query {
        None => S3Settings::default(),
        Some(q) => settings(q).map_err(bad)?,
    };
    Ok(DestinationUrl::S3 {
        bucket: bucket.to_string(),
        prefix: prefix.trim_matches('/').to_string(),
        settings,
    })
}

/// The settings a query names, or why it is refused (never quoting a value: an endpoint with
/// a password in it must not be echoed).
fn settings(query: &str) -> Result<S3Settings, String> {
    let mut s = S3Settings::default();
    if query.is_empty() {
        return Err("an empty query after '?'".into());
    }
    for part in query.split('&') {
        let Some((k, _)) = part.split_once('=') else {
            return Err(format!(
                "query part {:?} is not key=value (keys: endpoint, region, profile)",
                short(part)
            ));
        };
        let (key, value) = url::form_urlencoded::parse(part.as_bytes())
            .next()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .unwrap_or_default();
        let slot = match key.as_str() {
            "endpoint" => &mut s.endpoint,
            "region" => &mut s.region,
            "profile" => &mut s.profile,
            _ => {
                return Err(format!(
                    "unknown query key {:?} (keys: endpoint, region, profile)",
                    short(k)
                ));
            }
        };
        if slot.is_some() {
            return Err(format!("query key {key} given twice"));
        }
        if value.trim().is_empty() {
            return Err(format!("query key {key} is blank"));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(format!(
                "query key {key} is longer than {MAX_VALUE_BYTES} bytes"
            ));
        }
        let checked = match key.as_str() {
            "endpoint" => endpoint(&value)?,
            "region" => name(&key, &value, |c| c.is_ascii_alphanumeric() || c == '-')?,
            _ => name(&key, &value, |c| {
                c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+' | '@')
            })?,
        };
        *slot = Some(checked);
    }
    Ok(s)
}

/// A region or profile name: only `allowed` characters.
fn name(key: &str, value: &str, allowed: impl Fn(char) -> bool) -> Result<String, String> {
    match value.chars().find(|c| !allowed(*c)) {
        None => Ok(value.to_string()),
        Some(c) => Err(format!("query key {key} holds the character {c:?}")),
    }
}

/// An endpoint as a destination's query names it, normalised as [`S3Settings::endpoint`] is
/// (for lists of allowed endpoints: `serve --allow-endpoint`), or why it is not one.
pub fn normal_endpoint(value: &str) -> Result<String, String> {
    endpoint(value)
}

/// An endpoint: `http(s)://host[:port]` and nothing else (no credentials in it, ever).
fn endpoint(value: &str) -> Result<String, String> {
    let e = |why: &str| Err(format!("query key endpoint: {why}"));
    let Ok(u) = url::Url::parse(value) else {
        return e("not a URL (http://host:port or https://host)");
    };
    if !matches!(u.scheme(), "http" | "https") {
        return e("the scheme must be http or https");
    }
    if u.host_str().is_none_or(str::is_empty) {
        return e("no host");
    }
    if !u.username().is_empty() || u.password().is_some() {
        return e(
            "must not hold a user or password (credentials come from the environment or a \
             profile)",
        );
    }
    if u.path() != "/" || u.query().is_some() || u.fragment().is_some() {
        return e("must be only scheme, host and port");
    }
    // As the URL parser writes it (scheme and host lower-cased, a default port dropped), so
    // that two spellings of one endpoint are one setting: one S3 client, one lease root.
    Ok(u.as_str().trim_end_matches('/').to_string())
}

/// At most 40 characters of what a refusal quotes.
fn short(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(url: &str) -> (String, String, S3Settings) {
        match parse(url).unwrap() {
            DestinationUrl::S3 {
                bucket,
                prefix,
                settings,
            } => (bucket, prefix, settings),
            other => panic!("{other:?}"),
        }
    }

    fn refusal(url: &str) -> String {
        parse(url).unwrap_err().to_string()
    }

    #[test]
    fn a_query_names_endpoint_region_and_profile_and_never_the_prefix() {
        let (b, p, s) = s3("s3://bkt/a/b/?endpoint=http://127.0.0.1:9000&region=eu-west-3");
        assert_eq!((b.as_str(), p.as_str()), ("bkt", "a/b"));
        assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(s.region.as_deref(), Some("eu-west-3"));
        assert_eq!(s.profile, None);
        let (_, p, s) = s3("s3://bkt?profile=replica_1&endpoint=https%3A%2F%2Fs3.example.com%2F");
        assert_eq!(p, "");
        assert_eq!(s.endpoint.as_deref(), Some("https://s3.example.com"));
        assert_eq!(s.profile.as_deref(), Some("replica_1"));
        assert_eq!(s3("s3://bkt/p").2, S3Settings::default());
        // The query round-trips.
        let q = s.query();
        assert_eq!(s3(&format!("s3://bkt{q}")).2, s);
        assert_eq!(S3Settings::default().query(), "");
    }

    #[test]
    fn bad_queries_are_refused_naming_the_key_and_never_echoing_a_secret() {
        for (url, says) in [
            ("file:///x?region=r", "takes no query"),
            ("s3://b/p?", "empty query"),
            ("s3://b/p?regoin=r", "unknown query key \"regoin\""),
            ("s3://b/p?region", "not key=value"),
            ("s3://b/p?region=", "region is blank"),
            ("s3://b/p?region=%20", "region is blank"),
            ("s3://b/p?region=a&region=b", "region given twice"),
            ("s3://b/p?region=a/b", "region holds the character '/'"),
            ("s3://b/p?profile=a b", "profile holds"),
            ("s3://b/p?endpoint=localhost:9000", "endpoint"),
            ("s3://b/p?endpoint=ftp://h", "scheme must be http"),
            (
                "s3://b/p?endpoint=http://h/path",
                "only scheme, host and port",
            ),
            (
                "s3://b/p?endpoint=http://u:s3cr3t@h:1",
                "must not hold a user",
            ),
            ("s3://?region=r", "no bucket name"),
            ("http://b/p", "must start with file:// or s3://"),
        ] {
            let msg = refusal(url);
            assert!(msg.contains(says), "{url}: {msg}");
            assert!(!msg.contains("s3cr3t"), "{url}: {msg}");
        }
        let long = format!("s3://b?profile={}", "p".repeat(MAX_VALUE_BYTES + 1));
        assert!(refusal(&long).contains("longer than"));
    }

    /// Two spellings of one query (keys in another order, an endpoint with a trailing `/`, a
    /// default port or capitals) are one set of settings, with one [`S3Settings::query`].
    #[test]
    fn spellings_of_one_query_are_one_setting() {
        let one = s3("s3://b/x?endpoint=http://h:9000&region=r").2;
        for other in [
            "s3://b/y?region=r&endpoint=http://h:9000",
            "s3://b/y?region=r&endpoint=http://h:9000/",
            "s3://b?endpoint=HTTP://H:9000&region=r",
        ] {
            let s = s3(other).2;
            assert_eq!(s, one, "{other}");
            assert_eq!(s.query(), one.query(), "{other}");
        }
        assert_eq!(
            s3("s3://b?endpoint=https://h:443/").2.endpoint.as_deref(),
            Some("https://h")
        );
    }

    #[test]
    fn without_query_is_the_url_before_the_question_mark() {
        assert_eq!(without_query("s3://b/p?region=r"), "s3://b/p");
        assert_eq!(without_query("file:///x"), "file:///x");
    }
}
