//! TLS from options: the serde `tls` section of [`super::CassandraClusteringOptions`] and the
//! rustls client configuration `connect` builds from it (feature `rustls`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{MembershipError, Result};

/// TLS to the cluster, built by [`crate::CassandraMembershipTable::connect`] into a rustls
/// configuration (crate feature `rustls`; without it a `tls` section is an
/// [`MembershipError::InvalidConfiguration`] naming the feature).
///
/// ```toml
/// [tls]
/// ca_file = "/etc/cassandra/ca.pem"
/// # Client certificate, when the cluster asks for one (both or neither):
/// cert_file = "/etc/cassandra/client.pem"
/// key_file = "/etc/cassandra/client.key"
/// # server_name = "cassandra.internal"
/// ```
///
/// There is no built-in trust store: a Cassandra cluster's certificates come from its owner's
/// CA almost always, so `ca_file` is required while `verify` is on. Hosts that need the
/// platform's roots build their own `rustls::ClientConfig` and use
/// `CassandraMembershipTable::connect_tls`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TlsOptions {
    /// PEM file of the certificate(s) that sign the nodes' certificates (a CA, or the nodes'
    /// self-signed certificates); every certificate in it is trusted. Required while `verify`
    /// is on. Default: none.
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate chain (leaf first), for clusters that ask for client
    /// authentication (`require_client_auth`). Set together with `key_file`. Default: none.
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key (PKCS#8, PKCS#1 or SEC1). Set together
    /// with `cert_file`. Default: none.
    pub key_file: Option<PathBuf>,
    /// The name every node's certificate must carry (a DNS name or an IP address). Default:
    /// the host of the contact points when they all name one DNS host; otherwise the IP address
    /// of the node connected to (what the driver verifies against), so the certificate must
    /// carry that IP in its subject alternative names.
    pub server_name: Option<String>,
    /// Verify the nodes' certificates. Default true. `false` accepts any certificate (the
    /// connection is encrypted but not authenticated: anyone on the path can pose as the
    /// cluster and read the credentials); `connect` logs a warning each time. Tests only.
    /// With `verify` off, `ca_file` and `server_name` must not be set (validation names the
    /// one that is: it would be ignored).
    pub verify: bool,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            ca_file: None,
            cert_file: None,
            key_file: None,
            server_name: None,
            verify: true,
        }
    }
}

impl TlsOptions {
    /// TLS that trusts the certificates in `ca_file` (PEM).
    pub fn with_ca_file(ca_file: impl Into<PathBuf>) -> Self {
        TlsOptions {
            ca_file: Some(ca_file.into()),
            ..TlsOptions::default()
        }
    }

    /// Presents this client certificate chain and key (PEM files).
    pub fn client_certificate(
        mut self,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Self {
        self.cert_file = Some(cert_file.into());
        self.key_file = Some(key_file.into());
        self
    }

    /// Sets the name the nodes' certificates must carry.
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Turns certificate verification on or off (see the field: off is for tests only).
    pub fn verify(mut self, verify: bool) -> Self {
        self.verify = verify;
        self
    }

    /// Checks the section without reading any file; errors name `tls.<field>`.
    pub(crate) fn validate(&self) -> Result<()> {
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(MembershipError::config(
                    "tls.key_file",
                    "tls.cert_file is set: a client certificate needs its private key too",
                ));
            }
            (None, Some(_)) => {
                return Err(MembershipError::config(
                    "tls.cert_file",
                    "tls.key_file is set: a private key needs its client certificate too",
                ));
            }
            _ => {}
        }
        // Verification off ignores what only verification uses: refuse rather than let an
        // operator believe a CA or a name is checked.
        if !self.verify {
            for (option, set) in [
                ("tls.ca_file", self.ca_file.is_some()),
                ("tls.server_name", self.server_name.is_some()),
            ] {
                if set {
                    return Err(MembershipError::config(
                        option,
                        "is set while tls.verify is off, which accepts any certificate and would \
                         ignore it; turn tls.verify on to check the nodes' certificates, or remove it",
                    ));
                }
            }
        }
        if self.verify && self.ca_file.is_none() {
            return Err(MembershipError::config(
                "tls.ca_file",
                "required while tls.verify is on: the PEM file of the CA (or the nodes' \
                 certificates) that signs the nodes' certificates; there is no built-in trust store",
            ));
        }
        if let Some(name) = &self.server_name
            && (name.trim().is_empty() || name.trim() != name || name.len() > 253)
        {
            return Err(MembershipError::config(
                "tls.server_name",
                format!("{name:?} is not a DNS name or an IP address"),
            ));
        }
        Ok(())
    }
}

