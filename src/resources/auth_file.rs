//! The credentials file of `spec.security.auth` (memcached's `-Y`), checked for what memcached reads.
//!
//! memcached's reader (`authfile.c`) is strict and version-dependent, and a file it misreads does not fail
//! loudly: the pods start and are `Available`, and every login is refused. memcached 1.6.18 (Debian 12's)
//! drops the last character of a file without a final newline (memcached/memcached#1170), so a Secret made
//! with `--from-literal=auth-file=app:s3cret` expects the password `s3cre`; a blank line makes memcached
//! refuse the file and exit; more than 8 entries are cut without a word. The operator cannot give memcached
//! another file (the pods mount the Secret as it is), so it checks the file and reports what is wrong
//! (`SecretInvalid`) instead of rolling pods onto it. A file that passes is read the same by every
//! memcached 1.6 release.
//!
//! The messages name lines by number and never quote the file.
//!
//! The servers do not load the user's file as it is: they load [`served`], the user's entries and one of
//! the operator's own ([`OPERATOR_USER`], its password derived from the operator's digest key, the
//! instance's namespace and UID: `crate::resources::secrets::operator_password`), from a Secret the
//! operator keeps (`<name>-auth-file`, [`served_secret`]). The operator authenticates with that entry
//! only, so it never holds or sends the user's passwords; a user's file may have one entry fewer than
//! memcached reads ([`MAX_USER_ENTRIES`]).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use zeroize::Zeroizing;

use super::instance::Instance;
use crate::api::names::served_auth_name;

/// memcached reads at most this many entries.
pub const MAX_ENTRIES: usize = 8;
/// The most entries of the user's file: memcached reads [`MAX_ENTRIES`], and the operator adds one.
pub const MAX_USER_ENTRIES: usize = MAX_ENTRIES - 1;
/// The user name of the operator's own entry.
pub const OPERATOR_USER: &str = "memcached-operator";

/// The file the servers load: the user's file `user_file` (checked, so it ends with a newline) and the
/// operator's entry with `password`.
pub fn served(user_file: &[u8], password: &str) -> Zeroizing<Vec<u8>> {
    let mut file = Zeroizing::new(Vec::with_capacity(
        user_file.len() + OPERATOR_USER.len() + password.len() + 3,
    ));
    file.extend_from_slice(user_file);
    if !file.is_empty() && !file.ends_with(b"\n") {
        file.push(b'\n');
    }
    file.extend_from_slice(OPERATOR_USER.as_bytes());
    file.push(b':');
    file.extend_from_slice(password.as_bytes());
    file.push(b'\n');
    file
}

/// The Secret `<name>-auth-file` holding `file` under `key` (the key of the user's Secret, so the
/// servers' arguments name the same file), owned by the instance.
pub fn served_secret(instance: &Instance<'_>, key: &str, file: &[u8]) -> Secret {
    let mut metadata = instance.child_meta();
    metadata.name = Some(served_auth_name(instance.name));
    Secret {
        metadata,
        data: Some(BTreeMap::from([(
            key.to_owned(),
            ByteString(file.to_vec()),
        )])),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    }
}
/// memcached reads an entry into a buffer of this many bytes, its newline and terminator included.
const MAX_ENTRY_LEN: usize = 256;

