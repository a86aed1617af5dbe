//! Throwaway certificates for the TLS tests, made with the `openssl` command: a CA, and
//! certificates it signs for servers and clients. Keys are EC P-256, valid for a day, written
//! mode 0600 beside their certificates.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A certificate authority whose files are `<name>.pem` and `<name>.key` in its directory.
pub struct TestCa {
    dir: PathBuf,
    pub cert: PathBuf,
    key: PathBuf,
}

/// A certificate and its private key.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (is it installed?)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `openssl req` arguments for a fresh P-256 key, unencrypted.
const EC_KEY: &[&str] = &[
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

fn private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod a key");
}

impl TestCa {
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let (cert, key) = (format!("{name}.pem"), format!("{name}.key"));
        let subject = format!("/CN=sked test {name}");
        let args = [
            &["req", "-x509"][..],
            EC_KEY,
            &[
                "-keyout", &key, "-out", &cert, "-days", "1", "-subj", &subject,
            ],
        ]
        .concat();
        openssl(dir, &args);
        private(&dir.join(&key));
        TestCa {
            dir: dir.to_path_buf(),
            cert: dir.join(cert),
            key: dir.join(key),
        }
    }

    /// Signs `<name>.pem` (key `<name>.key`) for subject `/CN=<cn>`, with `extensions` in
    /// openssl's config syntax (one per line), e.g. `subjectAltName=DNS:localhost`.
    pub fn issue(&self, name: &str, cn: &str, extensions: &str) -> Issued {
        let (cert, key, csr, ext) = (
            format!("{name}.pem"),
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.ext"),
        );
        let subject = format!("/CN={cn}");
        let args = [
            &["req"][..],
            EC_KEY,
            &["-keyout", &key, "-out", &csr, "-subj", &subject],
        ]
        .concat();
        openssl(&self.dir, &args);
        std::fs::write(self.dir.join(&ext), format!("{extensions}\n")).expect("write extensions");
        let (ca_cert, ca_key) = (
            self.cert.to_str().expect("utf-8 path"),
            self.key.to_str().expect("utf-8 path"),
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                ca_cert,
                "-CAkey",
                ca_key,
                "-CAcreateserial",
                "-out",
                &cert,
                "-days",
                "1",
                "-extfile",
                &ext,
            ],
        );
        private(&self.dir.join(&key));
        Issued {
            cert: self.dir.join(cert),
            key: self.dir.join(key),
        }
    }
}
