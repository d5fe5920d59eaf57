//! Reading Kubernetes resource quantities ("96Mi", "1Gi", "0.5G", "1e9") as numbers, to check that a
//! memory limit leaves room for memcached.

/// The value of a quantity in its base unit (bytes for memory), or `None` if it is not a quantity.
pub fn parse(quantity: &str) -> Option<f64> {
    let q = quantity.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exp if exp.starts_with(['e', 'E']) => 10f64.powi(exp[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * factor)
}

/// Bytes of a memcached size argument (`-I`): a number with an optional k or m suffix.
pub fn memcached_size(size: &str) -> Option<u64> {
    let (number, factor) = match size.chars().last()? {
        'k' | 'K' => (&size[..size.len() - 1], 1024),
        'm' | 'M' => (&size[..size.len() - 1], 1024 * 1024),
        _ => (size, 1),
    };
    number.parse::<u64>().ok()?.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        let mib = 1024.0 * 1024.0;
        assert_eq!(parse("96Mi"), Some(96.0 * mib));
        assert_eq!(parse("1Gi"), Some(1024.0 * mib));
        assert_eq!(parse("0.5Gi"), Some(512.0 * mib));
        assert_eq!(parse("128M"), Some(128e6));
        assert_eq!(parse("1e9"), Some(1e9));
        assert_eq!(parse("100m"), Some(0.1));
        assert_eq!(parse("12345"), Some(12345.0));
        assert_eq!(parse("12Q"), None);
        assert_eq!(parse("Mi"), None);
    }

    #[test]
    fn memcached_sizes() {
        assert_eq!(memcached_size("1m"), Some(1024 * 1024));
        assert_eq!(memcached_size("512k"), Some(512 * 1024));
        assert_eq!(memcached_size("2048"), Some(2048));
        assert_eq!(memcached_size("x"), None);
        assert_eq!(memcached_size(""), None);
    }
}
