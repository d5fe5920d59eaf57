//! Reading `stats` from one memcached server.
