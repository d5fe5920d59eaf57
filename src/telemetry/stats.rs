//! Parsing memcached's `stats` reply (text protocol).
