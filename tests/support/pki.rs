//! A test certificate authority: a self-signed CA whose certificate is a PEM file, signing
//! leaf certificates (server, client, or both) into PEM files beside it. Keys are fresh on
//! every run and never leave the test's temp directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

pub use rcgen::ExtendedKeyUsagePurpose as Usage;

/// A CA writing into one directory.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA's certificate (PEM).
    pub pem: PathBuf,
    dir: PathBuf,
}

impl Ca {
    /// A new CA named `name` (its common name), its certificate written to `dir/file`
    /// (`dir` created if need be).
    pub fn new(dir: &Path, file: &str, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let pem = dir.join(file);
        std::fs::write(&pem, issuer.pem()).unwrap();
        Ca {
            issuer,
            pem,
            dir: dir.to_path_buf(),
        }
    }

    /// A certificate named `name` for the subject names `names` and the uses `usages`, signed
    /// by the CA, and its new key: written to `dir/<files.0>` and `dir/<files.1>`.
    pub fn leaf(
        &self,
        files: (&str, &str),
        names: &[&str],
        name: &str,
        usages: &[Usage],
    ) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = usages.to_vec();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (self.dir.join(files.0), self.dir.join(files.1));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}