/// The host part of `host:port` (`[v6]:port` too), when it is a DNS name rather than an IP.
#[cfg(feature = "rustls")]
fn dns_host(contact_point: &str) -> Option<&str> {
    let host = match contact_point.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => contact_point,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host.parse::<std::net::IpAddr>().is_err() && !host.is_empty()).then_some(host)
}

#[cfg(feature = "rustls")]
pub(crate) use with_rustls::client_config;

#[cfg(feature = "rustls")]
mod with_rustls {
    use std::path::Path;
    use std::sync::Arc;

    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
    use tracing::warn;

    use super::{TlsOptions, dns_host};
    use crate::error::{MembershipError, Result};

    fn file_error(option: &str, path: &Path, what: impl std::fmt::Display) -> MembershipError {
        MembershipError::config(option, format!("{}: {what}", path.display()))
    }

    fn pem_error(option: &str, path: &Path, e: rustls::pki_types::pem::Error) -> MembershipError {
        use rustls::pki_types::pem::Error as Pem;
        match e {
            Pem::Io(io) => file_error(option, path, format_args!("cannot read it: {io}")),
            Pem::NoItemsFound => file_error(option, path, "holds no PEM item of the needed kind"),
            other => file_error(option, path, format_args!("not valid PEM: {other:?}")),
        }
    }

