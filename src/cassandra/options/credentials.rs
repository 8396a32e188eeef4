//! `credentials`: a role name and where its password comes from. The password is a
//! [`SecretString`]: never serialized, never in `Debug` output, logs or errors.

use std::fmt;
use std::path::{Path, PathBuf};

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use secrecy::{ExposeSecret, SecretString};
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::{MembershipError, Result};

/// A password file's content, or why it could not be read (the option and the reason).
type FileRead = std::result::Result<SecretString, (String, String)>;

/// The password files being read now, one read per path ([`Credentials::password_until`]).
static READS: Mutex<BTreeMap<PathBuf, watch::Receiver<Option<FileRead>>>> =
    Mutex::new(BTreeMap::new());

/// A role name and its password, given inline or read by `connect` from an environment
/// variable or a file: exactly one of `password`, `password_env` and `password_file` is set.
///
/// The password is never serialized (serializing keeps `password_env` and `password_file`,
/// which name where it is, and drops an inline `password`), never shown by `Debug`, and a
/// value of the wrong type in a config file is refused without quoting it.
///
/// ```
/// use cassandra_membership::CassandraClusteringOptions;
/// let o: CassandraClusteringOptions = toml::from_str(r#"
///     service_id = "shop"
///     cluster_id = "blue"
///     credentials = { username = "ops", password_env = "CASSANDRA_PASSWORD" }
/// "#).unwrap();
/// o.validate().unwrap();
/// // A password that cannot be read is a configuration error naming where it was looked for.
/// let e = o.credentials.unwrap().password().unwrap_err();
/// assert!(e.to_string().contains("CASSANDRA_PASSWORD"));
/// ```
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Credentials {
    /// The role name.
    pub username: String,
    /// The password itself. Never serialized. Prefer `password_env` or `password_file` in a
    /// file that is checked in or shared. `SecretString` is re-exported as
    /// [`cassandra_membership::secrecy`](crate::secrecy), so a host needs no `secrecy` of its own:
    ///
    /// ```
    /// use cassandra_membership::secrecy::{ExposeSecret, SecretString};
    /// use cassandra_membership::CassandraClusteringOptions;
    /// let mut o = CassandraClusteringOptions::default().credentials("ops", "first");
    /// let c = o.credentials.as_mut().unwrap();
    /// c.password = Some(SecretString::from("rotated".to_owned()));
    /// assert_eq!(c.password.as_ref().unwrap().expose_secret(), "rotated");
    /// ```
    #[serde(default, skip_serializing, deserialize_with = "deserialize_password")]
    pub password: Option<SecretString>,
    /// The name of an environment variable holding the password, read by `connect`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
    /// A file holding the password (one trailing newline is not part of it), read by
    /// `connect`: a mounted Kubernetes secret, for instance. Relative paths are relative to the
    /// process's working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
}

