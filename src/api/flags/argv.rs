//! The argv walk memcached's `getopt_long` (GNU, permuting) and `getsubopt` make over extraArgs,
//! refusing the first element that would set a refused option, in whatever spelling: bundled letters
//! (`-Cp1`), attached values (`-ossl_verify_mode=0`), unambiguous long-name prefixes (`--por=1`),
//! or a `-o` list (`-o modern,ssl_key=/x`).

use thiserror::Error;

use super::table::{Flag, HasArg, Policy, by_long_prefix, by_short, sub_option};

/// Why an extraArgs element is refused. `index` is its position in extraArgs and `arg` the element as
/// written, so the Degraded message points at what the user typed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FlagError {
    #[error("extraArgs[{index}] {arg:?} sets {option}, which extraArgs may not set: {why}")]
    Refused {
        index: usize,
        arg: String,
        option: String,
        why: &'static str,
    },
    #[error(
        "extraArgs[{index}] {arg:?} sets the -o sub-option {name}, which extraArgs may not set: {why}"
    )]
    RefusedSubOption {
        index: usize,
        arg: String,
        name: String,
        why: &'static str,
    },
    #[error(
        "extraArgs[{index}] {arg:?}: {option} is not a memcached option (memcached would exit)"
    )]
    Unknown {
        index: usize,
        arg: String,
        option: String,
    },
    #[error(
        "extraArgs[{index}] {arg:?}: {name:?} is not a memcached -o sub-option (memcached would exit)"
    )]
    UnknownSubOption {
        index: usize,
        arg: String,
        name: String,
    },
    #[error(
        "extraArgs[{index}] {arg:?}: the -o sub-option {name} needs a value, as {name}=<value> (memcached would exit)"
    )]
    SubOptionValueMissing {
        index: usize,
        arg: String,
        name: String,
    },
    #[error(
        "extraArgs[{index}] {arg:?} is ambiguous: it abbreviates {candidates} (memcached would exit)"
    )]
    Ambiguous {
        index: usize,
        arg: String,
        candidates: String,
    },
    #[error("extraArgs[{index}] {arg:?}: {option} needs a value (memcached would exit)")]
    MissingValue {
        index: usize,
        arg: String,
        option: String,
    },
    #[error("extraArgs[{index}] {arg:?}: {option} takes no value (memcached would exit)")]
    UnexpectedValue {
        index: usize,
        arg: String,
        option: String,
    },
    #[error(
        "extraArgs[{index}] {arg:?} is neither an option nor the value of one; memcached takes no other arguments"
    )]
    Positional { index: usize, arg: String },
    /// A value memcached cannot start with (see [`super::values`]); `why` says what it does and what to
    /// write instead.
    #[error("extraArgs[{index}] {arg:?}: {why}")]
    Value {
        index: usize,
        arg: String,
        why: String,
    },
    /// A field of `spec.memcached` the operator passes as an option (`maxItemSize` as `-I`) that
    /// memcached cannot start with, given extraArgs.
    #[error("{field} {value:?}: {why}")]
    Field {
        field: &'static str,
        value: String,
        why: String,
    },
}

/// One option as memcached's getopt reads it from extraArgs: the option, its value if it takes one, and
/// the element that holds the value (the option's own element for a switch or an attached value), so a
/// check of the value can name what the user typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Given<'a> {
    pub flag: &'static Flag,
    pub value: Option<&'a str>,
    /// Position in extraArgs of the element holding the value (or the option).
    pub index: usize,
    /// That element, as written.
    pub arg: &'a str,
}

/// Walks `args` as memcached would and returns the first refused element.
pub fn check(args: &[String]) -> Result<(), FlagError> {
    parse(args).map(|_| ())
}

/// Walks `args` as memcached would: the options it reads, in its order, or the first refused element.
pub fn parse(args: &[String]) -> Result<Vec<Given<'_>>, FlagError> {
    let mut given = Vec::new();
    let mut index = 0;
    while index < args.len() {
        let arg = args[index].as_str();
        index = if let Some(long) = arg.strip_prefix("--") {
            long_option(args, index, long, &mut given)?
        } else if let Some(letters) = arg.strip_prefix('-').filter(|l| !l.is_empty()) {
            short_options(args, index, letters, &mut given)?
        } else {
            return Err(FlagError::Positional {
                index,
                arg: arg.to_owned(),
            });
        };
        index += 1;
    }
    Ok(given)
}

