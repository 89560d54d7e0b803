//! Facts about network addresses that need no network.

/// Whether `host` (a name or an IP address, an IPv6 one possibly in brackets, no port) is this
/// machine: `localhost` or a loopback address. Names are compared as given; a caller that
/// takes any case lowers them first.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::is_loopback_host;

    #[test]
    fn localhost_and_loopback_addresses_are_this_machine() {
        for host in ["localhost", "127.0.0.1", "127.3.2.1", "::1", "[::1]"] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "LOCALHOST",
            "localhost.example.com",
            "10.0.0.5",
            "[2001:db8::1]",
            "",
            "db",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
