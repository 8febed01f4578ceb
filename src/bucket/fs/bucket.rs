//! [`FsBucket`] as a [`crate::bucket::Bucket`]: each call on the blocking pool, through `Inner`.

#[allow(unused_imports)]
use super::*;

#[async_trait::async_trait]
impl crate::bucket::Bucket for FsBucket {
    fn url(&self) -> String {
        format!("file://{}", self.inner.root.display())
    }

    /// Another existing directory (`file:///path`), opened as this one was (its links rule,
    /// its modes) and creating nothing in it: a branch manifest names it, and a restore that
    /// only reads must not plant `.tmp/` or `.lock` in whatever directory a manifest names.
    /// Writes need the `.tmp/` a bucket directory has (`FsBucket::open` makes one). A missing
    /// directory is `NotFound`.
    fn sibling(&self, url: &str) -> Result<crate::bucket::DynBucket, BucketError> {
        let refused = |why: &str| crate::bucket::sibling_refused(&self.url(), url, why);
        let path = match crate::bucket::url::parse(url) {
            Ok(crate::bucket::url::DestinationUrl::File(p)) => p,
            Ok(_) => return Err(refused("not a file:// URL")),
            Err(e) => return Err(refused(&e.to_string())),
        };
        let mut b = match FsBucket::open_existing_rooted(Path::new(&path), self.inner.root_link) {
            Ok(b) => b,
            // A prefix that is not there holds no object.
            Err(OpenError::Missing { .. }) => return Err(BucketError::not_found(url)),
            Err(e) => return Err(refused(&e.to_string())),
        };
        if let Some(inner) = Arc::get_mut(&mut b.inner) {
            inner.modes = self.inner.modes;
        }
        Ok(std::sync::Arc::new(b))
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        check_key("get", key)?;
        let k = key.to_string();
        self.blocking("get", key, move |b| b.get(&k, at_most)).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        check_key("get_range", key)?;
        let k = key.to_string();
        self.blocking("get_range", key, move |b| b.get_range(&k, range))
            .await
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        check_key("head", key)?;
        let k = key.to_string();
        self.blocking("head", key, move |b| b.head(&k)).await
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        check_key("put", key)?;
        if opts.retain.is_some() {
            return Err(crate::bucket::lock_refused("a local directory", key));
        }
        let k = key.to_string();
        self.blocking("put", key, move |b| b.put(&k, &body, &opts))
            .await
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        check_key("delete", key)?;
        let k = key.to_string();
        let if_match = if_match.map(str::to_string);
        self.blocking("delete", key, move |b| b.delete(&k, if_match.as_deref()))
            .await
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        let (p, max_keys) = (query.prefix.to_string(), query.max_keys);
        let after = query.after().map(str::to_string);
        self.blocking("list", query.prefix, move |b| {
            b.list(&p, after.as_deref(), max_keys)
        })
        .await
    }
}