/// The long option `args[index]` (`--name`, `--name=value`, or `--name` and the next element as its
/// value), read into `given`; the index of the last element it took.
fn long_option<'a>(
    args: &'a [String],
    mut index: usize,
    long: &'a str,
    given: &mut Vec<Given<'a>>,
) -> Result<usize, FlagError> {
    let arg = args[index].as_str();
    let err_arg = || arg.to_owned();
    if long.is_empty() {
        // `--` ends the options: whatever follows is positional, and `--` alone does nothing.
        return Err(FlagError::Positional {
            index,
            arg: err_arg(),
        });
    }
    let (name, attached) = match long.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (long, None),
    };
    let flag = long_flag(name, index, arg)?;
    refuse(flag, index, arg)?;
    let value = match (flag.has_arg, attached) {
        (HasArg::No, Some(_)) => {
            return Err(FlagError::UnexpectedValue {
                index,
                arg: err_arg(),
                option: flag.display(),
            });
        }
        (HasArg::Required, None) => {
            index += 1;
            Some(value_at(args, index, flag, arg)?)
        }
        (_, value) => value,
    };
    sub_options(flag, value, index, &args[index])?;
    given.push(Given {
        flag,
        value,
        index,
        arg: &args[index],
    });
    Ok(index)
}

/// The option `name` abbreviates (getopt_long takes any prefix of one option's name).
fn long_flag(name: &str, index: usize, arg: &str) -> Result<&'static Flag, FlagError> {
    match by_long_prefix(name).as_slice() {
        [flag] => Ok(*flag),
        [] => Err(FlagError::Unknown {
            index,
            arg: arg.to_owned(),
            option: format!("--{name}"),
        }),
        several => Err(FlagError::Ambiguous {
            index,
            arg: arg.to_owned(),
            candidates: several
                .iter()
                .map(|f| f.display())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The short options bundled in `args[index]` (`-vv`, `-m64`, or `-m` and the next element as its value),
/// read into `given`; the index of the last element they took.
fn short_options<'a>(
    args: &'a [String],
    mut index: usize,
    letters: &'a str,
    given: &mut Vec<Given<'a>>,
) -> Result<usize, FlagError> {
    let arg = args[index].as_str();
    for (at, letter) in letters.char_indices() {
        let flag = by_short(letter).ok_or_else(|| FlagError::Unknown {
            index,
            arg: arg.to_owned(),
            option: format!("-{letter}"),
        })?;
        refuse(flag, index, arg)?;
        if flag.has_arg == HasArg::Required {
            let rest = &letters[at + letter.len_utf8()..];
            let value = if rest.is_empty() {
                index += 1;
                value_at(args, index, flag, arg)?
            } else {
                rest
            };
            sub_options(flag, Some(value), index, &args[index])?;
            given.push(Given {
                flag,
                value: Some(value),
                index,
                arg: &args[index],
            });
            break;
        }
        given.push(Given {
            flag,
            value: None,
            index,
            arg: &args[index],
        });
    }
    Ok(index)
}

fn refuse(flag: &Flag, index: usize, arg: &str) -> Result<(), FlagError> {
    match flag.policy {
        Policy::Allowed => Ok(()),
        Policy::Refused(why) => Err(FlagError::Refused {
            index,
            arg: arg.to_owned(),
            option: flag.display(),
            why,
        }),
    }
}

fn value_at<'a>(
    args: &'a [String],
    index: usize,
    flag: &Flag,
    arg: &str,
) -> Result<&'a str, FlagError> {
    args.get(index)
        .map(String::as_str)
        .ok_or_else(|| FlagError::MissingValue {
            index: index - 1,
            arg: arg.to_owned(),
            option: flag.display(),
        })
}

/// memcached's `-o` value: a comma list of `name[=value]`, each name matched exactly (`getsubopt`).
/// `index`/`arg` are where the value was written (the `-o` element itself, or the one after it).
fn sub_options(flag: &Flag, value: Option<&str>, index: usize, arg: &str) -> Result<(), FlagError> {
    let (Some('o'), Some(value)) = (flag.short, value) else {
        return Ok(());
    };
    for item in value.split(',') {
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (item, None),
        };
        match sub_option(name).map(|s| (s.policy, s.needs_value)) {
            Some((Policy::Allowed, true)) if value.is_none_or(str::is_empty) => {
                return Err(FlagError::SubOptionValueMissing {
                    index,
                    arg: arg.to_owned(),
                    name: name.to_owned(),
                });
            }
            Some((Policy::Allowed, _)) => {}
            Some((Policy::Refused(why), _)) => {
                return Err(FlagError::RefusedSubOption {
                    index,
                    arg: arg.to_owned(),
                    name: name.to_owned(),
                    why,
                });
            }
            None => {
                return Err(FlagError::UnknownSubOption {
                    index,
                    arg: arg.to_owned(),
                    name: name.to_owned(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
