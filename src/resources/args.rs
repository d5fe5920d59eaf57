//! The memcached command line.

use crate::api::MemcachedSpec;

/// Memory for items in MiB (`-m`): the tutorials' value.
pub const MAX_MEMORY_MB: i32 = 64;
/// Headroom above the item memory for connections, hash table and threads, used to size the container.
pub const MEMORY_OVERHEAD_MB: i32 = 32;

/// The program the container runs. Set explicitly so the image's entrypoint script is not relied on.
pub fn command() -> Vec<String> {
    vec!["memcached".to_owned()]
}

/// Arguments for memcached: `-p <port> -m 64 -o modern`, the tutorials' flags.
pub fn args(spec: &MemcachedSpec) -> Vec<String> {
    [
        "-p".to_owned(),
        spec.container_port.to_string(),
        "-m".to_owned(),
        MAX_MEMORY_MB.to_string(),
        "-o".to_owned(),
        "modern".to_owned(),
    ]
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_tutorial_flags_with_the_spec_port() {
        let spec = MemcachedSpec {
            container_port: 11311,
            ..MemcachedSpec::default()
        };
        assert_eq!(args(&spec).join(" "), "-p 11311 -m 64 -o modern");
        assert_eq!(command(), ["memcached"]);
    }
}