/// Checks `content` as memcached's auth file: `user:password` lines, each ending with `\n`.
pub fn check(content: &[u8]) -> Result<(), String> {
    if content.is_empty() {
        return Err("is empty; it needs `user:password` lines".into());
    }
    if content.contains(&0) {
        return Err("contains a NUL byte".into());
    }
    if content.contains(&b'\r') {
        return Err(
            "has CR (Windows, CRLF) line endings; memcached's reader takes lines ending with LF \
             (\\n) only"
                .into(),
        );
    }
    if !content.ends_with(b"\n") {
        return Err(
            "does not end with a newline, and memcached 1.6.18 and older then drop the last character \
             of the last password (every login with it fails); end the file with one, e.g. \
             kubectl create secret generic NAME --from-literal=auth-file=$'user:password\\n'"
                .into(),
        );
    }
    let lines: Vec<&[u8]> = content[..content.len() - 1]
        .split(|&b| b == b'\n')
        .collect();
    if lines.len() > MAX_USER_ENTRIES {
        return Err(format!(
            "has {} lines; memcached reads only the first {MAX_ENTRIES} and the operator adds one of \
             its own: at most {MAX_USER_ENTRIES}",
            lines.len()
        ));
    }
    for (index, line) in lines.iter().enumerate() {
        let number = index + 1;
        if line.is_empty() {
            return Err(format!(
                "line {number} is empty; memcached refuses such a file and does not start"
            ));
        }
        if line.len() + 1 >= MAX_ENTRY_LEN {
            return Err(format!(
                "line {number} is {} characters long; memcached reads at most {} per line",
                line.len(),
                MAX_ENTRY_LEN - 2
            ));
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(format!("line {number} is not `user:password` (no `:`)"));
        };
        if colon == 0 {
            return Err(format!("line {number} has an empty user name"));
        }
        if colon + 1 == line.len() {
            return Err(format!("line {number} has an empty password"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(content: &str) -> String {
        check(content.as_bytes()).expect_err(content)
    }

    #[test]
    fn lines_ending_with_a_newline_are_accepted() {
        assert_eq!(check(b"app:s3cret\n"), Ok(()));
        assert_eq!(
            check(b"app:s3cret\nops:pa:ss\n"),
            Ok(()),
            "a `:` in a password"
        );
        let seven = "u:p\n".repeat(MAX_USER_ENTRIES);
        assert_eq!(check(seven.as_bytes()), Ok(()));
    }

    #[test]
    fn the_served_file_is_the_users_and_the_operators_entry() {
        let file = served(b"app:s3cret\nops:x\n", "0123abcd");
        assert_eq!(
            file.as_slice(),
            b"app:s3cret\nops:x\nmemcached-operator:0123abcd\n"
        );
        assert_eq!(check(&file), Ok(()), "memcached reads it whole");
        let full = served("u:p\n".repeat(MAX_USER_ENTRIES).as_bytes(), "pw");
        assert_eq!(check_lines(&full), MAX_ENTRIES);
    }

    fn check_lines(file: &[u8]) -> usize {
        file.iter().filter(|&&b| b == b'\n').count()
    }

    #[test]
    fn the_samples_old_recipe_without_a_final_newline_is_refused_with_a_recipe_that_works() {
        let message = refused("app:s3cret");
        assert!(message.contains("does not end with a newline"), "{message}");
        assert!(message.contains("$'user:password\\n'"), "{message}");
    }

    #[test]
    fn what_memcached_misreads_is_named_by_line_without_quoting_the_file() {
        for (content, expected) in [
            ("", "is empty"),
            ("app:s3cret\r\n", "CRLF"),
            ("app:s3cret\n\nops:x\n", "line 2 is empty"),
            ("\n", "line 1 is empty"),
            ("app:s3cret\nnocolon\n", "line 2 is not `user:password`"),
            (":s3cret\n", "line 1 has an empty user name"),
            ("app:\n", "line 1 has an empty password"),
            ("a:\0\n", "NUL"),
        ] {
            let message = refused(content);
            assert!(message.contains(expected), "{content:?}: {message}");
            assert!(!message.contains("s3cret"), "{message}");
        }
        let eight = "u:p\n".repeat(MAX_USER_ENTRIES + 1);
        assert!(
            refused(&eight).contains("has 8 lines"),
            "the operator's entry is the 8th"
        );
        let long = format!("u:{}\n", "p".repeat(MAX_ENTRY_LEN));
        assert!(refused(&long).contains("line 1 is 258 characters long"));
        let longest = format!("u:{}\n", "p".repeat(MAX_ENTRY_LEN - 4));
        assert_eq!(check(longest.as_bytes()), Ok(()), "254 characters and LF");
    }
}
