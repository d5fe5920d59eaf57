use super::*;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn refused(list: &[&str]) -> FlagError {
    check(&args(list)).expect_err(&format!("{list:?} must be refused"))
}

/// Every smuggled spelling measured on a real server (and its relatives) is refused, naming the option.
#[test]
fn smuggled_spellings_of_managed_options_are_refused_naming_the_option() {
    for (list, option) in [
        (&["-Cp", "1"][..], "-p/--port"),
        (&["-CU", "11211"], "-U/--udp-port"),
        (&["-Cl", "0.0.0.0"], "-l/--listen"),
        (&["--por=1"], "-p/--port"),
        (&["--po", "1"], "-p/--port"),
        (&["--udp=11211"], "-U/--udp-port"),
        (&["--enable-ss"], "-Z/--enable-ssl"),
        (&["-S"], "-S/--enable-sasl"),
        (&["-s/tmp/x"], "-s/--unix-socket"),
        (&["-A"], "-A/--enable-shutdown"),
        (&["-MA"], "-A/--enable-shutdown"),
        (&["-p11299"], "-p/--port"),
        (&["-vv"], "-v/--verbose"),
        (&["--verbose=2"], "-v/--verbose"),
        (&["--verb"], "-v/--verbose"),
        (&["-a", "777"], "-a/--unix-mask"),
        (&["-m2048"], "-m/--memory-limit"),
        (&["--memory-l=2048"], "-m/--memory-limit"),
        (&["-t", "8"], "-t/--threads"),
        (&["--conn=1"], "-c/--conn-limit"),
        (&["-I2m"], "-I/--max-item-size"),
        (&["-Z"], "-Z/--enable-ssl"),
        (&["-Y/x"], "-Y/--auth-file"),
        (&["-d"], "-d/--daemon"),
        (&["-u", "root"], "-u/--user"),
        (&["-P/tmp/pid"], "-P/--pidfile"),
        (&["-V"], "-V/--version"),
        (&["--help"], "-h/--help"),
        (&["-e", "/dev/shm/x"], "-e/--memory-file"),
        (&["-R", "40", "-kCp", "1"], "-p/--port"),
        (&["-CL"], "-L/--enable-largepages"),
        (&["-r"], "-r/--enable-coredumps"),
    ] {
        match refused(list) {
            FlagError::Refused { option: o, .. } => assert_eq!(o, option, "{list:?}"),
            other => panic!("{list:?}: {other:?}"),
        }
    }
}

#[test]
fn managed_sub_options_are_refused_in_every_o_spelling() {
    for list in [
        &["-ossl_verify_mode=0"][..],
        &["-Cossl_verify_mode=0"],
        &["-o", "ssl_verify_mode=0"],
        &["-o", "modern,ssl_key=/x"],
        &["--extended=lru_crawler,ssl_ca_cert=/x"],
        &["--ext", "ssl_chain_cert=/x"],
        &["-o", "ext_path=/data/cache:1G"],
    ] {
        match refused(list) {
            FlagError::RefusedSubOption { name, .. } => {
                assert!(
                    name.starts_with("ssl_") || name == "ext_path",
                    "{list:?}: {name}"
                )
            }
            other => panic!("{list:?}: {other:?}"),
        }
    }
}

#[test]
fn the_error_points_at_the_element_as_written() {
    let err = refused(&["-o", "lru_crawler", "-Cp", "1"]);
    assert_eq!(
        err.to_string(),
        "extraArgs[2] \"-Cp\" sets -p/--port, which extraArgs may not set: the operator sets it from \
         spec.containerPort"
    );
    let err = refused(&["-o", "modern,ssl_verify_mode=0"]);
    assert!(
        err.to_string().starts_with(
            "extraArgs[1] \"modern,ssl_verify_mode=0\" sets the -o sub-option ssl_verify_mode"
        ),
        "{err}"
    );
}

#[test]
fn unknown_options_and_sub_options_are_refused() {
    assert!(matches!(refused(&["-q"]), FlagError::Unknown { option, .. } if option == "-q"));
    assert!(matches!(refused(&["-Cq"]), FlagError::Unknown { option, .. } if option == "-q"));
    assert!(matches!(
        refused(&["--frobnicate"]),
        FlagError::Unknown { .. }
    ));
    assert!(matches!(
        refused(&["--napi_ids=1"]),
        FlagError::Unknown { .. }
    ));
    assert!(
        matches!(refused(&["-o", "turbo"]), FlagError::UnknownSubOption { name, .. } if name == "turbo")
    );
    assert!(matches!(
        refused(&["-o", "modern,,lru_crawler"]),
        FlagError::UnknownSubOption { .. }
    ));
}

