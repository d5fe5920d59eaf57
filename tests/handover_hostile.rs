//! The warm-handover copy engine against a hostile server (`common::hostile`): what a tenant's own image
//! may answer a copy. Whatever it answers, one copy holds at most [`COPY_MEMORY_BOUND`] and ends: a value
//! larger than its listed size is read past, not held; a sweep keeps a bounded number of keys; a dump line
//! without an end is refused; a dump that drips ends at the minimum rate.
//!
//! Memory is counted by this binary's allocator: the bytes requested and still held (the hostile server's
//! own few buffers included), the peak reset before each copy. The tests take turns, so that each peak is
//! one copy's. `cargo test --test handover_hostile -- --nocapture` prints each peak.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use memcached_operator::connection::Target;
use memcached_operator::handover::{
    COPY_MEMORY_BOUND, Copier, Failure, MAX_VALUE_BYTES, Settings, Snapshot,
};

use common::hostile::{self, Script};
use common::memcached::{RealServer, real_binary};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The system allocator, counting the bytes held and their peak.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn held(more: usize) {
    let now = HELD.fetch_add(more, Ordering::Relaxed) + more;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is passed on to the system allocator unchanged; only counters are kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        held(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        held(layout.size());
        // SAFETY: the caller's contract for `alloc_zeroed` is passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `dealloc` is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Counted as held at once, old and new: what a moving reallocation holds at its peak.
        held(new_size);
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc` is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One copy at a time in this binary.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The default bounds, with a short time bound: a copy that a hostile server would hold for ever stops.
fn settings() -> Settings {
    Settings {
        timeout: Duration::from_secs(4),
        request_timeout: Duration::from_secs(4),
        ..Settings::default()
    }
}

/// A copy from and to a server playing `script`: how it ended, how long it took and the most bytes the
/// process held at once during it, over what it held before.
async fn measured(
    script: Script,
    settings: Settings,
) -> (Result<Snapshot, Failure>, Duration, usize) {
    let _turn = TURN.lock().await;
    let server = hostile::start(script).await;
    let side = Target::plain(server.address);
    let copier = Copier::new(side.clone(), side, settings);
    let before = HELD.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let started = Instant::now();
    let result = copier.run().await;
    let took = started.elapsed();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    eprintln!(
        "{script:?}: peak {:.2} MiB over the copy's start (bound {} MiB), {took:.1?}, {result:?}",
        peak as f64 / (1 << 20) as f64,
        COPY_MEMORY_BOUND >> 20,
    );
    assert!(
        peak <= COPY_MEMORY_BOUND,
        "{script:?}: the copy held {peak} bytes at once, over its bound of {COPY_MEMORY_BOUND}"
    );
    (result, took, peak)
}

#[tokio::test]
async fn values_larger_than_listed_are_read_past_not_held() {
    // Eight items listed at 100 bytes, each answered with the largest value a copy takes (8 MiB): 64 MiB
    // held at once before values were bounded by their listing.
    let script = Script::Values {
        items: 8,
        listed: 100,
        value: MAX_VALUE_BYTES,
    };
    let (result, _, peak) = measured(script, settings()).await;
    let summary = result.expect("the copy ends");
    assert_eq!((summary.copied, summary.skipped), (0, 8), "{summary:?}");
    assert!(
        peak < 1 << 20,
        "nothing of the values is held: {peak} bytes"
    );
}

#[tokio::test]
async fn values_as_large_as_listed_are_held_one_batch_at_a_time() {
    // Eight items listed at the largest size a copy takes, each answered with a value of that size.
    let script = Script::Values {
        items: 8,
        listed: MAX_VALUE_BYTES + 64,
        value: MAX_VALUE_BYTES,
    };
    let (result, _, peak) = measured(script, settings()).await;
    let summary = result.expect("the copy ends");
    assert_eq!(summary.copied, 8, "{summary:?}");
    assert!(
        peak >= MAX_VALUE_BYTES,
        "a value is held while it is stored: {peak}"
    );
}

#[tokio::test]
async fn a_sweep_whose_dump_never_ends_keeps_a_bounded_number_of_keys() {
    // One-byte keys without end, none held by the target: before the sweep bounded its entries (it bounded
    // only their key bytes, 8 MiB of them), it kept every one until the time bound.
    let (result, took, peak) = measured(Script::EndlessSweep, settings()).await;
    result.expect("the sweep only adds: the first walk's copy stands");
    assert!(
        peak < 6 << 20,
        "a sweep keeps at most 5 MiB of keys: {peak} bytes"
    );
    assert!(
        took < Duration::from_secs(6),
        "ended by its time bound: {took:?}"
    );
}

#[tokio::test]
async fn a_dump_that_never_ends_holds_no_more_than_a_batch() {
    let (result, _, _) = measured(Script::EndlessDump, settings()).await;
    let failure = result.expect_err("an endless dump ends at the time bound");
    assert_eq!(failure.error.reason(), "timeout", "{failure}");
}

#[tokio::test]
async fn a_dump_line_without_end_is_refused_at_its_bound() {
    let (result, _, peak) = measured(Script::LongLine, settings()).await;
    let failure = result.expect_err("a line longer than memcached's is not memcached's");
    assert_eq!(failure.error.reason(), "protocol", "{failure}");
    assert!(peak < 1 << 20, "the line is not held: {peak} bytes");
}

#[tokio::test]
async fn a_source_that_drips_its_dump_gives_its_slot_up_at_the_minimum_rate() {
    // One line (50 bytes) every 100 ms: 500 bytes a second, under a minimum of 1 KiB a second.
    let settings = Settings {
        timeout: Duration::from_secs(10),
        progress_window: Duration::from_secs(1),
        min_bytes_per_window: 1024,
        ..Settings::default()
    };
    let drip = Script::Drip {
        every: Duration::from_millis(100),
    };
    let (result, took, _) = measured(drip, settings).await;
    let failure = result.expect_err("a dripping source is ended");
    assert_eq!(failure.error.reason(), "slow", "{failure}");
    assert!(
        took < Duration::from_secs(4),
        "ended by the minimum rate, not the time bound: {took:?}"
    );
}

/// What memcached itself lists bounds its own values: chunked items (larger than `slab_chunk_max`, 512 KiB
/// by default) and small ones alike are listed at least at their value's size and copied, none skipped.
#[tokio::test]
async fn memcacheds_own_values_are_within_their_listed_sizes() {
    let _turn = TURN.lock().await;
    let Some(binary) = real_binary() else {
        return;
    };
    let args = ["-m", "64", "-I", "8m"];
    let source = RealServer::start(&binary, "listed-src", &[], &args).await;
    let target = RealServer::start(&binary, "listed-dst", &[], &args).await;
    let mut stream = tokio::net::TcpStream::connect(source.address)
        .await
        .unwrap();
    let sizes = [0, 1, 1000, 500 << 10, 600 << 10, 2 << 20, (8 << 20) - 1024];
    for (i, size) in sizes.iter().enumerate() {
        let mut command = format!("ms k{i} {size}\r\n").into_bytes();
        command.extend(std::iter::repeat_n(b'v', *size));
        command.extend_from_slice(b"\r\n");
        stream.write_all(&command).await.unwrap();
        let mut answer = [0; 4];
        stream.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HD\r\n", "size {size}");
    }
    let copier = Copier::new(
        Target::plain(source.address),
        Target::plain(target.address),
        settings(),
    );
    let summary = copier.run().await.expect("the copy ends");
    assert_eq!(
        (summary.copied, summary.skipped),
        (sizes.len() as u64, 0),
        "{summary:?}"
    );
}
