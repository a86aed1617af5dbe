//! TLS to PostgreSQL, with libpq's settings and meaning: `sslmode` (disable, prefer, require,
//! verify-ca, verify-full), `sslrootcert` (a CA file, or `system`), `sslcert` and `sslkey` (a
//! client certificate). Owns reading those files once, at start, into a rustls client
//! configuration that checks the server's certificate as the mode says; and turning a failed
//! handshake into words that say what to fix.
//!
//! Must not touch the rest of the connection string, nor decide which host to try (that is
//! `connection.rs`).

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`: how far a connection insists on TLS and checks the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS when the server offers it, plain otherwise (libpq's default).
    Prefer,
    /// TLS or no connection.
    Require,
    /// TLS, and the server's certificate chains to a trusted CA.
    VerifyCa,
    /// As verify-ca, and the certificate names the host connected to.
    VerifyFull,
}

impl SslMode {
    pub fn parse(value: &str) -> Result<SslMode, String> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // libpq's `allow` tries plain first; tokio-postgres cannot, and `prefer` would
            // not be what was asked.
            "allow" => {
                return Err("sslmode=allow is not supported: use prefer or disable".to_string())
            }
            other => {
                return Err(format!(
                    "sslmode={other} is not a mode: use disable, prefer, require, verify-ca or \
                     verify-full"
                ))
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: it knows whether to ask for TLS, not what to check.
    pub fn negotiation(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Pg;
        match self {
            SslMode::Disable => Pg::Disable,
            SslMode::Prefer => Pg::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Pg::Require,
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The TLS keys of a connection string, as written; no file read yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsKeys {
    pub mode: Option<SslMode>,
    pub root_cert: Option<String>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// Where trusted CA certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    /// Nothing is checked (prefer and require without `sslrootcert`, as libpq).
    None,
    File(PathBuf),
    /// The system's CA certificates (`sslrootcert=system`, or verify-* without `sslrootcert`).
    System,
}

impl fmt::Display for Roots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Roots::None => f.write_str("no CA (the certificate is not checked)"),
            Roots::File(path) => write!(f, "sslrootcert {}", path.display()),
            Roots::System => f.write_str("the system's CA certificates"),
        }
    }
}

/// TLS as every connection of one connection string uses it.
#[derive(Clone)]
pub struct Tls {
    pub mode: SslMode,
    roots: Roots,
    /// `sslcert`, named when the server refuses the handshake.
    client_cert: Option<PathBuf>,
    connector: MakeRustlsConnect,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("mode", &self.mode)
            .field("roots", &self.roots)
            .field("client_cert", &self.client_cert)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads every file `keys` names and builds the client configuration; an error names the
    /// file and what is wrong with it. A file is read even where the mode would not use it:
    /// a mistake in one should not wait for the day the mode changes.
    pub fn load(keys: &TlsKeys) -> Result<Tls, String> {
        let mode = keys.mode.unwrap_or(SslMode::Prefer);
        let roots = match keys.root_cert.as_deref() {
            // libpq 16's rule: the system's CAs vouch for every name they sign, so only a
            // check of the host name makes them mean anything.
            Some("system") if mode != SslMode::VerifyFull => {
                return Err(format!(
                    "sslrootcert=system needs sslmode=verify-full (it is {mode}): the system's \
                     CAs sign certificates for any host"
                ))
            }
            Some("system") => Roots::System,
            Some(path) => Roots::File(PathBuf::from(path)),
            None if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) => Roots::System,
            None => Roots::None,
        };
        let store = match &roots {
            Roots::None => None,
            Roots::File(path) => Some(root_store_from_file(path)?),
            Roots::System => Some(system_root_store()?),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let check = match (store, mode) {
            (None, _) => Check::Signatures,
            (Some(store), SslMode::VerifyFull) => Check::ChainAndName(Arc::new(store)),
            // libpq: with a CA file, prefer and require check the chain as verify-ca does.
            (Some(store), _) => Check::Chain(Arc::new(store)),
        };
        let verifier = Arc::new(ServerCheck {
            check,
            algorithms: provider.signature_verification_algorithms,
        });
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&keys.cert, &keys.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = certificates(cert, "sslcert")?;
                let private = private_key(key)?;
                builder
                    .with_client_auth_cert(chain, private)
                    .map_err(|e| match e {
                        rustls::Error::InconsistentKeys(_) => format!(
                            "sslkey {} is not the key of sslcert {}",
                            key.display(),
                            cert.display()
                        ),
                        e => format!(
                            "sslcert {} with sslkey {}: {e}",
                            cert.display(),
                            key.display()
                        ),
                    })?
            }
            (Some(cert), None) => {
                return Err(format!(
                    "sslcert {} needs sslkey, the file of its private key",
                    cert.display()
                ))
            }
            (None, Some(key)) => {
                return Err(format!(
                    "sslkey {} needs sslcert, the file of its certificate",
                    key.display()
                ))
            }
        };
        Ok(Tls {
            mode,
            roots,
            client_cert: keys.cert.clone(),
            connector: MakeRustlsConnect::new(config),
        })
    }

    pub fn connector(&self) -> MakeRustlsConnect {
        self.connector.clone()
    }

    /// How connections are protected, for the start-up line.
    pub fn summary(&self) -> String {
        match (self.mode, &self.roots) {
            (SslMode::Disable, _) => "no TLS (sslmode=disable)".to_string(),
            (mode, Roots::None) => {
                format!("TLS (sslmode={mode}; the server's certificate is not checked)")
            }
            (SslMode::VerifyFull, roots) => {
                format!(
                    "TLS (sslmode=verify-full; certificate and host name checked against {roots})"
                )
            }
            (mode, roots) => {
                format!("TLS (sslmode={mode}; certificate checked against {roots}, host name not)")
            }
        }
    }

    /// Why a connection to `host` failed, when TLS is the reason; `None` otherwise.
    pub fn explain(&self, error: &tokio_postgres::Error) -> Option<String> {
        if let Some(e) = rustls_error(error) {
            return Some(self.explain_rustls(e));
        }
        // tokio-postgres' words when the server answered the TLS request with "no".
        let refused = std::error::Error::source(error)
            .is_some_and(|cause| cause.to_string() == "server does not support TLS");
        refused.then(|| {
            format!(
                "the server does not offer TLS, and sslmode={} requires it: turn ssl on in the \
                 server, or lower sslmode",
                self.mode
            )
        })
    }

    fn explain_rustls(&self, error: &rustls::Error) -> String {
        use rustls::Error as E;
        match error {
            E::InvalidCertificate(why) => self.explain_certificate(why),
            E::AlertReceived(alert) => match &self.client_cert {
                Some(cert) => format!(
                    "the server refused the TLS handshake ({alert:?}): is sslcert {} signed by \
                     a CA the server trusts (its ssl_ca_file)?",
                    cert.display()
                ),
                None => format!(
                    "the server refused the TLS handshake ({alert:?}); if it asks for a client \
                     certificate, give sslcert and sslkey"
                ),
            },
            e => format!("the TLS handshake failed: {e}"),
        }
    }

    fn explain_certificate(&self, why: &CertificateError) -> String {
        use CertificateError as C;
        let roots = &self.roots;
        match why {
            C::UnknownIssuer => format!(
                "the server's certificate is not trusted: no CA of {roots} signed it \
                 (sslmode={})",
                self.mode
            ),
            C::NotValidForNameContext {
                expected,
                presented,
            } => format!(
                "the server's certificate is not valid for the host name {} (it names {}); \
                 sslmode=verify-full checks the name: connect by a name the certificate holds",
                expected.to_str(),
                if presented.is_empty() {
                    "no host".to_string()
                } else {
                    presented
                        .iter()
                        .map(|name| bare_name(name))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
            C::NotValidForName => "the server's certificate is not valid for the host name \
                                   connected to (sslmode=verify-full checks the name)"
                .to_string(),
            C::Expired | C::ExpiredContext { .. } => {
                format!("the server's certificate has expired: {why}")
            }
            C::NotValidYet | C::NotValidYetContext { .. } => {
                format!("the server's certificate is not valid yet: {why}")
            }
            C::Revoked => "the server's certificate is revoked".to_string(),
            why => format!("the server's certificate was refused: {why}"),
        }
    }
}

/// `localhost` of `DnsName("localhost")`, `10.0.0.5` of `IpAddress(10.0.0.5)`: how rustls
/// lists the names a certificate holds.
fn bare_name(name: &str) -> &str {
    match (name.find('('), name.strip_suffix(')')) {
        (Some(open), Some(inner)) if open < inner.len() => inner[open + 1..].trim_matches('"'),
        _ => name,
    }
}

/// The rustls error inside a connection error, if TLS is what failed. tokio-rustls hands it
/// up inside an `io::Error`, whose `source()` skips it, so each `io::Error` is opened.
fn rustls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(found) = rustls_error(inner) {
                return Some(found);
            }
        }
        next = e.source();
    }
    None
}

/// What the server's certificate must pass.
#[derive(Debug)]
enum Check {
    /// Only that the server holds the key of the certificate it showed.
    Signatures,
    /// A chain to one of these CAs, whatever host it names (verify-ca).
    Chain(Arc<RootCertStore>),
    /// A chain to one of these CAs, naming the host connected to (verify-full).
    ChainAndName(Arc<RootCertStore>),
}

#[derive(Debug)]
struct ServerCheck {
    check: Check,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ServerCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let roots = match &self.check {
            Check::Signatures => return Ok(ServerCertVerified::assertion()),
            Check::Chain(roots) | Check::ChainAndName(roots) => roots,
        };
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        if let Check::ChainAndName(_) = self.check {
            rustls::client::verify_server_name(&cert, server_name)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A file's bytes, or why it cannot be had, naming the file and the key that named it.
fn read(path: &Path, key: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{key} {}: cannot read it: {e}", path.display()))
}

/// The PEM certificates of `path`; at least one.
fn certificates(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read(path, key)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{key} {}: not a PEM file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{key} {}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

fn root_store_from_file(path: &Path) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    for (n, cert) in certificates(path, "sslrootcert")?.into_iter().enumerate() {
        store.add(cert).map_err(|e| {
            format!(
                "sslrootcert {}: certificate {} is not a usable CA certificate: {e}",
                path.display(),
                n + 1
            )
        })?;
    }
    Ok(store)
}

/// The system's CA certificates (`/etc/ssl/certs` and the like; `SSL_CERT_FILE` and
/// `SSL_CERT_DIR` as OpenSSL reads them), so a CA an administrator added there counts.
fn system_root_store() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (added, _unusable) = store.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        return Err(format!(
            "no CA certificate found in the system's store{}: install the CA certificates \
             (the ca-certificates package), or name the CA file with sslrootcert",
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            }
        ));
    }
    Ok(store)
}

/// The private key of `path`, after libpq's rule on who may read it.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    key_permissions(path)?;
    let bytes = read(path, "sslkey")?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => format!(
            "sslkey {}: holds no private key (PEM: PKCS#8, PKCS#1 or SEC1; an encrypted key is \
             not supported)",
            path.display()
        ),
        e => format!("sslkey {}: not a PEM private key: {e}", path.display()),
    })
}

/// libpq refuses a private key that others may read: one owned by this user must have no
/// group or world bits (0600 or less), one owned by root may be read by its group (0640).
#[cfg(unix)]
fn key_permissions(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("sslkey {}: cannot read it: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("sslkey {}: not a regular file", path.display()));
    }
    let mode = meta.mode();
    let mine = meta.uid() == nix::unistd::geteuid().as_raw();
    let too_open = (mine && mode & 0o077 != 0) || (meta.uid() == 0 && mode & 0o037 != 0);
    if too_open {
        return Err(format!(
            "sslkey {}: others may read it (mode {:04o}): it must be 0600 or less when owned \
             by this user, 0640 or less when owned by root",
            path.display(),
            mode & 0o777
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn key_permissions(_path: &Path) -> Result<(), String> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_libpqs_words() {
        for mode in [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ] {
            assert_eq!(SslMode::parse(mode.name()), Ok(mode));
        }
        assert!(SslMode::parse("allow").unwrap_err().contains("prefer"));
        assert!(SslMode::parse("verify_full")
            .unwrap_err()
            .contains("verify-full"));
    }

    #[test]
    fn without_files_prefer_and_require_check_nothing_and_verify_uses_the_system() {
        let keys = |mode| TlsKeys {
            mode: Some(mode),
            ..TlsKeys::default()
        };
        let tls = Tls::load(&TlsKeys::default()).unwrap();
        assert_eq!((tls.mode, &tls.roots), (SslMode::Prefer, &Roots::None));
        assert_eq!(
            Tls::load(&keys(SslMode::Require)).unwrap().roots,
            Roots::None
        );
        // This machine has the ca-certificates package, as the image and the package do.
        assert_eq!(
            Tls::load(&keys(SslMode::VerifyFull)).unwrap().roots,
            Roots::System
        );
    }

    #[test]
    fn system_roots_need_verify_full_and_a_lone_half_of_a_client_pair_is_refused() {
        let err = Tls::load(&TlsKeys {
            mode: Some(SslMode::VerifyCa),
            root_cert: Some("system".into()),
            ..TlsKeys::default()
        })
        .unwrap_err();
        assert!(err.contains("verify-full"), "{err}");
        let err = Tls::load(&TlsKeys {
            cert: Some("/etc/sked/client.crt".into()),
            ..TlsKeys::default()
        })
        .unwrap_err();
        assert!(
            err.contains("/etc/sked/client.crt") && err.contains("sslkey"),
            "{err}"
        );
    }

    #[test]
    fn names_a_certificate_holds_are_shown_bare() {
        assert_eq!(bare_name("DnsName(\"db.example\")"), "db.example");
        assert_eq!(bare_name("IpAddress(10.0.0.5)"), "10.0.0.5");
        assert_eq!(bare_name("127.0.0.1"), "127.0.0.1");
    }

    #[test]
    fn a_missing_or_garbage_file_is_named_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let err = Tls::load(&TlsKeys {
            root_cert: Some(missing.display().to_string()),
            ..TlsKeys::default()
        })
        .unwrap_err();
        assert!(err.contains(&missing.display().to_string()), "{err}");
        assert!(err.contains("No such file"), "{err}");

        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let err = Tls::load(&TlsKeys {
            mode: Some(SslMode::VerifyFull),
            root_cert: Some(garbage.display().to_string()),
            ..TlsKeys::default()
        })
        .unwrap_err();
        assert!(
            err.contains(&garbage.display().to_string()) && err.contains("no PEM certificate"),
            "{err}"
        );
    }
}
