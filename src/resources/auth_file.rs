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

/// memcached reads at most this many entries.
pub const MAX_ENTRIES: usize = 8;
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
    if lines.len() > MAX_ENTRIES {
        return Err(format!(
            "has {} lines; memcached reads only the first {MAX_ENTRIES} and ignores the rest",
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
        let eight = "u:p\n".repeat(MAX_ENTRIES);
        assert_eq!(check(eight.as_bytes()), Ok(()));
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
        let nine = "u:p\n".repeat(MAX_ENTRIES + 1);
        assert!(refused(&nine).contains("has 9 lines"));
        let long = format!("u:{}\n", "p".repeat(MAX_ENTRY_LEN));
        assert!(refused(&long).contains("line 1 is 258 characters long"));
        let longest = format!("u:{}\n", "p".repeat(MAX_ENTRY_LEN - 4));
        assert_eq!(check(longest.as_bytes()), Ok(()), "254 characters and LF");
    }
}