impl Credentials {
    /// A role and its password.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            username: username.into(),
            password: Some(SecretString::from(password.into())),
            ..Credentials::default()
        }
    }

    /// A role whose password `connect` reads from the environment variable `variable`.
    pub fn from_env(username: impl Into<String>, variable: impl Into<String>) -> Self {
        Credentials {
            username: username.into(),
            password_env: Some(variable.into()),
            ..Credentials::default()
        }
    }

    /// A role whose password `connect` reads from the file at `path`.
    pub fn from_file(username: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Credentials {
            username: username.into(),
            password_file: Some(path.into()),
            ..Credentials::default()
        }
    }

    /// Checks that exactly one source of the password is set (reading nothing).
    pub(crate) fn validate(&self) -> Result<()> {
        let sources = [
            self.password.is_some(),
            self.password_env.is_some(),
            self.password_file.is_some(),
        ];
        if sources.iter().filter(|set| **set).count() != 1 {
            return Err(MembershipError::config(
                "credentials",
                "set exactly one of password, password_env and password_file",
            ));
        }
        if self.password_env.as_deref().is_some_and(str::is_empty) {
            return Err(MembershipError::config(
                "credentials.password_env",
                "the variable's name is empty",
            ));
        }
        Ok(())
    }

    /// The password, by `deadline`. A `password_file` is read on a thread of its own, not the
    /// runtime's: a slow mount or a FIFO a secrets agent has not filled yet must neither stall
    /// other tasks nor keep the runtime from dropping once the host gave up (a runtime's drop
    /// waits for its `spawn_blocking` tasks; a detached thread it does not). One read per path is
    /// in flight in the process: a connect that gave up leaves it for the next connect to wait on
    /// — not a thread per attempt, each blocked on the same FIFO, the agent's one write going to
    /// whichever opened first while the live attempt reads an empty file.
    pub(crate) async fn password_until(
        &self,
        deadline: tokio::time::Instant,
        connect_timeout: std::time::Duration,
    ) -> Result<SecretString> {
        let Some(path) = self.password_file.clone() else {
            return self.password();
        };
        let mut read = self.read_in_flight(&path)?;
        match tokio::time::timeout_at(deadline, read.wait_for(Option::is_some)).await {
            Ok(Ok(answer)) => match answer.as_ref() {
                Some(Ok(password)) => Ok(password.clone()),
                Some(Err((option, reason))) => Err(MembershipError::config(option, reason.clone())),
                None => Err(MembershipError::config(
                    "credentials.password_file",
                    "its reading thread ended without an answer",
                )),
            },
            Ok(Err(_)) => Err(MembershipError::config(
                "credentials.password_file",
                "its reading thread ended without an answer",
            )),
            Err(_) => Err(MembershipError::Unavailable {
                operation: "connect",
                source: format!(
                    "credentials.password_file {} could not be read within connect_timeout ({connect_timeout:?}): \
                     a FIFO no one has written yet, or a mount that does not answer",
                    path.display()
                )
                .into(),
            }),
        }
    }

    /// The read of `path` in flight, or a new one on a thread of its own.
    fn read_in_flight(&self, path: &Path) -> Result<watch::Receiver<Option<FileRead>>> {
        let mut reads = READS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(read) = reads.get(path) {
            return Ok(read.clone());
        }
        let (tx, rx) = watch::channel(None);
        let (source, key, mine) = (self.clone(), path.to_path_buf(), rx.clone());
        std::thread::Builder::new()
            .name("cassandra-membership-password-file".into())
            .spawn(move || {
                let read = source.password().map_err(|e| match e {
                    MembershipError::InvalidConfiguration { option, reason } => (option, reason),
                    other => ("credentials.password_file".to_owned(), other.to_string()),
                });
                tx.send_replace(Some(read));
                // The next connect reads the file afresh.
                let mut reads = READS.lock().unwrap_or_else(PoisonError::into_inner);
                if reads.get(&key).is_some_and(|r| r.same_channel(&mine)) {
                    reads.remove(&key);
                }
            })
            .map_err(|e| MembershipError::Unavailable {
                operation: "connect",
                source: format!("no thread to read credentials.password_file: {e}").into(),
            })?;
        reads.insert(path.to_path_buf(), rx.clone());
        Ok(rx)
    }

    /// The password, read from where the options say. An unset, empty or non-Unicode variable,
    /// or a file that cannot be read or is empty, is an [`InvalidConfiguration`](MembershipError::InvalidConfiguration)
    /// naming the option and the variable or file (never the value).
    pub fn password(&self) -> Result<SecretString> {
        self.validate()?;
        if let Some(p) = &self.password {
            return Ok(p.clone());
        }
        if let Some(var) = &self.password_env {
            // Never `VarError`'s own text: for a value that is not Unicode it quotes the value.
            let problem = match std::env::var(var) {
                Ok(p) if !p.is_empty() => return Ok(SecretString::from(p)),
                Ok(_) => "is empty",
                Err(std::env::VarError::NotPresent) => "is not set",
                Err(std::env::VarError::NotUnicode(_)) => "is not valid Unicode",
            };
            return Err(MembershipError::config(
                "credentials.password_env",
                format!("environment variable {var} {problem}"),
            ));
        }
        let path = self.password_file.as_deref().unwrap_or(Path::new(""));
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let text = text.strip_suffix('\n').unwrap_or(&text);
                let text = text.strip_suffix('\r').unwrap_or(text);
                if text.is_empty() {
                    return Err(MembershipError::config(
                        "credentials.password_file",
                        format!("{} is empty", path.display()),
                    ));
                }
                Ok(SecretString::from(text.to_owned()))
            }
            Err(e) => Err(MembershipError::config(
                "credentials.password_file",
                format!("cannot read {}: {e}", path.display()),
            )),
        }
    }
}

/// Equal when the role and the password's source are: two inline passwords compare by value.
impl PartialEq for Credentials {
    fn eq(&self, other: &Self) -> bool {
        self.username == other.username
            && self.password.as_ref().map(|p| p.expose_secret())
                == other.password.as_ref().map(|p| p.expose_secret())
            && self.password_env == other.password_env
            && self.password_file == other.password_file
    }
}

impl Eq for Credentials {}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("password_env", &self.password_env)
            .field("password_file", &self.password_file)
            .finish()
    }
}