#[test]
fn ambiguous_prefixes_missing_and_unexpected_values_are_refused() {
    assert!(matches!(
        refused(&["--disable-"]),
        FlagError::Ambiguous { .. }
    ));
    assert!(matches!(refused(&["--lis"]), FlagError::Ambiguous { .. }));
    assert!(matches!(refused(&["-R"]), FlagError::MissingValue { .. }));
    assert!(matches!(
        refused(&["--protocol"]),
        FlagError::MissingValue { .. }
    ));
    assert!(matches!(
        refused(&["--disable-cas=1"]),
        FlagError::UnexpectedValue { .. }
    ));
}

#[test]
fn a_sub_option_that_needs_a_value_is_refused_without_one() {
    for args in [
        &["-o", "hashpower"][..],
        &["-o", "hashpower="],
        &["-o", "modern,idle_timeout"],
        &["-oslab_sizes"],
        &["--extended=sock_cookie_id"],
    ] {
        assert!(
            matches!(refused(args), FlagError::SubOptionValueMissing { .. }),
            "{args:?}"
        );
    }
    let error = refused(&["-o", "modern,hashpower"]);
    assert_eq!(
        error.to_string(),
        "extraArgs[1] \"modern,hashpower\": the -o sub-option hashpower needs a value, as \
         hashpower=<value> (memcached would exit)"
    );
    for args in [
        &["-o", "hashpower=20"][..],
        &["-o", "modern,idle_timeout=600,slab_automove"],
        &["-o", "slab_automove=1"],
    ] {
        assert_eq!(check(&self::args(args)), Ok(()), "{args:?}");
    }
}

#[test]
fn positional_arguments_and_end_of_options_are_refused() {
    assert!(matches!(
        refused(&["lru_crawler"]),
        FlagError::Positional { index: 0, .. }
    ));
    assert!(matches!(
        refused(&["-R", "40", "40"]),
        FlagError::Positional { index: 2, .. }
    ));
    assert!(matches!(refused(&["-"]), FlagError::Positional { .. }));
    assert!(matches!(
        refused(&["--", "-p", "1"]),
        FlagError::Positional { index: 0, .. }
    ));
}

#[test]
fn ordinary_tuning_is_accepted() {
    for list in [
        &["-o", "lru_crawler"][..],
        &["-o", "modern"],
        &["-o", "lru_crawler,hash_algorithm=xxh3,idle_timeout=600"],
        &["-olru_crawler"],
        &["-R", "40"],
        &["-R40"],
        &["--max-reqs-per-event=40"],
        &["--max-reqs", "40"],
        &["-B", "ascii"],
        &["--protocol=binary"],
        &["-C", "-F", "-X", "-W", "-M"],
        &["-CFXWM"],
        &["-CFo", "lru_crawler"],
        &["--listen-backlog=2048"],
        &["--listen-", "2048"],
        &["-D", ":"],
        &["-D-"],
        &["-f", "1.05", "-n", "72"],
        &["-o", "ext_item_size=512"],
        &["-p", "1"][..0],
    ] {
        assert_eq!(check(&args(list)), Ok(()), "{list:?}");
    }
}

#[test]
fn a_value_that_looks_like_a_flag_is_a_value() {
    // getopt gives a required argument the next element whatever it looks like.
    assert_eq!(check(&args(&["-D", "-p"])), Ok(()));
}

/// `parse` hands each option's value with the element that holds it, for the checks of values.
#[test]
fn parse_names_the_element_holding_each_value() {
    let list = args(&["-CB", "binary", "--max-reqs=0", "-o", "modern", "-D:"]);
    let given: Vec<(char, Option<&str>, usize, &str)> = parse(&list)
        .unwrap()
        .iter()
        .map(|g| (g.flag.short.unwrap(), g.value, g.index, g.arg))
        .collect();
    assert_eq!(
        given,
        [
            ('C', None, 0, "-CB"),
            ('B', Some("binary"), 1, "binary"),
            ('R', Some("0"), 2, "--max-reqs=0"),
            ('o', Some("modern"), 4, "modern"),
            ('D', Some(":"), 5, "-D:"),
        ]
    );
}
