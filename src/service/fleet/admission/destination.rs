//! Destinations clients send: their shape, where a `file://` one may be, and when two overlap.
//!
//! A destination is `s3://bucket/prefix` or `file:///absolute/path`, at most
//! [`MAX_DESTINATION_BYTES`](super::limits::MAX_DESTINATION_BYTES) with no control character.
//! It is read the way `bucket::open_raw` reads it: an S3 prefix loses its trailing slashes and
//! keys are `prefix/key`, so two prefixes share keys exactly when one is the other or a
//! `/`-separated ancestor of it (an empty prefix is the whole bucket); a `file://` path is
//! resolved through symbolic links (its nearest existing ancestor, as store directories are),
//! so a link cannot make one directory look like two.
//!
//! A `file://` destination is the service's own disk, so it is placed: never overlapping (in,
//! equal to, or holding) an allowed store root or the service's data directory (backups must
//! not live among what they back up, nor beside the registry), and, when
//! `--allow-destination-root` is given, strictly under one of those roots. These are checked at
//! `Register` and `Adopt`; a store registered before a root was narrowed keeps its destination
//! (a warning at start says so).
//!
//! No destination may lie inside a lease root (a path component or prefix part
//! `.mushroom-backup`, [`crate::lease::instance::LEASE_DIR`]): the instance leases live there,
//! beside the stores' prefixes.

use std::path::{Component, Path, PathBuf};

use super::limits::{self, FieldError, MAX_DESTINATION_BYTES, quote};
use super::paths;

/// Why a destination is refused.
#[derive(Debug, thiserror::Error)]
pub enum DestinationError {
    /// Not a destination: the scheme, the path or the bucket name is wrong, or it is too long.
    #[error(transparent)]
    Bad(#[from] FieldError),
    /// A `file://` destination where the service may not write (see the module docs).
    #[error("{0}")]
    Placement(String),
}

/// A destination, normalized for comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A local directory acting as a bucket, resolved through links.
    File(PathBuf),
    /// An S3 bucket and the `/`-separated parts of the prefix (none: the whole bucket).
    S3 { bucket: String, prefix: Vec<String> },
}

/// Where `file://` destinations may and may not be (all resolved).
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    pub store_roots: &'a [PathBuf],
    pub data_dir: &'a Path,
    /// Empty: anywhere the other rules allow.
    pub destination_roots: &'a [PathBuf],
    /// The endpoints an `s3://` destination may name (`?endpoint=`), normalised: the
    /// service's own (`AWS_ENDPOINT_URL`) and each `--allow-endpoint`. Any other is refused:
    /// the service would send requests signed with its credentials to any host a client names.
    pub endpoints: &'a [String],
}

impl Destination {
    /// Parses and normalizes `raw` (shape and bounds only; see [`check`] for placement).
    pub fn parse(raw: &str) -> Result<Destination, DestinationError> {
        Self::parse_with(raw, true)
    }

    /// Parses a destination the registry holds: recorded after [`Destination::url`], so its
    /// path is taken as it stands (no look at the filesystem per registered store).
    pub fn recorded(raw: &str) -> Result<Destination, DestinationError> {
        Self::parse_with(raw, false)
    }

