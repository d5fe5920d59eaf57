//! Credentials for memcached's ASCII authentication (`-Y <auth file>`).
//!
//! The operator reads them from the instance's auth Secret and keeps them only in memory, for the time it
//! needs them: they are never written to a file, a log, an event, a status or a metric. Neither [`Debug`] nor
//! any error of this module shows the password.

use std::fmt;

use zeroize::Zeroizing;

/// A user and password for memcached's ASCII authentication.
///
/// memcached authenticates a text-protocol connection with a `set` whose data is `<user> <password>`, which
/// the client sends before anything else. Deliberately not [`fmt::Display`], and [`Debug`] hides the
/// password, so a `{}` or `{:?}` in a log line cannot leak it.
///
/// The password (and the command that carries it) is wiped from memory when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    user: String,
    password: Zeroizing<Vec<u8>>,
}

/// Why an auth file gives no usable credentials. Messages never quote the file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    /// The file has no non-empty line.
    #[error("the auth file has no entry")]
    NoEntry,
    /// The first entry has no `:` between user and password.
    #[error("the auth file's first entry is not `user:password`")]
    NoSeparator,
    /// The first entry's user is empty, has a space or a control character (memcached separates user and
    /// password with a space on the wire), or is not UTF-8.
    #[error(
        "the auth file's first user name is empty, not UTF-8, or has a space or control character"
    )]
    BadUser,
}

/// The key of the authenticating `set`. memcached ignores it when authentication is on; a recognisable name
/// makes the write easy to spot should it ever reach a server that does not authenticate (which the operator
/// avoids by authenticating only against instances whose spec turns authentication on).
const AUTH_KEY: &str = "memcached-operator-auth";

impl Credentials {
    /// Credentials from a user and a password.
    ///
    /// Fails when the user cannot be sent: empty, or with a space or control character.
    pub fn new(
        user: impl Into<String>,
        password: impl Into<Vec<u8>>,
    ) -> Result<Self, CredentialsError> {
        let user = user.into();
        if user.is_empty() || user.chars().any(|c| c == ' ' || c.is_control()) {
            return Err(CredentialsError::BadUser);
        }
        Ok(Self {
            user,
            password: Zeroizing::new(password.into()),
        })
    }

    /// The credentials of the first entry of a memcached auth file (`-Y`): its first non-empty line, in the
    /// form `user:password`.
    ///
    /// The user ends at the first `:`; the password is the rest of the line and may itself contain `:`. A
    /// trailing CR (a file written on Windows) is not part of the password. The operator needs one entry to
    /// authenticate: memcached accepts any entry of the file, and the first is the one users expect to be used.
    pub fn from_auth_file(contents: &[u8]) -> Result<Self, CredentialsError> {
        let line = contents
            .split(|&b| b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
            .find(|line| !line.is_empty())
            .ok_or(CredentialsError::NoEntry)?;
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(CredentialsError::NoSeparator)?;
        let (user, password) = line.split_at(colon);
        let user = std::str::from_utf8(user).map_err(|_| CredentialsError::BadUser)?;
        Self::new(user, password.get(1..).unwrap_or_default())
    }

    /// The user name (not secret: it may be logged).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The bytes that authenticate a text-protocol connection:
    /// `set <key> 0 0 <len>\r\n<user> <password>\r\n`, to which memcached answers `STORED` when it accepts.
    pub(crate) fn auth_command(&self) -> Zeroizing<Vec<u8>> {
        let data_len = self.user.len() + 1 + self.password.len();
        let mut command =
            Zeroizing::new(format!("set {AUTH_KEY} 0 0 {data_len}\r\n{} ", self.user).into_bytes());
        command.extend_from_slice(&self.password);
        command.extend_from_slice(b"\r\n");
        command
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_non_empty_line_is_the_entry_and_the_password_keeps_its_colons() {
        let credentials =
            Credentials::from_auth_file(b"\n\r\nalice:pa:ss word\r\nbob:other\n").expect("entry");
        assert_eq!(credentials.user(), "alice");
        assert_eq!(
            credentials,
            Credentials::new("alice", "pa:ss word").expect("valid")
        );
        assert_eq!(
            credentials.auth_command(),
            b"set memcached-operator-auth 0 0 16\r\nalice pa:ss word\r\n"
                .to_vec()
                .into()
        );
    }

    #[test]
    fn a_file_without_newline_and_an_empty_password_are_accepted() {
        let credentials = Credentials::from_auth_file(b"carol:").expect("entry");
        assert_eq!(
            credentials.auth_command(),
            b"set memcached-operator-auth 0 0 6\r\ncarol \r\n"
                .to_vec()
                .into()
        );
    }

    #[test]
    fn unusable_files_are_errors() {
        assert_eq!(
            Credentials::from_auth_file(b""),
            Err(CredentialsError::NoEntry)
        );
        assert_eq!(
            Credentials::from_auth_file(b"\n\r\n\n"),
            Err(CredentialsError::NoEntry)
        );
        assert_eq!(
            Credentials::from_auth_file(b"justauser\n"),
            Err(CredentialsError::NoSeparator)
        );
        assert_eq!(
            Credentials::from_auth_file(b":secret\n"),
            Err(CredentialsError::BadUser)
        );
        assert_eq!(
            Credentials::from_auth_file(b"a b:secret\n"),
            Err(CredentialsError::BadUser)
        );
        assert_eq!(
            Credentials::from_auth_file(b"a\tb:secret\n"),
            Err(CredentialsError::BadUser)
        );
        assert_eq!(
            Credentials::from_auth_file(b"\xff:secret\n"),
            Err(CredentialsError::BadUser)
        );
    }

    #[test]
    fn debug_and_errors_never_show_the_password() {
        let credentials = Credentials::from_auth_file(b"alice:hunter2\n").expect("entry");
        let debug = format!("{credentials:?} {credentials:#?}");
        assert!(
            debug.contains("alice") && !debug.contains("hunter2"),
            "{debug}"
        );
        for contents in [&b"hunter2"[..], b" hunter2:hunter2", b":hunter2"] {
            let error = Credentials::from_auth_file(contents).expect_err("unusable");
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }
}