/// A password from a config file. serde's own type errors quote the value ("invalid type:
/// integer `73571234`, expected a string"), and a config parser puts them in its message: every
/// value of another type is refused here without it.
fn deserialize_password<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<SecretString>, D::Error> {
    struct Password;

    const NOT_A_STRING: &str = "the password must be a string (its value is not shown)";

    impl Visitor<'_> for Password {
        type Value = SecretString;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the password as a string")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<SecretString, E> {
            Ok(SecretString::from(v.to_owned()))
        }

        fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<SecretString, E> {
            Ok(SecretString::from(v))
        }

        fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<SecretString, E> {
            Err(E::custom(NOT_A_STRING))
        }

        fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<SecretString, E> {
            Err(E::custom(NOT_A_STRING))
        }

        fn visit_i128<E: de::Error>(self, _: i128) -> std::result::Result<SecretString, E> {
            Err(E::custom(NOT_A_STRING))
        }

        fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<SecretString, E> {
            Err(E::custom(NOT_A_STRING))
        }

        fn visit_u128<E: de::Error>(self, _: u128) -> std::result::Result<SecretString, E> {
            Err(E::custom(NOT_A_STRING))
        }

        fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<SecretString, E> {
            Err(E::custom(NOT_A_STRING))
        }

        fn visit_bytes<E: de::Error>(self, _: &[u8]) -> std::result::Result<SecretString, E> {
            Err(E::custom(NOT_A_STRING))
        }
    }

    d.deserialize_str(Password).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_of_another_type_is_refused_without_its_value() {
        for body in [
            "username = \"ops\"\npassword = 73571234",
            "username = \"ops\"\npassword = 73571234.5",
            "username = \"ops\"\npassword = true",
            "username = \"ops\"\npassword = 1979-05-27",
        ] {
            // toml's `Display` quotes the source line; the message (what the CLI prints) is
            // ours. A date arrives as a map, which serde names without its value.
            let e = toml::from_str::<Credentials>(body).unwrap_err();
            let message = e.message();
            assert!(
                message.contains("password must be a string") || message.contains("map"),
                "{message}"
            );
            for value in ["73571234", "true", "1979"] {
                assert!(!message.contains(value), "{message}");
            }
        }
    }

    #[test]
    fn the_password_is_never_serialized_nor_in_debug() {
        let c = Credentials::new("ops", "s3cr3t-pw");
        let toml = toml::to_string(&c).unwrap();
        assert!(!toml.contains("s3cr3t-pw"), "{toml}");
        assert!(!format!("{c:?}").contains("s3cr3t-pw"));
        let env = Credentials::from_env("ops", "PW_VAR");
        assert!(
            toml::to_string(&env)
                .unwrap()
                .contains("password_env = \"PW_VAR\"")
        );
    }

    #[test]
    fn a_password_comes_from_exactly_one_source_and_a_missing_one_names_it() {
        let var = format!("CM_TEST_PW_{}", uuid::Uuid::new_v4().simple());
        let e = Credentials::from_env("ops", var.clone())
            .password()
            .unwrap_err();
        assert!(
            matches!(&e, MembershipError::InvalidConfiguration { option, reason } if option == "credentials.password_env" && reason.contains(&var)),
            "{e:?}"
        );
        let path = std::env::temp_dir().join(format!("{var}.pw"));
        let e = Credentials::from_file("ops", &path).password().unwrap_err();
        assert!(
            matches!(&e, MembershipError::InvalidConfiguration { option, .. } if option == "credentials.password_file"),
            "{e:?}"
        );
        std::fs::write(&path, "from-a-file\n").unwrap();
        let read = Credentials::from_file("ops", &path).password().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read.expose_secret(), "from-a-file");
        let mut both = Credentials::new("ops", "x");
        both.password_env = Some(var);
        assert!(both.validate().is_err());
        let none: Credentials = toml::from_str("username = \"ops\"").unwrap();
        assert!(none.validate().is_err());
    }

    /// A variable holding bytes that are not Unicode was quoted in the error
    /// (`VarError`'s own text prints the value), and an empty variable or file was taken as the
    /// password (the node then answered `AccessDenied`, naming neither).
    #[test]
    fn an_empty_or_non_unicode_source_is_refused_without_its_value() {
        use std::os::unix::ffi::OsStrExt;
        let var = format!("CM_TEST_PW_{}", uuid::Uuid::new_v4().simple());
        // SAFETY: a variable of this test's own unique name; no other code reads or writes it.
        unsafe {
            std::env::set_var(&var, std::ffi::OsStr::from_bytes(b"s3cr3t-p\xe4ssword"));
        }
        let e = Credentials::from_env("ops", var.clone())
            .password()
            .unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(!text.contains("s3cr3t"), "the value is quoted: {text}");
        assert!(text.contains(&var) && text.contains("Unicode"), "{text}");
        // SAFETY: as above.
        unsafe {
            std::env::set_var(&var, "");
        }
        let e = Credentials::from_env("ops", var.clone())
            .password()
            .unwrap_err();
        assert!(format!("{e}").contains("is empty"), "{e}");
        let path = std::env::temp_dir().join(format!("{var}.pw"));
        std::fs::write(&path, "\n").unwrap();
        let e = Credentials::from_file("ops", &path).password().unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(&e, MembershipError::InvalidConfiguration { option, reason } if option == "credentials.password_file" && reason.contains("is empty")),
            "{e:?}"
        );
    }
}