    fn parse_with(raw: &str, resolve: bool) -> Result<Destination, DestinationError> {
        limits::check_text("destination", raw, MAX_DESTINATION_BYTES)?;
        let bad = |why: &str| {
            DestinationError::Bad(FieldError(format!("destination {}: {why}", quote(raw))))
        };
        if let Some(path) = raw.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(bad(
                    "a file:// destination needs an absolute path (file:///path)",
                ));
            }
            let path = Path::new(path);
            if path.components().any(|c| matches!(c, Component::ParentDir)) {
                return Err(bad("must not contain '..'"));
            }
            if !resolve {
                return Ok(Destination::File(path.to_path_buf()));
            }
            let resolved = paths::resolve(path).map_err(|e| bad(&e.to_string()))?;
            Ok(Destination::File(resolved))
        } else if raw.starts_with("s3://") {
            // The query (endpoint, region, profile) is checked as a bucket opens it, and is no
            // part of the prefix: two stores on one bucket and prefix overlap whatever
            // endpoint each names (one bucket may be reached by two).
            let (bucket, prefix) = match crate::bucket::url::parse(raw) {
                Ok(crate::bucket::url::DestinationUrl::S3 { bucket, prefix, .. }) => {
                    (bucket, prefix)
                }
                Ok(_) => return Err(bad("the scheme must be file:// or s3://")),
                Err(crate::bucket::OpenError::BadUrl { reason, .. }) => return Err(bad(&reason)),
                Err(e) => return Err(bad(&e.to_string())),
            };
            Ok(Destination::S3 {
                bucket,
                prefix: if prefix.is_empty() {
                    Vec::new()
                } else {
                    prefix.split('/').map(str::to_string).collect()
                },
            })
        } else {
            Err(bad("the scheme must be file:// or s3://"))
        }
    }

    /// Whether the two share any object: the same bucket (or filesystem) and one prefix equal
    /// to or inside the other.
    pub fn overlaps(&self, other: &Destination) -> bool {
        match (self, other) {
            (Destination::File(a), Destination::File(b)) => overlap(a, b),
            (
                Destination::S3 {
                    bucket: a,
                    prefix: pa,
                },
                Destination::S3 {
                    bucket: b,
                    prefix: pb,
                },
            ) => a == b && (pa.starts_with(pb) || pb.starts_with(pa)),
            _ => false,
        }
    }

    /// The URL to record: a `file://` destination as resolved, an S3 one as given.
    pub fn url(&self, raw: &str) -> String {
        match self {
            Destination::File(p) => format!("file://{}", p.display()),
            Destination::S3 { .. } => raw.to_string(),
        }
    }
}

