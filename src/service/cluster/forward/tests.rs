use super::*;

#[test]
fn grpc_timeouts_parse_and_bad_ones_do_not() {
    assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
    assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
    assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
    assert_eq!(
        parse_grpc_timeout("99999999n"),
        Some(Duration::from_nanos(99_999_999))
    );
    for bad in ["", "S", "5", "5s", "123456789S", "-1S", "1.5S", " 5S"] {
        assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
    }
}

#[test]
fn advertise_addresses_are_host_and_port_only() {
    for ok in [
        "a:1",
        "10.0.0.1:50051",
        "[::1]:50051",
        "backup-0.backup.ns.svc:50051",
    ] {
        assert_eq!(check_advertise_address(ok), Ok(()), "{ok}");
    }
    for bad in [
        "",
        "host",
        "host:0",
        "host:70000",
        ":50051",
        "::1:50051",
        "[zz]:1",
        "http://h:1",
        "h:1/x",
        "user@h:1",
        "h :1",
    ] {
        assert!(check_advertise_address(bad).is_err(), "{bad:?}");
    }
}
