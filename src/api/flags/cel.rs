//! The CEL rule on `spec.memcached`, generated from the option table so that admission refuses the
//! same spellings as the operator's own walk ([`super::argv::check`]).
//!
//! CEL iterates values, not positions, so the rule cannot replay getopt's walk over pairs of elements.
//! It checks each element on its own, which is sound because getopt only reads an option from an
//! element starting with `-`:
//! - `-xyz`: the letters, read left to right through allowed switches, must end there or reach an
//!   allowed option that takes a value (the rest of the element is that value), exactly as getopt reads
//!   them; a refused or unknown letter on the way is refused.
//! - `--name[=value]`: the name must be an unambiguous abbreviation of an allowed long option (the
//!   exact name always counts), so it cannot resolve to a refused one; switches take no `=value`.
//! - Any element may be the value of `-o`, so a refused sub-option name at its start or after a comma
//!   is refused in every element (and after an attached `-o` or `--extended=`). The cost: an element
//!   that is the value of another option and happens to hold such a name, e.g. `-D ssl_key`, is
//!   refused too.
//!
//! What it cannot see (positional arguments, unknown `-o` sub-options, a missing value at the end) makes
//! memcached exit rather than run with a managed setting changed; the operator reports those.

use super::table::{FLAGS, HasArg, Policy, SUB_OPTIONS};

/// Letters of allowed options that take the given kind of argument.
fn letters(has_arg: HasArg) -> String {
    FLAGS
        .iter()
        .filter(|f| f.policy == Policy::Allowed && f.has_arg == has_arg)
        .filter_map(|f| f.short)
        .collect()
}

/// Regex of every spelling of `--name` that getopt_long resolves to `name`: the exact name, and its
/// prefixes long enough that no other long name starts with them.
fn long_spellings(name: &str) -> String {
    let others: Vec<&str> = FLAGS
        .iter()
        .filter_map(|f| f.long)
        .filter(|l| *l != name)
        .collect();
    let unique_from = (1..=name.len()).find(|&k| !others.iter().any(|o| o.starts_with(&name[..k])));
    let Some(k) = unique_from else {
        return name.to_owned();
    };
    let mut tail = String::new();
    for c in name[k..].chars().rev() {
        tail = format!("({c}{tail})?");
    }
    format!("{}{tail}", &name[..k])
}

fn long_alternatives(arg: impl Fn(HasArg) -> bool) -> String {
    FLAGS
        .iter()
        .filter(|f| f.policy == Policy::Allowed && arg(f.has_arg))
        .filter_map(|f| f.long)
        .map(long_spellings)
        .collect::<Vec<_>>()
        .join("|")
}

/// The rule text, for `x-kubernetes-validations` on `spec.memcached`.
pub fn extra_args_rule() -> String {
    let switches = letters(HasArg::No);
    let valued = letters(HasArg::Required);
    let long_switches = long_alternatives(|a| a == HasArg::No);
    let long_valued = long_alternatives(|a| a != HasArg::No);
    let refused_subs = SUB_OPTIONS
        .iter()
        .filter(|s| s.policy != Policy::Allowed)
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join("|");
    format!(
        "!has(self.extraArgs) || self.extraArgs.all(a, \
         (!a.startsWith('-') || a.startsWith('--') || a.matches('^-([{switches}]+|[{switches}]*[{valued}](?s).*)$')) && \
         (!a.startsWith('--') || a.matches('^--({long_switches})$') || a.matches('^--({long_valued})(=(?s).*)?$')) && \
         !a.matches('(^|,|^--[a-z-]*=|^-[{switches}]*o)({refused_subs})(=|,|$)'))"
    )
}

/// The refused sub-options for the message, the `ssl_*` ones as one.
fn refused_sub_options() -> String {
    let mut names: Vec<&str> = SUB_OPTIONS
        .iter()
        .filter(|s| s.policy != Policy::Allowed)
        .map(|s| {
            if s.name.starts_with("ssl_") {
                "ssl_*"
            } else {
                s.name
            }
        })
        .collect();
    names.dedup();
    names.join(", ")
}

/// The rule's message: which options and sub-options it refuses, from the table.
pub fn extra_args_message() -> String {
    let refused: Vec<String> = FLAGS
        .iter()
        .filter(|f| f.policy != Policy::Allowed)
        .filter_map(|f| f.short.map(|s| format!("-{s}")))
        .collect();
    format!(
        "extraArgs may not set an option the operator manages or that stops memcached serving ({}), in any \
         spelling memcached reads (bundled as -Cp, attached as -p1, long or abbreviated as --por=1), nor an \
         unknown option, nor the -o sub-options {} (also refused when another option's value holds that \
         name); use the matching spec field",
        refused.join(" "),
        refused_sub_options()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_spellings_stop_at_the_shortest_unambiguous_prefix() {
        assert_eq!(long_spellings("protocol"), "pr(o(t(o(c(o(l)?)?)?)?)?)?");
        // `listen` is a prefix of `listen-backlog`: only its exact name is its own.
        assert_eq!(long_spellings("listen"), "listen");
        assert_eq!(
            long_spellings("listen-backlog"),
            "listen-(b(a(c(k(l(o(g)?)?)?)?)?)?)?"
        );
    }

    #[test]
    fn the_rule_names_no_refused_letter_among_the_allowed() {
        let rule = extra_args_rule();
        for letter in [
            'p', 'U', 'l', 's', 'a', 'A', 'Z', 'S', 'Y', 'm', 'c', 't', 'I', 'v', 'd',
        ] {
            assert!(!letters(HasArg::No).contains(letter), "{letter}");
            assert!(!letters(HasArg::Required).contains(letter), "{letter}");
        }
        assert!(rule.contains("ssl_verify_mode"), "{rule}");
    }
}