    fn certificates(option: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| pem_error(option, path, e))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| pem_error(option, path, e))?;
        if certs.is_empty() {
            return Err(file_error(
                option,
                path,
                "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            ));
        }
        Ok(certs)
    }

    /// The process's default provider if the host installed one, else aws-lc-rs (the one the
    /// driver's rustls support compiles in).
    fn provider() -> Arc<CryptoProvider> {
        CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
    }

    /// The rustls configuration of `tls` (already validated) for these contact points: reads
    /// and checks every file; errors name the option and the file.
    pub(crate) fn client_config(
        tls: &TlsOptions,
        contact_points: &[String],
    ) -> Result<Arc<ClientConfig>> {
        let provider = provider();
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| MembershipError::config("tls", format!("no TLS version: {e}")))?;
        let server_name = match &tls.server_name {
            Some(name) => Some(ServerName::try_from(name.clone()).map_err(|e| {
                MembershipError::config("tls.server_name", format!("{name:?}: {e}"))
            })?),
            None => {
                // One DNS host for all contact points (a load-balanced name): its name. With
                // IPs or several names, the driver's own: each node's IP address.
                let hosts: Vec<&str> = contact_points.iter().filter_map(|p| dns_host(p)).collect();
                match hosts.split_first() {
                    Some((first, rest))
                        if hosts.len() == contact_points.len()
                            && rest.iter().all(|h| h == first) =>
                    {
                        ServerName::try_from(first.to_string()).ok()
                    }
                    _ => None,
                }
            }
        };
        let verifier: Arc<dyn ServerCertVerifier> = if tls.verify {
            let ca = tls.ca_file.as_deref().ok_or_else(|| {
                MembershipError::config("tls.ca_file", "required while tls.verify is on")
            })?;
            let mut roots = RootCertStore::empty();
            for cert in certificates("tls.ca_file", ca)? {
                roots
                    .add(cert)
                    .map_err(|e| file_error("tls.ca_file", ca, format_args!("{e}")))?;
            }
            let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| file_error("tls.ca_file", ca, format_args!("{e}")))?;
            Arc::new(NamedVerifier {
                inner,
                name: server_name,
            })
        } else {
            warn!(
                "tls.verify = false: the nodes' certificates are NOT verified; anyone on the \
                 network path can pose as the cluster and read the credentials"
            );
            Arc::new(AnyCertificate(provider))
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&tls.cert_file, &tls.key_file) {
            (Some(cert), Some(key)) => {
                let chain = certificates("tls.cert_file", cert)?;
                let key_der = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| pem_error("tls.key_file", key, e))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| match e {
                        rustls::Error::InconsistentKeys(_) => file_error(
                            "tls.key_file",
                            key,
                            format_args!("is not the key of the certificate in {}", cert.display()),
                        ),
                        other => file_error("tls.key_file", key, format_args!("{other}")),
                    })?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }

    /// The webpki verifier, checking the configured name instead of the node's IP address
    /// (the driver always hands rustls the IP it connects to).
    #[derive(Debug)]
    struct NamedVerifier {
        inner: Arc<WebPkiServerVerifier>,
        name: Option<ServerName<'static>>,
    }

    impl ServerCertVerifier for NamedVerifier {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp_response: &[u8],
            now: UnixTime,
        ) -> std::result::Result<ServerCertVerified, rustls::Error> {
            self.inner.verify_server_cert(
                end_entity,
                intermediates,
                self.name.as_ref().unwrap_or(server_name),
                ocsp_response,
                now,
            )
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.inner.supported_verify_schemes()
        }
    }

    /// `verify = false`: any certificate; the handshake signatures are still checked, so the
    /// peer holds the key of the certificate it shows.
    #[derive(Debug)]
    struct AnyCertificate(Arc<CryptoProvider>);

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> std::result::Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_needs_its_key_and_verification_needs_a_ca() {
        let e = TlsOptions {
            cert_file: Some("c.pem".into()),
            ..TlsOptions::with_ca_file("ca.pem")
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("tls.key_file"), "{e}");
        let e = TlsOptions {
            key_file: Some("k.pem".into()),
            ..TlsOptions::with_ca_file("ca.pem")
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("tls.cert_file"), "{e}");
        let e = TlsOptions::default().validate().unwrap_err();
        assert!(e.to_string().contains("tls.ca_file"), "{e}");
        TlsOptions::default().verify(false).validate().unwrap();
        TlsOptions::with_ca_file("ca.pem")
            .client_certificate("c.pem", "k.pem")
            .server_name("db.internal")
            .validate()
            .unwrap();
        let e = TlsOptions::with_ca_file("ca.pem")
            .server_name(" ")
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("tls.server_name"), "{e}");
        // Verification off would ignore a CA or a name: refused, naming it.
        let e = TlsOptions::with_ca_file("ca.pem")
            .verify(false)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("tls.ca_file"), "{e}");
        let e = TlsOptions::default()
            .verify(false)
            .server_name("db.internal")
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("tls.server_name"), "{e}");
        TlsOptions::default()
            .verify(false)
            .client_certificate("c.pem", "k.pem")
            .validate()
            .unwrap();
    }

    #[test]
    fn the_section_parses_with_verification_on_by_default_and_rejects_unknown_keys() {
        let t: TlsOptions = toml::from_str("ca_file = \"/etc/ca.pem\"\n").unwrap();
        assert!(t.verify);
        assert_eq!(
            t.ca_file.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        let e = toml::from_str::<TlsOptions>("ca_flie = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("ca_flie"), "{e}");
    }

    #[cfg(feature = "rustls")]
    #[test]
    fn the_default_server_name_is_the_one_dns_host_of_the_contact_points() {
        assert_eq!(dns_host("db.internal:9042"), Some("db.internal"));
        assert_eq!(dns_host("10.0.0.1:9042"), None);
        assert_eq!(dns_host("[::1]:9042"), None);
        assert_eq!(dns_host("db"), Some("db"));
    }

    #[cfg(feature = "rustls")]
    #[test]
    fn a_missing_or_unparsable_file_is_a_configuration_error_naming_it() {
        let missing = TlsOptions::with_ca_file("/no/such/ca.pem");
        let e = client_config(&missing, &[]).unwrap_err();
        assert!(
            matches!(&e, MembershipError::InvalidConfiguration { option, .. } if option == "tls.ca_file"),
            "{e:?}"
        );
        assert!(e.to_string().contains("/no/such/ca.pem"), "{e}");
        let path = std::env::temp_dir().join(format!("cm-tls-{}.pem", std::process::id()));
        std::fs::write(&path, "not a certificate\n").unwrap();
        let e = client_config(&TlsOptions::with_ca_file(&path), &[]).unwrap_err();
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        assert!(e.to_string().contains("no PEM"), "{e}");
        let _ = std::fs::remove_file(path);
    }

    #[cfg(not(feature = "rustls"))]
    #[tokio::test]
    async fn without_the_rustls_feature_a_tls_section_names_the_feature() {
        let options = crate::CassandraClusteringOptions::default()
            .contact_points(["127.0.0.1:1"])
            .tls(TlsOptions::with_ca_file("ca.pem"));
        let e = crate::CassandraMembershipTable::connect(options)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, MembershipError::InvalidConfiguration { option, reason }
                if option == "tls" && reason.contains("`rustls`")),
            "{e:?}"
        );
    }
}
