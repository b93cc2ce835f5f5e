//! Certificates made by the tests themselves: a CA written as a PEM file,
//! and leaves it signs (a chain file and a key file each).

use std::path::{Path, PathBuf};

/// A CA that signs leaves.
pub(crate) struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
    /// The CA certificate's PEM file.
    pub(crate) cert_file: PathBuf,
}

/// A leaf's files: the chain (leaf, then CA) and the key.
#[derive(Clone, Debug)]
pub(crate) struct Leaf {
    pub(crate) cert_file: PathBuf,
    pub(crate) key_file: PathBuf,
}

impl TestCa {
    /// A new CA named `name`, its certificate written to `dir/{name}.pem`.
    pub(crate) fn new(dir: &Path, name: &str) -> TestCa {
        std::fs::create_dir_all(dir).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let cert_file = dir.join(format!("{name}.pem"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        TestCa {
            cert,
            key,
            cert_file,
        }
    }

    /// A server leaf for `names` (DNS names or IP addresses), common name
    /// the first, written as `dir/{stem}.pem` and `dir/{stem}.key`.
    pub(crate) fn server(&self, dir: &Path, stem: &str, names: &[&str]) -> Leaf {
        self.leaf(dir, stem, names[0], names, rcgen::ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client leaf with common name `cn`.
    pub(crate) fn client(&self, dir: &Path, stem: &str, cn: &str) -> Leaf {
        self.leaf(dir, stem, cn, &[], rcgen::ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn leaf(
        &self,
        dir: &Path,
        stem: &str,
        cn: &str,
        names: &[&str],
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) -> Leaf {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let leaf = Leaf {
            cert_file: dir.join(format!("{stem}.pem")),
            key_file: dir.join(format!("{stem}.key")),
        };
        std::fs::write(&leaf.cert_file, format!("{}{}", cert.pem(), self.cert.pem())).unwrap();
        std::fs::write(&leaf.key_file, key.serialize_pem()).unwrap();
        leaf
    }
}
