use super::super::sweep;
use super::super::wire::MAX_KEY_BYTES;
use super::*;
use crate::handover::bounds::COPY_MEMORY_BOUND;

#[test]
fn what_a_copy_holds_adds_up_under_its_bound() {
    let settings = Settings::default();
    let values = settings.batch_bytes as usize + MAX_VALUE_BYTES + LISTED_OVERHEAD;
    let keys = settings.batch_items * (MAX_KEY_BYTES + std::mem::size_of::<WireKey>() + 8);
    // The stores' buffer (a chunk, one small value more, grown by doubling), the fetches' requests,
    // two lines, and three connections' buffers (TLS's included), generously.
    let buffers = 4 * WRITE_CHUNK + keys + 2 * MAX_LINE_BYTES as usize + 3 * 64 * 1024;
    let total = values + keys + sweep::MAX_KEPT_BYTES + buffers;
    assert!(total <= COPY_MEMORY_BOUND - (1 << 20), "{total}");
}

#[test]
fn batches_shrink_at_low_rates_so_the_dump_is_read_every_quarter_second() {
    let at = |rate: u64| {
        batch_bytes(&Settings {
            max_bytes_per_second: rate,
            ..Settings::default()
        })
    };
    assert_eq!(at(64 << 20), 1 << 20);
    assert_eq!(at(1 << 20), 256 << 10);
    assert_eq!(at(64 << 10), 16 << 10);
    assert_eq!(at(1), MIN_BATCH_BYTES);
}