/// Whether `a` and `b` are one directory or one holds the other.
fn overlap(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Parses `raw` and checks where it may be: see the module docs.
pub fn check(raw: &str, placement: Placement<'_>) -> Result<Destination, DestinationError> {
    let dest = Destination::parse(raw)?;
    let lease_dir = crate::lease::instance::LEASE_DIR;
    let in_lease_root = match &dest {
        Destination::File(path) => path.iter().any(|c| c == lease_dir),
        Destination::S3 { prefix, .. } => prefix.iter().any(|c| c == lease_dir),
    };
    if in_lease_root {
        return Err(DestinationError::Placement(format!(
            "destination {} is inside a lease root ({lease_dir}/): that is where instance \
             leases live, beside the stores' prefixes",
            quote(raw)
        )));
    }
    if let Ok(crate::bucket::url::DestinationUrl::S3 { settings, .. }) =
        crate::bucket::url::parse(raw)
        && let Some(endpoint) = &settings.endpoint
        && !placement.endpoints.contains(endpoint)
    {
        return Err(DestinationError::Placement(format!(
            "destination s3://…?endpoint={endpoint} names an endpoint this service does not \
             send requests to (allowed: {}): give it to `serve --allow-endpoint`, or leave the \
             endpoint out to use the service's own",
            match placement.endpoints.is_empty() {
                true => "none".to_string(),
                false => placement.endpoints.join(", "),
            }
        )));
    }
    if let Destination::File(path) = &dest {
        let denied = |why: String| {
            DestinationError::Placement(format!(
                "destination {} (resolved: {}) {why}",
                quote(raw),
                path.display()
            ))
        };
        for root in placement.store_roots {
            if overlap(path, root) {
                return Err(denied(format!(
                    "overlaps the allowed store root {}: backups must not live among the stores",
                    root.display()
                )));
            }
        }
        let data =
            paths::resolve(placement.data_dir).unwrap_or_else(|_| placement.data_dir.to_path_buf());
        if overlap(path, &data) {
            return Err(denied(format!(
                "overlaps the service's data directory {}",
                data.display()
            )));
        }
        let roots = placement.destination_roots;
        if !roots.is_empty() && !roots.iter().any(|r| path != r && path.starts_with(r)) {
            let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
            return Err(denied(format!(
                "is not under an allowed destination root ({})",
                roots.join(", ")
            )));
        }
    }
    Ok(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(raw: &str) -> Destination {
        Destination::parse(raw).unwrap()
    }

    #[test]
    fn shapes_are_checked() {
        assert!(Destination::parse("file:///x/y").is_ok());
        assert!(Destination::parse("s3://bucket/prefix").is_ok());
        for bad in [
            "ftp://x",
            "file://rel",
            "file:///a/../b",
            "s3:///nobucket",
            "s3://b/a\0b",
        ] {
            let e = Destination::parse(bad).unwrap_err();
            assert!(matches!(e, DestinationError::Bad(_)), "{bad}: {e}");
        }
    }

    #[test]
    fn s3_prefixes_overlap_by_parts() {
        let yes = [
            ("s3://b/a", "s3://b/a/"),
            ("s3://b/a", "s3://b/a/b"),
            ("s3://b", "s3://b/anything"),
            ("s3://b/", "s3://b/x/y"),
        ];
        for (a, b) in yes {
            assert!(s3(a).overlaps(&s3(b)) && s3(b).overlaps(&s3(a)), "{a} {b}");
        }
        let no = [
            ("s3://b/a", "s3://b/ab"),
            ("s3://b/a", "s3://c/a"),
            ("s3://b/a//x", "s3://b/a/x"),
            ("s3://b/x", "file:///x"),
        ];
        for (a, b) in no {
            assert!(!s3(a).overlaps(&s3(b)), "{a} {b}");
        }
    }

    #[test]
    fn file_destinations_are_placed() {
        let t = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(t.path()).unwrap();
        let roots = [base.join("stores")];
        let data = base.join("data");
        let dests = [base.join("backups")];
        let p = Placement {
            store_roots: &roots,
            data_dir: &data,
            destination_roots: &[],
            endpoints: &[],
        };
        let url = |p: &Path| format!("file://{}", p.display());
        let code = |r: Result<Destination, DestinationError>| match r {
            Ok(_) => "ok",
            Err(DestinationError::Placement(_)) => "denied",
            Err(DestinationError::Bad(_)) => "other",
        };
        assert_eq!(code(check(&url(&base.join("elsewhere")), p)), "ok");
        assert_eq!(code(check(&url(&base.join("stores/x")), p)), "denied");
        assert_eq!(code(check(&url(&base.join("stores")), p)), "denied");
        assert_eq!(code(check(&url(&base.join("data/b")), p)), "denied");
        assert_eq!(code(check(&url(&base), p)), "denied");
        let p = Placement {
            destination_roots: &dests,
            ..p
        };
        assert_eq!(code(check(&url(&base.join("backups/x")), p)), "ok");
        assert_eq!(code(check(&url(&base.join("backups")), p)), "denied");
        assert_eq!(code(check(&url(&base.join("elsewhere")), p)), "denied");
        std::fs::create_dir_all(base.join("backups")).unwrap();
        std::os::unix::fs::symlink(&base, base.join("backups/escape")).unwrap();
        assert_eq!(
            code(check(&url(&base.join("backups/escape/x")), p)),
            "denied"
        );
        assert_eq!(code(check("s3://bucket/p", p)), "ok");
    }

    /// Security review 4, finding 6: an endpoint a client names is one the operator allowed,
    /// in any spelling of it; any other host is refused before a request is signed for it.
    #[test]
    fn an_s3_destination_names_only_an_allowed_endpoint() {
        let allowed = ["http://minio.internal:9000".to_string()];
        let p = Placement {
            store_roots: &[],
            data_dir: Path::new("/var/lib/mb"),
            destination_roots: &[],
            endpoints: &allowed,
        };
        assert!(check("s3://b/p", p).is_ok());
        assert!(check("s3://b/p?endpoint=http://minio.internal:9000", p).is_ok());
        assert!(check("s3://b/p?endpoint=HTTP://Minio.Internal:9000/&region=r", p).is_ok());
        for other in [
            "s3://b/p?endpoint=http://attacker.example",
            "s3://b/p?endpoint=http://minio.internal:9001",
            "s3://b/p?endpoint=https://minio.internal:9000",
        ] {
            match check(other, p) {
                Err(DestinationError::Placement(why)) => {
                    assert!(why.contains("--allow-endpoint"), "{why}")
                }
                r => panic!("{other}: {r:?}"),
            }
        }
        let none = Placement {
            endpoints: &[],
            ..p
        };
        let why = check("s3://b/p?endpoint=http://minio.internal:9000", none).unwrap_err();
        assert!(why.to_string().contains("allowed: none"), "{why}");
    }
}
